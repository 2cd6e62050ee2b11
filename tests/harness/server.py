"""TEST HARNESS: start the real ``python -m sglang.launch_server`` on CPU.

The server runs in its own process group on a free loopback port, set up for CPU
serving as ``sglang-spec-ext serve-cpu`` does (the product's placeholder modules,
:mod:`sglang_spec_ext.sglang.cpu.placeholders`, installed through its PYTHONPATH), logs to a
file, and is always torn down (the whole group) by :meth:`CPUServer.stop`. Test servers skip
two pieces of host start-up and shutdown work no test checks (:func:`quick_server_env`).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from sglang_spec_ext.bench.servers import free_port
from sglang_spec_ext.sglang.cpu.serving import (
    GPU_PATH_ENV,
    cpu_serving_env,
    mamba_cpu_flags,
    placeholder_site_dir,
)

#: Where the placeholder ``sitecustomize`` lives (the product's CPU-serving site dir).
SHIM_DIR = placeholder_site_dir()
REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SPEC_EXT_")}
    env = cpu_serving_env(env)
    # SUFFIX's draft gate (on by default) decides verify or plain from measured step
    # times, so step counts vary between runs; tests count steps. The gate's own tests
    # set it to 1; the soak starts its servers itself and runs the product default.
    env.setdefault("SGLANG_SPEC_EXT_DRAFT_GATE", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return env


#: The host's crash diagnostics (a py-spy dump and a CUDA core dump of live schedulers;
#: neither exists on this machine) make the launcher sleep 5 s whenever a scheduler dies
#: first, which :meth:`CPUServer.stop`'s SIGTERM to the process group always causes. The
#: test servers skip them; a test of the product's shutdown path sets them back to the
#: host's default (``"1"``).
NO_CRASH_DIAGNOSTICS_ENV = {
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}

#: The host's model modules the tests serve: Llama (the tiny model, its truncated
#: drafts, SmolLM2), the host's Llama EAGLE heads, and MiMo with its MTP draft
#: (the tiny MiMo of sglang_spec_ext/models/testing/mtp.py).
SERVED_MODEL_MODULES = frozenset({"llama", "llama_eagle", "llama_eagle3", "mimo", "mimo_mtp"})


@functools.cache
def unserved_model_modules() -> str:
    """Every other module of the host's ``sglang/srt/models``, comma-separated, for
    ``SGLANG_DISABLED_MODEL_ARCHS``: each scheduler otherwise imports all of them (about
    250) to build its model registry, 1-2 s of every server start here."""
    spec = importlib.util.find_spec("sglang")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return ""
    models = Path(spec.origin).parent / "srt" / "models"
    names = {p.stem for p in models.glob("*.py")} - SERVED_MODEL_MODULES - {"__init__"}
    return ",".join(sorted(names))


#: Test-only ``sitecustomize`` (tests/harness/fork_start): with FORK_START_ENV=1 the
#: host's scheduler and detokenizer processes start by fork from the launcher instead of
#: spawning fresh interpreters that import the host again (half of a server's start here).
FORK_START_SITE = Path(__file__).resolve().parent / "fork_start"
FORK_START_ENV = "SPEC_EXT_TEST_FORK_START"


def _with_fork_start_site(pythonpath: str) -> str:
    """``pythonpath`` with FORK_START_SITE right after the CPU-serving site directory (its
    ``sitecustomize`` runs the next one on the path)."""
    parts = [p for p in pythonpath.split(os.pathsep) if p and p != str(FORK_START_SITE)]
    at = parts.index(str(SHIM_DIR)) + 1 if str(SHIM_DIR) in parts else 0
    return os.pathsep.join([*parts[:at], str(FORK_START_SITE), *parts[at:]])


def quick_server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """:func:`cpu_server_env` for a test server: also without the host's crash
    diagnostics and its scan of model modules the tests do not serve, and with its
    subprocesses started by fork (start-up and shutdown work that nothing the tests check
    depends on; ``SPEC_EXT_TEST_FORK_START=0`` keeps the host's spawn); ``extra`` wins."""
    quick = {**NO_CRASH_DIAGNOSTICS_ENV, "SGLANG_DISABLED_MODEL_ARCHS": unserved_model_modules(),
             FORK_START_ENV: "1"}  # fmt: skip
    env = cpu_server_env()
    for key, value in quick.items():
        env.setdefault(key, value)  # a setting of the caller's environment wins
    env.update(extra or {})
    env["PYTHONPATH"] = _with_fork_start_site(env.get("PYTHONPATH", ""))
    return env


class ServerStartError(RuntimeError):
    pass


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when the process that started it dies, so a
    killed test run or demo never leaves a model server running. Caveat: the signal
    fires when the starting *thread* exits, so start servers from a thread that
    outlives them (the main thread, or a pool kept open until they are stopped)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class CPUServer:
    """One SGLang server process serving ``model_path`` on the CPU engine."""

    def __init__(
        self,
        model_path: str | Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        max_total_tokens: int = 8192,
        port: int | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.port = port or free_port()  # a given port: a restart where its peers expect it
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model_path,
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--dtype",
            "float32",
            "--max-total-tokens",
            str(max_total_tokens),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--random-seed",
            "0",
            # An idle scheduler otherwise busy-polls a core: on a 2-core machine two
            # idle servers would starve the one a test is talking to.
            "--sleep-on-idle",
            *extra_args,
        ]
        self.args += mamba_cpu_flags(self.args)  # Mamba-state models: what the CPU needs
        self.env = quick_server_env(env)
        if "--speculative-algorithm" in self.args:  # pytest --gpu-path (tests/conftest.py)
            for key, value in GPU_PATH_ENV[os.environ.get("SPEC_EXT_TEST_GPU_PATH", "off")].items():
                self.env.setdefault(key, value)  # a test's own setting wins
        self.log_path = Path(log_path or f"/tmp/spec-ext-server-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 600.0) -> CPUServer:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"server exited with code {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if requests.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.25)  # start-up takes ~40 s: a finer poll saves ~0.4 s a start
        self.stop()
        raise ServerStartError(f"server not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, term_wait: float = 20.0) -> None:
        """Stop the server: SIGTERM, up to ``term_wait`` s for it to exit, then SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Children (scheduler, detokenizer) share the group; make sure none survive.
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> CPUServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    # -- requests ----------------------------------------------------------
    def generate(
        self,
        input_ids: Sequence[int] | None = None,
        text: str | None = None,
        timeout: float = 300.0,
        fields: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> dict:
        """POST /generate; ``fields``: request fields beside the sampling parameters
        (cache_salt, extra_key, lora_path, ...)."""
        payload: dict[str, Any] = {"sampling_params": sampling, **(fields or {})}
        if input_ids is not None:
            payload["input_ids"] = list(input_ids)
        else:
            payload["text"] = text
        r = requests.post(self.base_url + "/generate", json=payload, timeout=timeout)
        if r.status_code != 200:
            raise requests.HTTPError(
                f"/generate answered {r.status_code}: {r.text[:2000]}", response=r
            )
        return r.json()

    def healthy(self) -> bool:
        try:
            return requests.get(self.base_url + "/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False


#: Servers one factory starts at once (start_all). A start is mostly imports, in phases
#: that keep one core busy (the launcher's, before it starts its two subprocesses), so on a
#: 2-core machine a few side by side are up sooner than one after another.
MAX_PARALLEL_STARTS = 4


@dataclass(frozen=True)
class ServerConfig:
    """One server for :meth:`ServerFactory.start_all`: what ``factory(model_dir, *args,
    env=env, **kwargs)`` would start."""

    model_dir: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


class ServerFactory:
    """``factory(model_dir, *extra_args, env={...}, **kwargs)`` starts one server,
    ``factory.start_all({name: ServerConfig(...), ...})`` several side by side;
    :meth:`stop_all` stops every one it made (the e2e fixtures call it at their end)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.servers: list[CPUServer] = []
        # Kept until stop_all: the harness ties each server's life to the thread that
        # started it (PR_SET_PDEATHSIG), and a pool's threads live until shutdown.
        self._pool: cf.ThreadPoolExecutor | None = None

    def _make(self, config: ServerConfig) -> CPUServer:
        log = self.log_dir / f"server-{len(self.servers)}.log"
        server = CPUServer(config.model_dir, config.args, env=config.env, log_path=log,
                           **config.kwargs)  # fmt: skip
        self.servers.append(server)
        return server

    def __call__(
        self, model_dir: Path, *extra_args: str, env: dict[str, str] | None = None, **kwargs: Any
    ) -> CPUServer:
        return self._make(ServerConfig(model_dir, extra_args, env, kwargs)).start()

    def start_all(self, configs: Mapping[str, ServerConfig]) -> dict[str, CPUServer]:
        """Start every config at once (at most MAX_PARALLEL_STARTS at a time): the servers
        by the configs' names; the first start error is raised once all have ended."""
        made = {name: self._make(config) for name, config in configs.items()}
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(MAX_PARALLEL_STARTS, "server-start")
        futures = {name: self._pool.submit(server.start) for name, server in made.items()}
        cf.wait(futures.values())  # every start ends (up or failed) before an error is raised
        return {name: future.result() for name, future in futures.items()}

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()
            if os.environ.get("SPEC_EXT_SHOW_SERVER_LOG"):
                print(server.log_tail(200))
        if self._pool is not None:
            self._pool.shutdown()


def abort_mid_stream(server: CPUServer, input_ids: Sequence[int], max_new_tokens: int) -> dict:
    """Stream a long greedy request, abort it by rid after a few chunks, and return the
    ``meta_info`` of the last chunk seen (asserting the stream really ended)."""
    import json
    import threading

    rid = f"abort-{time.time()}"
    seen: list[dict] = []
    payload = {"input_ids": list(input_ids), "rid": rid, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                   "ignore_eos": True}}  # fmt: skip

    def stream() -> None:
        with requests.post(
            server.base_url + "/generate", json=payload, stream=True, timeout=120
        ) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    seen.append(json.loads(line[5:]))

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    deadline = time.time() + 60
    while len(seen) < 3 and time.time() < deadline:
        time.sleep(0.2)
    assert seen, "stream produced nothing"
    requests.post(server.base_url + "/abort_request", json={"rid": rid}, timeout=30)
    t.join(timeout=60)
    assert not t.is_alive(), "aborted stream did not end"
    return seen[-1]["meta_info"]
