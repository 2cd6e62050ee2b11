"""``gpu/pack``: build the carry for the lent GPU machine under an ignored folder.

Downloads the pinned wheels (``gpu/carry.txt``) for CPython 3.12 / manylinux x86-64 into
a download cache, checks every wheel's Requires-Dist against carry + image, unpacks them
into one site directory with sglang pruned, packs it as ``site.tar.xz``, optionally the
sglang-kernel 0.4.5 subset as ``sgl_kernel.tar.xz``, writes ``manifest.json`` and prints
the sizes against the device tool's 64 MiB (carry + tracked + untracked-not-ignored).

    gpu/pack --plan          # what it would fetch and check; no network (CI uses this)
    gpu/pack                 # download, build .gpu-carry/, print the size table

The plugin itself is not packed: its source travels with the tracked tree and
``gpu/run`` builds it there (g++ and pybind11 are on the image).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from gpu_kit.pins import (
    IMAGE_PACKAGES,
    REPO,
    SGL_KERNEL_PIN,
    Pin,
    download_command,
    load_image,
    load_pins,
    wheel_key,
)
from gpu_kit.wheels import (
    SGLANG_PRUNE,
    check_requirements,
    problems,
    read_wheel,
    sgl_kernel_members,
    unpack,
    unpack_members,
)

LIMIT_MIB = 64.0
MIB = 1024 * 1024
CARRY_DIR = REPO / ".gpu-carry"
CACHE_DIR = REPO / ".gpu-cache"


def plan(pins: list[Pin], with_sgl_kernel: bool, cache: Path) -> dict[str, Any]:
    """What pack would fetch (and what is already in the cache), without any network."""
    specs = [p.spec() for p in pins]
    if with_sgl_kernel:
        specs.append(f"{SGL_KERNEL_PIN[0]}=={SGL_KERNEL_PIN[1]}")
    cached = {wheel_key(p.name): p.name for p in cache.glob("*.whl")} if cache.is_dir() else {}
    rows = []
    for spec in specs:
        name, _, version = spec.partition("==")
        key = (Pin(name, version).key, version)
        rows.append({"spec": spec, "cached": cached.get(key)})
    return {
        "wheels": rows,
        "to_download": [r["spec"] for r in rows if not r["cached"]],
        "command": download_command([r["spec"] for r in rows if not r["cached"]], cache),
        "sgl_kernel": with_sgl_kernel,
        "sglang_prune": list(SGLANG_PRUNE),
    }


def download(specs: list[str], cache: Path) -> None:
    """``pip download`` the wheels not cached yet (one pip call)."""
    if not specs:
        return
    cache.mkdir(parents=True, exist_ok=True)
    cmd = download_command(specs, cache)
    print(f"[pack] pip download {len(specs)} wheel(s) into {cache}", flush=True)
    subprocess.run(cmd, check=True)


def find_wheels(pins: list[Pin], cache: Path) -> dict[str, Path]:
    """The cached wheel of each pin (``FileNotFoundError`` naming the missing ones)."""
    by_key: dict[tuple[str, str], Path] = {}
    for path in cache.glob("*.whl"):
        by_key[wheel_key(path.name)] = path
    found, missing = {}, []
    for pin in pins:
        path = by_key.get((pin.key, pin.version or ""))
        if path is None:
            missing.append(pin.spec())
        else:
            found[pin.key] = path
    if missing:
        raise FileNotFoundError(f"no wheel in {cache} for: {', '.join(missing)}")
    return found


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tar_xz(src_parent: Path, name: str, out: Path, level: int) -> None:
    """``tar -C src_parent -cJf out name`` with multi-threaded xz where xz is installed."""
    out.unlink(missing_ok=True)
    if shutil.which("xz"):
        with open(out, "wb") as f:
            tar = subprocess.Popen(
                ["tar", "-C", str(src_parent), "--owner=0", "--group=0", "-cf", "-", name],
                stdout=subprocess.PIPE,
            )
            xz = subprocess.run(["xz", "-T0", f"-{level}", "-c"], stdin=tar.stdout, stdout=f)
            tar.stdout.close()  # type: ignore[union-attr]
            if tar.wait() or xz.returncode:
                raise RuntimeError(f"tar | xz failed for {name}")
        return
    import tarfile

    with tarfile.open(out, "w:xz", preset=level) as tf:
        tf.add(src_parent / name, arcname=name)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def git_bytes(repo: Path, *args: str) -> int:
    """Working-tree bytes of the files ``git ls-files ARGS`` lists."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", *args], capture_output=True, check=True
    ).stdout
    total = 0
    for rel in filter(None, out.decode().split("\0")):
        p = repo / rel
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def size_table(carry: Path, repo: Path = REPO) -> tuple[list[tuple[str, float]], float]:
    """Rows (what, MiB) and the total that would travel with ``carry`` carried."""
    rows = [
        (f"{carry.name}/{p.name}", p.stat().st_size / MIB)
        for p in sorted(carry.iterdir())
        if p.is_file()
    ]
    rows.append(("tracked tree (git ls-files)", git_bytes(repo) / MIB))
    rows.append(("untracked, not ignored", git_bytes(repo, "--others", "--exclude-standard") / MIB))
    return rows, sum(mib for _, mib in rows)


def print_table(rows: list[tuple[str, float]], total: float) -> None:
    width = max(len(r[0]) for r in rows) + 2
    for what, mib in rows:
        print(f"  {what:<{width}} {mib:8.2f} MiB")
    verdict = "fits" if total < LIMIT_MIB else "DOES NOT FIT"
    print(f"  {'total that travels':<{width}} {total:8.2f} MiB  ({verdict} in {LIMIT_MIB:.0f} MiB)")


def build(
    pins: list[Pin], wheels: dict[str, Path], out: Path, sgl_kernel: Path | None, level: int
) -> dict[str, Any]:
    """Unpack, prune, check and compress into ``out``; returns the manifest."""
    work = out.parent / (out.name + ".build")
    shutil.rmtree(work, ignore_errors=True)
    site = work / "site"
    site.mkdir(parents=True)
    image = load_image(IMAGE_PACKAGES)
    infos = [read_wheel(wheels[p.key]) for p in pins]
    report = check_requirements(infos, image)
    manifest: dict[str, Any] = {
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "target": "CPython 3.12 manylinux x86_64 (the lent GPU machines' /opt/torch/.venv)",
        "wheels": [],
        "requires_dist": report,
        "requires_dist_problems": problems(report),
        "pruned": {},
    }
    for pin in pins:
        prune = SGLANG_PRUNE if pin.key == "sglang" else ()
        nbytes, pruned = unpack(wheels[pin.key], site, prune)
        manifest["wheels"].append(
            {"wheel": wheels[pin.key].name, "sha256": sha256(wheels[pin.key]),
             "wheel_mib": round(wheels[pin.key].stat().st_size / MIB, 2),
             "unpacked_mib": round(nbytes / MIB, 2)}
        )  # fmt: skip
        if pruned:
            manifest["pruned"][pin.spec()] = {
                "members": len(pruned),
                "examples": sorted({"/".join(n.split("/")[:3]) for n in pruned})[:12],
            }
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("site.tar.xz", "sgl_kernel.tar.xz"):
        (out / stale).unlink(missing_ok=True)
    print(f"[pack] site: {dir_bytes(site) / MIB:.1f} MiB unpacked; compressing", flush=True)
    tar_xz(work, "site", out / "site.tar.xz", level)
    manifest["archives"] = {"site.tar.xz": "the host (pruned) and its missing dependencies"}
    if sgl_kernel is not None:
        name, version = SGL_KERNEL_PIN
        path = sgl_kernel
        kdir = work / "sgl_kernel_site"
        with zipfile.ZipFile(path) as zf:
            members = sgl_kernel_members(zf.namelist())
        nbytes = unpack_members(path, kdir, members)
        print(f"[pack] sgl_kernel subset: {nbytes / MIB:.1f} MiB unpacked; compressing")
        tar_xz(work, "sgl_kernel_site", out / "sgl_kernel.tar.xz", level)
        manifest["archives"]["sgl_kernel.tar.xz"] = (
            f"{name} {version}: Python files + sm90/common_ops (Hopper only)"
        )
        manifest["sgl_kernel"] = {"wheel": path.name, "sha256": sha256(path),
                                  "members": len(members), "unpacked_mib": round(nbytes / MIB, 2)}  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu/pack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="store_true", help="list what would be fetched; no network")
    ap.add_argument("--out", type=Path, default=CARRY_DIR, help="the carry folder (%(default)s)")
    ap.add_argument("--cache", type=Path, default=CACHE_DIR, help="downloaded wheels (%(default)s)")
    ap.add_argument(
        "--no-sgl-kernel",
        dest="sgl_kernel",
        action="store_false",
        help="leave out the sglang-kernel 0.4.5 sm90 library (gpu/run then uses the fallback)",
    )
    ap.add_argument("--xz-level", type=int, default=9, choices=range(0, 10), metavar="0-9")
    ap.add_argument("--sizes", action="store_true", help="print the size table of --out only")
    ap.add_argument(
        "--verify",
        action="store_true",
        help="check the built --out without the lent machine (gpu_kit/verify.py)",
    )
    ap.add_argument(
        "--compare-with",
        type=Path,
        help="with --verify: a reference sglang package folder to diff the .py files against",
    )
    args = ap.parse_args(argv)
    if args.verify:
        from gpu_kit.verify import main as verify_main

        return verify_main(args.out, args.compare_with)
    pins = load_pins()
    if args.sizes:
        print_table(*size_table(args.out))
        return 0
    p = plan(pins, args.sgl_kernel, args.cache)
    if args.plan:
        print(json.dumps(p, indent=1))
        return 0
    download(p["to_download"], args.cache)
    wheels = find_wheels(pins, args.cache)
    kernel = None
    if args.sgl_kernel:
        kpin = Pin(*SGL_KERNEL_PIN)
        kernel = find_wheels([kpin], args.cache)[kpin.key]
    manifest = build(pins, wheels, args.out, kernel, args.xz_level)
    bad = manifest["requires_dist_problems"]
    print(f"[pack] Requires-Dist: {len(bad)} problem(s)" + "".join(f"\n  {b}" for b in bad))
    rows, total = size_table(args.out)
    print(f"[pack] carry folder {args.out} (name it in the device tool's carry):")
    print_table(rows, total)
    return 0 if total < LIMIT_MIB and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
