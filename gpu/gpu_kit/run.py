"""``gpu/run``: the first real GPU run of the plugin, in one command on the lent machine.

Installs the carry into a work folder, builds the plugin from the tree that travelled,
then runs the stages in priority order under one time guard, writing ``results.json``
(every stage's figures or its failure, as they arrive), ``calibration.json``, ``run.log``
and ``server-logs.txt`` into ``--out``:

    python3 gpu/run --out "$OUT"                 # on the lent machine (docs/gpu.md)
    python gpu/run --dry --out /tmp/gpu-dry      # rehearsal on a CPU machine (the CPU engine)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_kit import stages
from gpu_kit.guard import Budget, Results, Stage, run_stages
from gpu_kit.install import (
    GPU_ENV,
    Layout,
    extract_carry,
    finish_plugin_build,
    pythonpath,
    start_plugin_build,
)
from gpu_kit.models import write_model_dir
from gpu_kit.pins import REPO
from gpu_kit.servers import Pool, Server, ServerSpec

#: Sizes of the lent-GPU run (each can be overridden: ``--set KEY=JSON``).
GPU_PARAMS: dict[str, Any] = {
    "parity_geometry": "llama3-1b", "parity_widths": [4, 8, 16], "parity_prompts": 8,
    "parity_prompt_len": 256, "parity_new_tokens": 128, "parity_deterministic": False,
    "timing_geometry": "llama3-1b", "timing_dtype": "bfloat16",
    "curve_widths": [2, 4, 8, 16], "curve_batches": [1, 4, 16, 64],
    "curve_prompt_len": 512, "curve_new_tokens": 64,
    "host_geometry": "llama3-1b", "host_width": 16, "host_batches": [1, 16],
    "host_new_tokens": 96, "draft_geometry": "draft-2l",
    "toks_accept_len": 3.0, "toks_batches": [1, 16, 64], "toks_new_tokens": 96,
    "ready_timeout_s": 300, "cuda_graph_bs": [1, 2, 4, 8, 16, 32, 64],
    "context_length": 2048, "max_total_tokens": 65536, "max_running_requests": 64,
    "mem_fraction_static": 0.88, "max_concurrent_servers": 8,
    "parity_max_total_tokens": 16384, "parity_graph_bs": [1, 2, 4, 8, 16],
}  # fmt: skip
#: The CPU rehearsal: the same stages, tiny model, few tokens.
DRY_PARAMS: dict[str, Any] = {
    **GPU_PARAMS,
    "parity_geometry": "tiny", "parity_widths": [4], "parity_prompts": 2,
    "parity_prompt_len": 48, "parity_new_tokens": 24,
    "timing_geometry": "tiny", "timing_dtype": "float32", "curve_widths": [4],
    "curve_batches": [1, 2], "curve_prompt_len": 32, "curve_new_tokens": 12,
    "host_geometry": "tiny", "host_batches": [1], "host_new_tokens": 16,
    "draft_geometry": "tiny-draft", "toks_batches": [1, 2], "toks_new_tokens": 12,
    "ready_timeout_s": 240, "cuda_graph_bs": [1, 2, 4], "context_length": 512,
    "max_total_tokens": 8192, "max_running_requests": 8, "parity_max_total_tokens": 8192,
    "parity_graph_bs": [1, 2, 4],
}  # fmt: skip

STAGES: list[Stage] = [
    Stage("env", stages.stage_env, 20, doc=stages.stage_env.__doc__ or ""),
    Stage("parity", stages.stage_parity, 90, doc=stages.stage_parity.__doc__ or ""),
    Stage("curve", stages.stage_curve, 60, doc=stages.stage_curve.__doc__ or ""),
    Stage("hosttime", stages.stage_hosttime, 60, doc=stages.stage_hosttime.__doc__ or ""),
    Stage("toks", stages.stage_toks, 45, doc=stages.stage_toks.__doc__ or ""),
    Stage("adaptive", stages.stage_adaptive, 60, doc=stages.stage_adaptive.__doc__ or ""),
]


class Kit:
    """What the stages share: sizes, layout, servers, results."""

    def __init__(self, args: argparse.Namespace, out: Path, results: Results) -> None:
        self.dry = args.dry
        self.p = dict(DRY_PARAMS if args.dry else GPU_PARAMS)
        for item in args.set:
            key, _, value = item.partition("=")
            if key not in self.p:
                raise SystemExit(f"--set: unknown key {key!r}; known: {sorted(self.p)}")
            self.p[key] = json.loads(value)
        self.out, self.results = out, results
        self.layout = Layout(args.work, args.carry)
        self.kernel = "carried"
        self.carry_report: dict[str, Any] = {}
        self.dry_path = "CPU engine, SGLANG_SPEC_EXT_CPU_OVERLAP=1 + SGLANG_SPEC_EXT_CPU_GRAPHS=1"
        self._plugin_proc: subprocess.Popen | None = None
        self._plugin_report: dict[str, Any] | None = None
        self.base_cmd = [sys.executable, "-m", "sglang.launch_server"]
        self.dry_flags: list[str] = []
        self.dry_env: dict[str, str] = {}
        if args.server_cmd:
            self.base_cmd = shlex.split(args.server_cmd)
        elif args.dry:
            self._read_serve_cpu()
        self.pool = Pool(self.make_server, self.p["ready_timeout_s"], self.plugin_ready)

    # -- setup -----------------------------------------------------------------------
    def install(self) -> dict[str, Any]:
        report: dict[str, Any] = {}
        if not self.dry:
            self.carry_report = extract_carry(self.layout)
            report["carry"] = self.carry_report
            if self.carry_report.get("sgl_kernel.tar.xz") == "absent":
                self.kernel = "fallback"
            self._plugin_proc = start_plugin_build(self.layout)
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        for geo in {self.p["parity_geometry"], self.p["timing_geometry"],
                    self.p["host_geometry"], self.p["draft_geometry"]}:  # fmt: skip
            write_model_dir(self.layout.models, geo)
        return report

    def _read_serve_cpu(self) -> None:
        """How the project launches CPU servers: ``sglang-spec-ext serve-cpu --print-command``."""
        exe = shutil.which("sglang-spec-ext") or str(
            Path(sys.executable).with_name("sglang-spec-ext")
        )
        out = subprocess.run([exe, "serve-cpu", "--print-command", "--", "--model-path", "M"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        lines = [ln for ln in out.splitlines() if ln.strip()]
        for ln in lines[:-1]:
            key, _, value = ln.partition("=")
            self.dry_env[key] = value
        cmd = shlex.split(lines[-1])
        i = cmd.index("--model-path")
        self.base_cmd, self.dry_flags = cmd[:i], cmd[i + 2 :]

    def plugin_ready(self) -> dict[str, Any]:
        if self._plugin_report is None:
            if self._plugin_proc is None:
                self._plugin_report = {"source": "the running environment (dry or --server-cmd)"}
            else:
                self._plugin_report = finish_plugin_build(self.layout, self._plugin_proc, 240)
        return self._plugin_report

    def plugin_status(self) -> dict[str, Any]:
        """The plugin build's report if it ended, else that it is still running."""
        if self._plugin_report is None and self._plugin_proc is not None:
            if self._plugin_proc.poll() is None:
                return {"building": True}
        return self.plugin_ready()

    # -- servers -----------------------------------------------------------------------
    def each_server(
        self, specs: dict[Any, ServerSpec], keep: tuple[ServerSpec, ...] = ()
    ) -> Iterator[tuple[Any, ServerSpec, Server | Exception]]:
        """The servers of ``specs`` in order, started ``max_concurrent_servers`` at a time
        (one wave measured, then stopped except ``keep``, before the next starts)."""
        items = list(specs.items())
        n = max(1, int(self.p["max_concurrent_servers"]))
        for i in range(0, len(items), n):
            wave = items[i : i + n]
            started = self.pool.get_many([spec for _, spec in wave])
            self.save()
            for key, spec in wave:
                yield key, spec, started[spec.label]
            if i + n < len(items):
                self.pool.keep_only([s for s in self.pool.live if s in keep])

    def spec(
        self, label: str, geometry: str, dtype: str, *, algo: str | None = None,
        width: int | None = None, adaptive: bool = False, env: dict[str, str] | None = None,
        probe: bool = False, gpu_path: bool = False, extra: tuple[str, ...] = (),
        graph_bs: list[int] | None = None, max_total_tokens: int | None = None,
    ) -> ServerSpec:  # fmt: skip
        p = self.p
        graph_bs = graph_bs or p["cuda_graph_bs"]
        running = max(graph_bs) if graph_bs != p["cuda_graph_bs"] else p["max_running_requests"]
        args = ["--model-path", str(self.layout.models / geometry), "--load-format", "dummy",
                "--skip-tokenizer-init", "--random-seed", "0", "--skip-server-warmup",
                "--context-length", str(p["context_length"]),
                "--max-total-tokens", str(max_total_tokens or p["max_total_tokens"]),
                "--max-running-requests", str(running),
                "--cuda-graph-bs-decode", *map(str, graph_bs)]  # fmt: skip
        if not self.dry:
            args += ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                     "--dtype", dtype, "--mem-fraction-static", str(p["mem_fraction_static"]),
                     "--cuda-graph-backend-prefill", "disabled"]  # fmt: skip
        if algo == "HYBRID":
            args += ["--speculative-algorithm", "HYBRID", "--speculative-draft-model-path",
                     str(self.layout.models / p["draft_geometry"]),
                     "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(width)]  # fmt: skip
        elif algo:
            args += ["--speculative-algorithm", algo, "--speculative-num-draft-tokens", str(width)]
        args += list(extra)
        senv = dict(env or {})
        if adaptive:
            senv["SGLANG_SPEC_EXT_ADAPTIVE"] = "1"
        if probe:
            senv["GPU_KIT_PROBE_OUT"] = str(self.probe_out(label))
            senv["GPU_KIT_PROBE_CTL"] = str(self.probe_out(label).with_suffix(".ctl"))
        if dtype == "float32" and not self.dry:
            # sglang-kernel 0.4.5's rmsnorm dispatches half/bf16 only ("failed to dispatch
            # data type Float": the second GPU run's fp32 parity servers died on it), so
            # fp32 servers take the kit's pure-torch norms.
            senv["GPU_KIT_SGL_KERNEL"] = "fallback"
        if self.dry and gpu_path:
            senv |= {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "1"}
        plugin = algo in ("SUFFIX", "HYBRID")
        return ServerSpec(label, tuple(args), tuple(sorted(senv.items())), plugin)

    def server_env(self, spec: ServerSpec | None) -> dict[str, str]:
        env = dict(os.environ)
        old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        first: list[str] = []
        if self.dry:
            env |= {k: v for k, v in self.dry_env.items() if k != "PYTHONPATH"}
            first = self.dry_env.get("PYTHONPATH", "").split(os.pathsep)
            env["OMP_NUM_THREADS"] = "1"
        else:
            env |= GPU_ENV
            env["SGLANG_JIT_CACHE_DIR"] = str(self.layout.jit_cache)
            env["TRITON_CACHE_DIR"] = str(self.layout.triton_cache)
        kernel = dict(spec.env).get("GPU_KIT_SGL_KERNEL", self.kernel) if spec else self.kernel
        paths = [*first, *pythonpath(self.layout, spec, kernel, self.dry), *old]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        env |= dict(spec.env) if spec else {}
        return env

    def make_server(self, spec: ServerSpec) -> Server:
        cmd = [*self.base_cmd, *spec.args, *self.dry_flags]
        return Server(spec, cmd, self.server_env(spec), self.layout.logs / f"{spec.label}.log")

    def probe_out(self, label: str) -> Path:
        path = self.layout.work / "probe" / f"{label}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def probe_ctl(self, label: str, value: str) -> None:
        self.probe_out(label).with_suffix(".ctl").write_text(value)
        time.sleep(0.05)  # distinct mtimes

    # -- results -----------------------------------------------------------------------
    def save(self) -> None:
        self.results.flush()

    def write_json(self, name: str, data: Any) -> None:
        (self.out / name).write_text(json.dumps(data, indent=1, default=str))

    def device_name(self) -> str | None:
        env = self.results.data["stages"].get("env", {})
        dev = (env.get("machine") or {}).get("versions") or {}
        return (dev.get("device") or {}).get("name") if isinstance(dev, dict) else None

    def gpu_memory_used_mib(self) -> int | None:
        return None if self.dry else stages.gpu_memory_used_mib()

    def failure_details(self) -> dict[str, Any]:
        return {"server_log_tails": self.pool.tails(), "servers_started": self.pool.history[-8:]}


def collect_logs(kit: Kit, out: Path, limit: int = 12 * 2**20) -> None:
    """Every server and build log (tails, newest last) in one file under ``out``."""
    parts = []
    for path in sorted(kit.layout.logs.glob("*.log"), key=lambda p: p.stat().st_mtime):
        text = path.read_text(errors="replace")
        parts.append(f"===== {path.name} ({len(text)} chars, last 300 lines)\n")
        parts.append("\n".join(text.splitlines()[-300:]) + "\n")
    blob = "".join(parts)
    (out / "server-logs.txt").write_text(blob[-limit:])


def save_jit_cache(kit: Kit, out: Path, limit_mib: float = 15.0) -> str:
    """The JIT and Triton caches as ``jit-cache.tar.xz`` in ``out`` (copy it into the carry
    folder to skip the compiles next time), if it stays under the file limit."""
    cache = kit.layout.work / "cache"
    if not cache.is_dir():
        return "no cache"
    dest = out / "jit-cache.tar.xz"
    try:
        subprocess.run(["tar", "-C", str(cache), "-cJf", str(dest), "."], check=False,
                       timeout=25, env={**os.environ, "XZ_OPT": "-T0 -6"})  # fmt: skip
    except subprocess.TimeoutExpired:
        dest.unlink(missing_ok=True)
        return "dropped: tar took over 25 s"
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu/run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="results folder ($OUT)")
    ap.add_argument("--carry", type=Path, default=REPO / ".gpu-carry", help="gpu/pack's folder")
    ap.add_argument("--work", type=Path, help="scratch (default /tmp/gpu-kit, dry: a temp dir)")
    ap.add_argument("--budget", type=float, default=530.0, help="seconds for the whole run")
    ap.add_argument("--reserve", type=float, default=35.0, help="seconds kept for the wrap-up")
    ap.add_argument("--dry", action="store_true", help="rehearse on a CPU machine (CPU engine)")
    ap.add_argument("--stages", default=",".join(s.name for s in STAGES), help="comma list")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a size")
    ap.add_argument("--save-jit-cache", action="store_true", help="jit-cache.tar.xz into --out")
    ap.add_argument(
        "--min-stage-seconds",
        type=float,
        help="start a stage with at least this much budget left (default: each stage's own)",
    )
    ap.add_argument("--server-cmd", help=argparse.SUPPRESS)  # tests: a fake launch_server
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required (or $OUT)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or (
        Path(tempfile.mkdtemp(prefix="gpu-kit-dry-")) if args.dry else Path("/tmp/gpu-kit")
    )
    wanted = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(wanted) - {s.name for s in STAGES})
    if unknown:
        ap.error(f"unknown stages {unknown}; known: {[s.name for s in STAGES]}")
    log_file = open(args.out / "run.log", "a")  # noqa: SIM115 - closed at exit

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    budget = Budget(args.budget - args.reserve)
    results = Results(args.out, {"argv": sys.argv[1:] if argv is None else argv, "dry": args.dry,
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})  # fmt: skip
    kit = Kit(args, args.out, results)
    results.data["meta"]["params"] = kit.p
    try:
        t0 = time.monotonic()
        try:
            results.update("install", status="passed", **kit.install(),
                           seconds=round(time.monotonic() - t0, 1))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            results.update("install", status="failed", error=f"{type(exc).__name__}: {exc}")
            log(f"[run] install FAILED: {exc}")
            return 1
        chosen = [s for s in STAGES if s.name in wanted]
        if args.min_stage_seconds is not None:
            chosen = [dataclasses.replace(s, min_seconds=args.min_stage_seconds) for s in chosen]
        run_stages(chosen, kit, results, budget, cleanup=lambda: kit.pool.keep_only(
            _still_needed(kit, chosen, results)), log=log)  # fmt: skip
    finally:
        kit.pool.stop_all()
        results.data["meta"]["servers"] = kit.pool.history
        results.data["meta"]["plugin"] = kit._plugin_report
        results.data["meta"]["sgl_kernel"] = kit.kernel
        collect_logs(kit, args.out)
        if args.save_jit_cache:
            results.data["meta"]["jit_cache"] = save_jit_cache(kit, args.out)
        results.flush()
        log("[run] summary (results.json has every figure and error):\n" + summary(results))
        log_file.close()
    return 0


def _still_needed(kit: Kit, chosen: list[Stage], results: Results) -> list[ServerSpec]:
    """Servers to keep after a stage: the plain timing server while curve/toks remain."""
    pending = {s.name for s in chosen if s.name not in results.data["stages"]
               or results.data["stages"][s.name].get("status") in (None, "running")}  # fmt: skip
    if pending & {"toks"}:
        p = kit.p
        return [kit.spec("plain-timing", p["timing_geometry"], p["timing_dtype"])]
    return []
