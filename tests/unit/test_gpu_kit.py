"""The GPU carry kit (gpu/): pack's planning and checks with no download, the shims and
the image emulation of the import check (gpu/run's tests: test_gpu_kit_run.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "gpu"
sys.path.insert(0, str(GPU))

from gpu_kit import pack, pins, wheels  # noqa: E402


# -- pins and plan --------------------------------------------------------------------
def test_pins_parse_and_reject() -> None:
    got = pins.parse_pins("# c\nFoo_Bar==1.2  # why\n\nbaz==0.1.post7\n")
    assert [(p.key, p.version) for p in got] == [("foo-bar", "1.2"), ("baz", "0.1.post7")]
    with pytest.raises(ValueError, match="twice"):
        pins.parse_pins("a==1\nA==2\n")
    with pytest.raises(ValueError, match="NAME==VERSION"):
        pins.parse_pins("a>=1\n")


def test_carry_pins_are_versioned_and_not_on_the_image_unless_overridden() -> None:
    carried = {p.key: p.version for p in pins.load_pins()}
    assert carried["sglang"] == "0.5.23"
    image = pins.load_image()
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"
    # carried although the image has it: only to get another version, and said so
    overlap = set(carried) & set(image)
    assert overlap == {"typing-extensions"}
    assert "4.16" in (GPU / "carry.txt").read_text().split("typing-extensions==")[1][:6]


def test_plan_lists_every_wheel_without_network(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl").write_bytes(b"")
    plan = pack.plan(pins.load_pins(), True, cache)
    specs = [r["spec"] for r in plan["wheels"]]
    assert specs[0] == "sglang==0.5.23" and specs[-1] == "sglang-kernel==0.4.5"
    assert "sglang==0.5.23" not in plan["to_download"]  # cached
    assert len(plan["to_download"]) == len(specs) - 1
    cmd = plan["command"]
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version", "3.12"):
        assert flag in cmd
    assert "manylinux_2_34_x86_64" in cmd and "manylinux2014_x86_64" in cmd
    assert cmd[-len(plan["to_download"]) :] == plan["to_download"]


def test_pack_plan_cli_prints_json() -> None:
    out = subprocess.run([sys.executable, str(GPU / "pack"), "--plan", "--no-sgl-kernel"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    plan = json.loads(out)
    assert plan["sgl_kernel"] is False
    assert not any(r["spec"].startswith("sglang-kernel") for r in plan["wheels"])


# -- wheels ---------------------------------------------------------------------------
def _wheel(
    path: Path, name: str, version: str, requires: list[str], files: dict[str, bytes]
) -> Path:
    whl = path / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        for rel, data in files.items():
            zf.writestr(rel, data)
    return whl


def test_requires_dist_check(tmp_path: Path) -> None:
    a = _wheel(tmp_path, "alpha", "1.0", [
        "beta>=2", "torch==2.14.1", "numpy", "gamma", "flashinfer-python", "delta>=9",
        "winonly; sys_platform == 'win32'", "extra-thing; extra == 'dev'",
        "old; python_version < '3.11'"], {})  # fmt: skip
    b = _wheel(tmp_path, "beta", "2.5", [], {})
    infos = [wheels.read_wheel(a), wheels.read_wheel(b)]
    assert [str(r) for r in infos[0].requires][-1] == "delta>=9"  # markers filtered
    report = wheels.check_requirements(infos, {"numpy": None, "torch": "2.11.0", "delta": "1"})
    status = {r["requirement"]: r["status"] for r in report["alpha==1.0"]}
    assert status == {"beta>=2": "carried", "torch==2.14.1": "not-carried",
                      "numpy": "image-version-unknown", "gamma": "MISSING",
                      "flashinfer-python": "not-carried", "delta>=9": "version-mismatch"}  # fmt: skip
    bad = wheels.problems(report)
    assert len(bad) == 2 and any("gamma" in p for p in bad) and any("delta" in p for p in bad)


def test_unpack_prunes_and_lays_out_data_dirs(tmp_path: Path) -> None:
    whl = _wheel(tmp_path, "sglang", "0.5.23", [], {
        "sglang/srt/x.py": b"x = 1\n",
        "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so": b"elf",
        "sglang/srt/rust_extensions/loader.py": b"",
        "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so": b"elf",
        "sglang/multimodal_gen/big.py": b"#",
        "sglang/srt/__pycache__/x.cpython-312.pyc": b"",
        "sglang-0.5.23.data/purelib/extra_mod.py": b"",
        "sglang-0.5.23.data/scripts/tool": b"",
    })  # fmt: skip
    site = tmp_path / "site"
    _, pruned = wheels.unpack(whl, site, wheels.SGLANG_PRUNE)
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert "sglang/srt/x.py" in files and "extra_mod.py" in files
    assert "sglang/srt/rust_extensions/loader.py" in files
    assert any("rust_tree_core" in f for f in files)
    assert not any("_server" in f or "multimodal_gen" in f or f.endswith(".pyc") for f in files)
    assert not any("scripts" in f for f in files)
    assert len(pruned) == 2


def test_sgl_kernel_subset() -> None:
    names = ["sgl_kernel/__init__.py", "sgl_kernel/flash_ops.abi3.so",
             "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
             "sgl_kernel/spatial_ops.abi3.so", "sgl_kernel/infllm_v2/_loader.py",
             "sglang_kernel-0.4.5.dist-info/METADATA", "triton_kernels/x.py"]  # fmt: skip
    assert wheels.sgl_kernel_members(names) == [
        "sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so",
        "sgl_kernel/spatial_ops.abi3.so", "sgl_kernel/infllm_v2/_loader.py",
        "sglang_kernel-0.4.5.dist-info/METADATA"]  # fmt: skip


def test_size_table_counts_carry_and_tracked_tree(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "site.tar.xz").write_bytes(b"\0" * 2**20)
    rows, total = pack.size_table(carry)
    assert rows[0] == ("carry/site.tar.xz", 1.0)
    assert any(r[0].startswith("tracked tree") and r[1] > 1 for r in rows)
    assert total == pytest.approx(sum(r[1] for r in rows)) and total < pack.LIMIT_MIB


# -- shims ----------------------------------------------------------------------------
def _run(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": ":".join(str(p) for p in paths), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_ipython_stub_serves_sglang_utils_import() -> None:
    p = _run("import IPython, sys\nfrom IPython.display import HTML, display\n"
             "display(HTML('x'))\nassert IPython.GPU_KIT_STUB\nprint('ok')",
             GPU / "shims" / "common")  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr


def test_sgl_kernel_fallback_computes_the_few_ops_and_refuses_the_rest() -> None:
    code = """
import torch, sgl_kernel
from sgl_kernel import rmsnorm, fused_add_rmsnorm, weak_ref_tensor, FallbackCalled
from sgl_kernel.elementwise import silu_and_mul
from sgl_kernel.utils import is_arch_support_pdl
from sgl_kernel.speculative import build_tree_kernel_efficient
from sgl_kernel.deep.nested import thing
x, w, r = torch.randn(3, 8), torch.rand(8), torch.randn(3, 8)
ref = torch.nn.functional.rms_norm(x, (8,), w, 1e-6)
assert torch.allclose(rmsnorm(x, w, 1e-6), ref, atol=1e-5)
x2, r2 = x.clone(), r.clone()
fused_add_rmsnorm(x2, r2, w, 1e-6)
assert torch.allclose(r2, x + r) and torch.allclose(x2, torch.nn.functional.rms_norm(x + r, (8,), w, 1e-6), atol=1e-5)
g = torch.randn(2, 6)
assert torch.allclose(silu_and_mul(g), torch.nn.functional.silu(g[:, :3]) * g[:, 3:])
assert weak_ref_tensor(x) is x and is_arch_support_pdl() is False
try:
    build_tree_kernel_efficient(1)
except FallbackCalled as e:
    assert "build_tree_kernel_efficient" in str(e)
else:
    raise AssertionError("a missing op must refuse")
assert sgl_kernel.__version__.endswith("gpu-kit-fallback")
print("ok")
"""
    p = _run(code, GPU / "shims" / "sgl_kernel_fallback", *map(Path, sys.path[1:]))
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_importcheck_hides_what_image_and_carry_lack(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    check = str(GPU / "gpu_kit" / "importcheck.py")
    base = [sys.executable, check, "--image", str(empty), "--carry", str(empty), "json", "tqdm"]
    p = subprocess.run(base, capture_output=True, text=True)
    report = json.loads(p.stdout)
    assert p.returncode == 1 and report["failed"] == ["tqdm"]
    assert report["missing_modules"] == ["tqdm"] and report["modules"]["json"]["ok"]
    p = subprocess.run(
        [*base, "--allow", "tqdm", "--allow", "torch"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout[-2000:]
