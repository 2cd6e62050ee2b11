"""What the stages of ``gpu/run`` share (:class:`Kit`): the sizes of this run, the layout
on the machine, the install (reused on a warm machine), the plugin build, each server's
command and environment, the server pool, and the results written as they arrive.

Three modes: the lent GPU machine (default); ``--dry``, the same stages on SGLang's CPU
engine in the running environment; ``--rehearse``, ``--dry`` after installing the carry as
the GPU run does (unpack, site overrides, plugin build with pip), its servers importing
the carried sglang and packages, so a venv with the lent image's versions rehearses the
install and the host's start-up (docs/gpu.md, "The rehearsal on the image's versions")."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_kit import client, stages
from gpu_kit.install import (
    GPU_ENV,
    Layout,
    extract_carry,
    finish_plugin_build,
    pythonpath,
    start_plugin_build,
)
from gpu_kit.models import write_model_dir
from gpu_kit.params import DRY_PARAMS, GPU_PARAMS
from gpu_kit.pins import REPO
from gpu_kit.results import Results
from gpu_kit.servers import Pool, Server, ServerSpec, kill_leftovers
from gpu_kit.warm import load_state, plugin_digest, save_state

#: The first request every server gets once ready: ids valid in every geometry's vocab and
#: below the stages' prompt ids (100 and up), so it leaves no prefix a measured prompt
#: could hit in the radix cache.
FIRST_PROMPT = list(range(10, 26))
FIRST_NEW_TOKENS = 8


class Kit:
    """What the stages share: sizes, layout, servers, results."""

    def __init__(self, args: argparse.Namespace, out: Path, results: Results) -> None:
        self.rehearse = bool(getattr(args, "rehearse", False))
        self.dry = args.dry or self.rehearse
        self.p = dict(DRY_PARAMS if self.dry else GPU_PARAMS)
        for item in args.set:
            key, _, value = item.partition("=")
            if key not in self.p:
                raise SystemExit(f"--set: unknown key {key!r}; known: {sorted(self.p)}")
            self.p[key] = json.loads(value)
        client.TIMEOUT_S = float(self.p["request_timeout_s"])
        self.out, self.results = out, results
        self.layout = Layout(args.work, args.carry)
        self.state = load_state(args.work)
        self.kernel = self.state.get("kernel", "carried")
        self.carry_report: dict[str, Any] = {}
        self.dry_path = "CPU engine, SGLANG_SPEC_EXT_CPU_OVERLAP=1 + SGLANG_SPEC_EXT_CPU_GRAPHS=1"
        self._plugin_proc: subprocess.Popen | None = None
        self._plugin_report: dict[str, Any] | None = None
        self.base_cmd = [sys.executable, "-m", "sglang.launch_server"]
        self.dry_flags: list[str] = []
        self.dry_env: dict[str, str] = {}
        self.server_cmd = args.server_cmd
        if args.server_cmd:
            self.base_cmd = shlex.split(args.server_cmd)
        elif self.dry and not self.rehearse:
            self._read_serve_cpu([str(REPO)])
        self.pool = Pool(self.make_server, self.p["ready_timeout_s"], self.plugin_ready,
                         first_request=self.first_request)  # fmt: skip

    # -- setup -----------------------------------------------------------------------
    def install(self) -> dict[str, Any]:
        report: dict[str, Any] = {}
        ended = kill_leftovers(self.layout.pids)
        if ended:
            report["leftover_servers_ended"] = ended
        if not self.dry or self.rehearse:
            self.carry_report = extract_carry(self.layout, self.state.get("carry_stamp"))
            report["carry"] = self.carry_report
            self.state["carry_stamp"] = self.carry_report.get("stamp")
            if self.carry_report.get("sgl_kernel.tar.xz") == "absent" and not self.dry:
                self.kernel = "fallback"
            self._start_plugin()
            report["plugin_build"] = "kept" if self._plugin_report else "started"
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        for geo in {self.p["parity_geometry"], self.p["timing_geometry"],
                    self.p["host_geometry"], self.p["draft_geometry"]}:  # fmt: skip
            write_model_dir(self.layout.models, geo)
        if self.rehearse and not self.server_cmd:
            plugin = self.plugin_ready()  # every CPU-engine server loads the plugin
            root = REPO if "source_fallback" in plugin else self.layout.plugin_site
            self._read_serve_cpu([str(root), str(self.layout.site)])
        save_state(self.layout.work, self.state)
        return report

    def _start_plugin(self) -> None:
        digest = plugin_digest()
        kept = self.state.get("plugin")
        if (
            kept
            and kept.get("ok")
            and kept.get("digest") == digest
            and self.layout.plugin_site.is_dir()
        ):
            self._plugin_report = {**kept, "kept_from_previous_call": True}
            return
        self.state["plugin"] = {"digest": digest}
        self._plugin_proc = start_plugin_build(self.layout)

    def _read_serve_cpu(self, path: list[str]) -> None:
        """How the project launches CPU servers: ``sglang-spec-ext serve-cpu --print-command``
        (the plugin found on ``path``)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        out = subprocess.run([sys.executable, "-m", "sglang_spec_ext.cli", "serve-cpu",
                              "--print-command", "--", "--model-path", "M"],
                             capture_output=True, text=True, check=True, env=env).stdout  # fmt: skip
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
                self.state["plugin"] = {**self.state.get("plugin", {}), **self._plugin_report}
                save_state(self.layout.work, self.state)
        return self._plugin_report

    def settle_plugin(self) -> None:
        """At the end of a call: a build that finished unwaited is recorded (the next
        call keeps it); one still running or failed is left to the next call."""
        if self._plugin_report is None and self._plugin_proc is not None:
            if self._plugin_proc.poll() == 0:
                self.plugin_ready()

    def remember(self, key: str, value: Any) -> None:
        """A fact the next call on this machine reuses (``state.json``), saved at once."""
        self.state[key] = value
        save_state(self.layout.work, self.state)

    def plugin_status(self) -> dict[str, Any]:
        """The plugin build's report if it ended, else that it is still running."""
        if self._plugin_report is None and self._plugin_proc is not None:
            if self._plugin_proc.poll() is None:
                return {"building": True}
        return self.plugin_ready()

    # -- servers -----------------------------------------------------------------------
    def first_request(self, server: Server) -> None:
        """Every server's first request, right after it is ready: a prefill, decode (or
        verify) steps and a finished request, with the first-request time-out."""
        client.generate(server.url, FIRST_PROMPT, FIRST_NEW_TOKENS,
                        timeout_s=float(self.p["first_request_timeout_s"]))  # fmt: skip

    def each_server(
        self, specs: dict[Any, ServerSpec], keep: tuple[ServerSpec, ...] = (),
        timeout_s: float | None = None,
    ) -> Iterator[tuple[Any, ServerSpec, Server | Exception]]:  # fmt: skip
        """The servers of ``specs`` in order, started ``max_concurrent_servers`` at a time
        (one wave measured, then stopped except ``keep``, before the next starts)."""
        items = list(specs.items())
        n = self.wave_size()
        for i in range(0, len(items), n):
            wave = items[i : i + n]
            started = self.pool.get_many([spec for _, spec in wave], timeout_s)
            self.save()
            for key, spec in wave:
                yield key, spec, started[spec.label]
            if i + n < len(items):
                self.pool.keep_only([s for s in self.pool.live if s in keep])

    def wave_size(self) -> int:
        return max(1, int(self.p["max_concurrent_servers"]))

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
        # the host settings of the GPU run on CPU too: the rehearsal on the image's torch
        # 2.11 found the Rust radix core failing there as well (docs/gpu.md)
        env |= GPU_ENV
        if self.dry:
            env |= {k: v for k, v in self.dry_env.items() if k != "PYTHONPATH"}
            first = self.dry_env.get("PYTHONPATH", "").split(os.pathsep)
            env["OMP_NUM_THREADS"] = "1"
        env |= self.layout.cache_env()
        kernel = dict(spec.env).get("GPU_KIT_SGL_KERNEL", self.kernel) if spec else self.kernel
        paths = [*first, *pythonpath(self.layout, spec, kernel, self.dry, self.rehearse), *old]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        env |= dict(spec.env) if spec else {}
        return env

    def make_server(self, spec: ServerSpec) -> Server:
        cmd = [*self.base_cmd, *spec.args, *self.dry_flags]
        return Server(spec, cmd, self.server_env(spec), self.layout.logs / f"{spec.label}.log",
                      pids_file=self.layout.pids)  # fmt: skip

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

    def cell(self, key: str, value: Any) -> None:
        """A finished cell of the stage in flight, on disk at once (cells.jsonl)."""
        self.results.cell(key, value)

    def write_json(self, name: str, data: Any) -> None:
        tmp = self.out / (name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(self.out / name)

    def device_name(self) -> str | None:
        env = self.results.data["stages"].get("env", {})
        dev = (env.get("machine") or {}).get("versions") or {}
        return (dev.get("device") or {}).get("name") if isinstance(dev, dict) else None

    def gpu_memory_used_mib(self) -> int | None:
        return None if self.dry else stages.gpu_memory_used_mib()

    def failure_details(self) -> dict[str, Any]:
        return {"server_log_tails": self.pool.tails(), "servers_started": self.pool.history[-8:]}
