"""Launch ``python -m sglang.launch_server`` on a free loopback port, and stop it.

The server runs in its own process group (a terminal's Ctrl-C does not reach it; the
benchmark stops it, group and all, whatever happens), logs to a file, and is ready
when ``/health`` answers 200.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests


class ServerError(RuntimeError):
    """A launched server exited or did not become healthy in time."""


def add_launch_arguments(g: argparse._ArgumentGroup, server_args_help: str) -> None:
    """The server-launch options ``bench`` and ``tune`` share (see :func:`launch_settings`)."""
    g.add_argument("--server-args", default="", help=server_args_help)
    g.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="environment of launched servers (repeatable)",
    )
    g.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        metavar="DIR",
        help="prepend to PYTHONPATH of launched servers (repeatable)",
    )
    g.add_argument(
        "--serve-cpu",
        action="store_true",
        help="launch the servers as `sglang-spec-ext serve-cpu` does: SGLang's CPU engine "
        "without sgl-kernel (SGLANG_USE_CPU_ENGINE=1, placeholder modules for its GPU-only "
        "imports, --device cpu --attention-backend torch_native --dtype float32 unless given)",
    )
    g.add_argument(
        "--server-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for a launched server's /health",
    )


@dataclass(frozen=True)
class LaunchSettings:
    """How launched servers start: environment, PYTHONPATH and their launch arguments."""

    env: dict[str, str]
    pythonpath: list[str]
    server_args: str
    serve_cpu: bool
    timeout_s: float

    def launch_args(self, role_args: str = "", model_path: str | None = None) -> str:
        """``--server-args``, then ``role_args``, then (with ``--serve-cpu``) the CPU
        defaults the two do not set (with those ``model_path``'s architecture needs)."""
        joined = f"{self.server_args} {role_args}".strip()
        if not self.serve_cpu:
            return joined
        from sglang_spec_ext.sglang.cpu.serving import with_cpu_defaults

        return shlex.join(with_cpu_defaults(shlex.split(joined), model_path))


def launch_settings(args: argparse.Namespace) -> LaunchSettings:
    """The options of :func:`add_launch_arguments`, resolved (``ValueError`` on a bad
    ``--server-env``). With ``--serve-cpu`` the CPU-serving variables come first and the
    user's ``--server-env`` and ``--pythonpath`` after them."""
    env = parse_env(args.server_env)
    pythonpath = list(args.pythonpath)
    if args.serve_cpu:
        from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env

        cpu_env = cpu_serving_env(base={})
        pythonpath = [*cpu_env.pop("PYTHONPATH").split(os.pathsep), *pythonpath]
        env = {**cpu_env, **env}
    return LaunchSettings(env, pythonpath, args.server_args, args.serve_cpu, args.server_timeout)


#: Where launched servers' HTTP ports are drawn from: below the kernel's ephemeral range
#: (32768+ by default) and below SGLang's own range for ports its children bind later
#: (22000-29999, ``get_free_port_below_ephemeral``). A port from ``bind(0)`` is
#: ephemeral: while the server starts (its HTTP socket binds last), one of its own
#: processes can be handed the same port for an outgoing or random-port socket, and
#: the server then dies with "address already in use" (seen in the soak harness).
SERVER_PORTS = (10000, 21999)


def free_port(attempts: int = 64) -> int:
    """A free loopback TCP port for a server that binds it later (see ``SERVER_PORTS``)."""
    for port in random.sample(range(SERVER_PORTS[0], SERVER_PORTS[1] + 1), attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all taken: any free one
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VAL`` strings to a dict (``ValueError`` on a malformed one)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGTERM the server when the thread that launched it dies (even by
    SIGKILL), so a killed benchmark never leaves a model server running."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` right where the
    main thread is, so a killed or Ctrl-C'd run still stops the servers it launched and
    saves its results.

    SIGINT too, because ``asyncio.run`` otherwise turns Ctrl-C into a cancellation of its
    main task, and a cancellation that a library swallows (seen with in-flight aiohttp
    requests) is an interrupt lost: the run went on to its next cell. ``asyncio.run``
    leaves a handler that is not Python's default one in place."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class LaunchedServer:
    """One server subprocess: ``start()`` waits for health, ``stop()`` always cleans up."""

    def __init__(
        self,
        model_path: str,
        args: str | Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        pythonpath: Sequence[str] = (),
        log_path: Path | str | None = None,
        name: str = "server",
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = shlex.split(args) if isinstance(args, str) else list(args)
        self.cmd = [
            sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
            "--host", "127.0.0.1", "--port", str(self.port), *extra,
        ]  # fmt: skip
        self.env = dict(os.environ)
        self.env.update(env or {})
        paths = [str(Path(p).resolve()) for p in pythonpath]
        if paths:
            old = self.env.get("PYTHONPATH", "")
            self.env["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
        self.log_path = Path(log_path or f"/tmp/sglang-spec-ext-bench-{name}-{self.port}.log")
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout_s: float = 600.0) -> LaunchedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        # PR_SET_PDEATHSIG follows the launching *thread*: arm it only from the main one
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent if (main and sys.platform == "linux") else None,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise ServerError(
                        f"{self.name} server exited with code {self.proc.returncode} "
                        f"(log {self.log_path}):\n{self.log_tail()}"
                    )
                try:
                    if requests.get(self.url + "/health", timeout=5).status_code == 200:
                        return self
                except requests.RequestException:
                    pass
                time.sleep(1.0)
            raise ServerError(
                f"{self.name} server not healthy after {timeout_s:.0f}s "
                f"(log {self.log_path}):\n{self.log_tail()}"
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc = self.proc
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:  # children (scheduler, detokenizer) share the group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LaunchedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_server(
    model: Path | str,
    name: str,
    args: Sequence[str],
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    omp_threads: int = 1,
) -> LaunchedServer:
    """An unstarted server on the CPU engine for a served benchmark: ``args`` with the
    CPU defaults added, the CPU-serving environment plus ``env``, ``omp_threads`` OpenMP
    threads (0: leave ``OMP_NUM_THREADS`` as it is; on a 2-core machine shared with other
    work, spinning OpenMP threads made decoding 10x slower), its log ``log_dir/<name>.log``."""
    from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults

    extra = dict(env or {})
    if omp_threads > 0:
        extra["OMP_NUM_THREADS"] = str(omp_threads)
    return LaunchedServer(str(model), with_cpu_defaults(list(args)),
                          env=cpu_serving_env(extra=extra), name=name,
                          log_path=Path(log_dir) / f"{name}.log")  # fmt: skip
