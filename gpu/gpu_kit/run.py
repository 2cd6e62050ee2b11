"""``gpu/run``: the plugin's GPU measurements on the lent machine, in one command.

Installs the carry into a work folder (kept on a warm machine), builds the plugin from the
tree that travelled, then runs a plan's stages under a time guard (a budget for the call,
a cap per stage), writing into ``--out`` as results arrive: ``results.json`` (every
stage's figures or its failure), ``cells.jsonl`` (each finished cell, appended),
``calibration.json``, ``run.log`` and, at the end, ``server-logs.txt``:

    python3 gpu/run --out "$OUT"                  # first call on a fresh machine
    python3 gpu/run --out "$OUT" --warm           # second call, machine still warm
    python gpu/run --dry --out /tmp/gpu-dry       # rehearsal on a CPU machine (CPU engine)
    python gpu/run --rehearse --carry C --out O   # the same after installing the carry
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_kit import stages, stages_timing
from gpu_kit.guard import Budget, Stage, run_stages
from gpu_kit.kit import Kit
from gpu_kit.params import ALL_STAGES, DRY_PLAN, FIRST_PLAN, LIMITS, WARM_PLAN
from gpu_kit.pins import REPO
from gpu_kit.results import Results
from gpu_kit.servers import ServerSpec
from gpu_kit.warm import previous_passed, record_call

_FNS = {"env": stages.stage_env, "imports": stages.stage_imports,
        "parity": stages.stage_parity, "curve": stages.stage_curve,
        "hosttime": stages_timing.stage_hosttime, "hybrid": stages_timing.stage_hybrid,
        "toks": stages_timing.stage_toks, "adaptive": stages_timing.stage_adaptive}  # fmt: skip


def make_stage(
    name: str, cap_scale: float = 1.0, min_seconds: float | None = None,
    cap: float | None = None,
) -> Stage:  # fmt: skip
    """A stage with its limits (``params.LIMITS``): ``cap`` replaces the cap times
    ``cap_scale`` (0 or less: no cap), ``min_seconds`` the budget it needs to start."""
    low, default_cap = LIMITS[name]
    fn = _FNS[name]
    if cap is None:
        cap = default_cap * cap_scale if cap_scale > 0 else None
    return Stage(name, fn, low if min_seconds is None else min_seconds, doc=fn.__doc__ or "",
                 cap_seconds=cap)  # fmt: skip


def choose_stages(args: argparse.Namespace, kit: Kit) -> tuple[list[str], dict[str, str]]:
    """The stages of this call and why any of the plan's were left out."""
    if args.stages:
        return [s for s in args.stages.split(",") if s], {}
    if args.warm:
        done = previous_passed(kit.state)
        left_out = {s: "passed in an earlier call on this machine" for s in WARM_PLAN if s in done}
        plan = [s for s in WARM_PLAN if s not in done]
        if not kit.dry and "kernel" not in kit.state:  # no env stage here: sgl_kernel unchosen
            plan.insert(0, "env")
        return plan, left_out
    return list(DRY_PLAN if kit.dry else FIRST_PLAN), {}


def collect_logs(kit: Kit, out: Path, limit: int = 12 * 2**20) -> None:
    """Every server and build log (tails, newest last) in one file under ``out``."""
    parts = []
    for path in sorted(kit.layout.logs.glob("*.log"), key=lambda p: p.stat().st_mtime):
        text = path.read_text(errors="replace")
        parts.append(f"===== {path.name} ({len(text)} chars, last 300 lines)\n")
        parts.append("\n".join(text.splitlines()[-300:]) + "\n")
    blob = "".join(parts)
    (out / "server-logs.txt").write_text(blob[-limit:])


def save_jit_cache(kit: Kit, out: Path, limit_mib: float = 15.0, timeout_s: float = 25) -> str:
    """The compile caches as ``jit-cache.tar.xz`` in ``out`` (copy it into the carry
    folder to skip the compiles on a fresh machine), if it stays under the file limit."""
    cache = kit.layout.cache
    if not cache.is_dir():
        return "no cache"
    dest = out / "jit-cache.tar.xz"
    try:
        subprocess.run(["tar", "-C", str(cache), "-cJf", str(dest), "."], check=False,
                       timeout=timeout_s, env={**os.environ, "XZ_OPT": "-T0 -6"})  # fmt: skip
    except subprocess.TimeoutExpired:
        dest.unlink(missing_ok=True)
        return f"dropped: tar took over {timeout_s:.0f} s"
    if dest.is_file() and dest.stat().st_size > limit_mib * 2**20:
        size = dest.stat().st_size / 2**20
        dest.unlink()
        return f"dropped: {size:.1f} MiB"
    return f"{dest.stat().st_size / 2**20:.1f} MiB" if dest.is_file() else "failed"


def summary(results: Results) -> str:
    rows = []
    for name in results.data["order"]:
        rec = results.data["stages"][name]
        why = rec.get("error") or rec.get("reason") or ""
        rows.append(
            f"  {name:<9} {rec.get('status', '?'):<8} {rec.get('seconds', '')!s:>6}  {why[:150]}"
        )
    return "\n".join(rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu/run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="results folder ($OUT)")
    ap.add_argument("--carry", type=Path, default=REPO / ".gpu-carry", help="gpu/pack's folder")
    ap.add_argument("--work", type=Path, help="scratch (default /tmp/gpu-kit, dry: a temp dir)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for the whole call")
    ap.add_argument("--reserve", type=float, default=35.0, help="seconds kept for the wrap-up")
    ap.add_argument("--warm", action="store_true",
                    help="second call on a warm machine: the warm plan, reusing the install")  # fmt: skip
    ap.add_argument("--dry", action="store_true", help="rehearse on a CPU machine (CPU engine)")
    ap.add_argument("--rehearse", action="store_true",
                    help="--dry after installing --carry as the GPU run does")  # fmt: skip
    ap.add_argument("--stages", help=f"comma list of {ALL_STAGES} (default: the plan's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a size")
    ap.add_argument("--save-jit-cache", action="store_true", help="jit-cache.tar.xz into --out")
    ap.add_argument("--cap", action="append", default=[], metavar="STAGE=SECONDS",
                    help="one stage's cap (0: none), e.g. --cap parity=120")  # fmt: skip
    ap.add_argument("--cap-scale", type=float,
                    help="stage caps times this (default 1, dry 6; 0: no caps)")  # fmt: skip
    ap.add_argument("--min-stage-seconds", type=float,
                    help="start a stage with at least this much budget left (default: its own)")  # fmt: skip
    ap.add_argument("--server-cmd", help=argparse.SUPPRESS)  # tests: a fake launch_server
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required (or $OUT)")
    named = {*(args.stages or "").split(","), *(c.partition("=")[0] for c in args.cap)}
    unknown = sorted(named - set(ALL_STAGES) - {""})
    if unknown:
        ap.error(f"unknown stages {unknown}; known: {ALL_STAGES}")
    try:
        args.caps = {k: float(v) or math.inf for k, _, v in (c.partition("=") for c in args.cap)}
    except ValueError:
        ap.error(f"--cap takes STAGE=SECONDS, got {args.cap}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    dry = args.dry or args.rehearse
    args.work = args.work or (
        Path(tempfile.mkdtemp(prefix="gpu-kit-dry-")) if dry else Path("/tmp/gpu-kit")
    )
    # absolute: servers start in the log folder, not here
    args.out, args.work, args.carry = (p.resolve() for p in (args.out, args.work, args.carry))
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "run.log", "a")  # noqa: SIM115 - closed at exit

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    budget = Budget(args.budget - args.reserve)
    budget.arm()  # the install is under the budget too (and SIGTERM ends it cleanly)
    results = Results(args.out, {"argv": sys.argv[1:] if argv is None else argv, "dry": dry,
                                 "rehearse": args.rehearse, "warm": args.warm,
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})  # fmt: skip
    kit = Kit(args, args.out, results)
    results.data["meta"]["params"] = kit.p
    status: dict[str, str] = {}
    try:
        t0 = time.monotonic()
        try:
            results.update("install", status="passed", **kit.install(),
                           seconds=round(time.monotonic() - t0, 1))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            results.update("install", status="failed", error=f"{type(exc).__name__}: {exc}")
            log(f"[run] install FAILED: {exc}")
            return 1
        wanted, left_out = choose_stages(args, kit)
        results.data["meta"]["plan"] = wanted
        if left_out:
            results.data["meta"]["left_out"] = left_out
        log(f"[run] plan: {wanted}" + (f" (left out: {sorted(left_out)})" if left_out else ""))
        scale = args.cap_scale if args.cap_scale is not None else (6.0 if dry else 1.0)
        chosen = [make_stage(n, scale, args.min_stage_seconds, args.caps.get(n)) for n in wanted]
        status = run_stages(chosen, kit, results, budget, cleanup=lambda: kit.pool.keep_only(
            _still_needed(kit, chosen, results)), log=log)  # fmt: skip
    except BaseException as exc:  # noqa: BLE001 - TimeUp/SIGTERM outside a stage: wrap up
        results.data["meta"]["ended_by"] = f"{type(exc).__name__}: {exc}"
    finally:
        budget.disarm()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the wrap-up runs to its end
        results.flush()
        kit.pool.stop_all(term_wait_s=5.0)
        results.data["meta"]["servers"] = kit.pool.history
        kit.settle_plugin()
        results.data["meta"]["plugin"] = kit._plugin_report
        results.data["meta"]["sgl_kernel"] = kit.kernel
        collect_logs(kit, args.out)
        record_call(args.work, kit.state, status, out=str(args.out))
        if args.save_jit_cache and not budget.terminated:  # SIGKILL follows SIGTERM in 10 s
            results.flush()
            results.data["meta"]["jit_cache"] = save_jit_cache(kit, args.out)
        results.flush()
        log("[run] summary (results.json has every figure and error):\n" + summary(results))
        log_file.close()
    return 0


def _still_needed(kit: Kit, chosen: list[Stage], results: Results) -> list[ServerSpec]:
    """Servers to keep after a stage: the plain timing server while toks remains."""
    pending = {s.name for s in chosen if s.name not in results.data["stages"]
               or results.data["stages"][s.name].get("status") in (None, "running")}  # fmt: skip
    if pending & {"toks"}:
        p = kit.p
        return [kit.spec("plain-timing", p["timing_geometry"], p["timing_dtype"])]
    return []
