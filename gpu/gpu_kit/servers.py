"""SGLang servers for the stages: what to start (:class:`ServerSpec`), one process group
per server with its log, readiness, a first request, and a pool that starts several at
once, keeps a server while a later stage still needs it and stops everything on the way out.

Readiness is ``GET /health`` with the host's health generation off
(``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``, set by the kit): in sglang 0.5.23
``/health`` otherwise runs a one-token generation (``srt/entrypoints/http_server.py``,
``health_generate``), so readiness meant "prefill, sampling and a finished request work",
and a server that died there (the second GPU run's radix insert) looked like one that
never started. Now ``/health`` answers 200 once the scheduler is up (model loaded, graphs
captured, HTTP serving: ``server_status`` is Up right away with ``--skip-server-warmup``),
and the pool's first request (``first_request``: prefill, decode or verify, a finished
request) is timed and recorded on its own, with its own time-out.

Every process group started is written to ``pids_file`` at once; :func:`kill_leftovers`
ends those still alive (servers run in their own sessions, which outlive the device
tool's command: a second call on a warm machine starts by ending the first's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

#: Readiness probe; cheap only with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0`` (the
#: kit sets it for every server; ``/ready`` would do the same without the switch).
HEALTH_PATH = "/health"


class ServerError(RuntimeError):
    """A server exited, did not answer ``/health`` in time, or failed its first request."""


@dataclass(frozen=True)
class ServerSpec:
    """One server: a label, launch_server arguments, extra environment, and whether the
    plugin must be importable (SUFFIX, HYBRID) or stays out (plain, NGRAM)."""

    label: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    plugin: bool = False

    def with_env(self, **env: str) -> ServerSpec:
        merged = dict(self.env) | env
        return ServerSpec(self.label, self.args, tuple(sorted(merged.items())), self.plugin)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A started server (``start`` returns once it is healthy)."""

    spec: ServerSpec
    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_s: float | None = None
    first_request_s: float | None = None
    pids_file: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*self.command, "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.started_at = time.monotonic()
            # Not the repository root: ``python -m`` puts the working directory first on
            # sys.path, so the travelling source tree (no compiled suffix core) shadowed
            # the plugin pip built, and the second GPU run's SUFFIX servers drafted with
            # the pure-Python drafter.
            self.proc = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.log_path.parent,
            )  # fmt: skip
        if self.pids_file is not None:
            with open(self.pids_file, "a") as f:
                f.write(f"{self.proc.pid} {self.spec.label}\n")

    def wait_ready(self, timeout_s: float) -> Server:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ServerError(f"{self.spec.label}: exited with code {code}\n{self.log_tail()}")
            try:
                if requests.get(self.url + HEALTH_PATH, timeout=5).status_code == 200:
                    self.ready_s = round(time.monotonic() - self.started_at, 1)
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(
            f"{self.spec.label}: not healthy after {timeout_s:.0f} s\n{self.log_tail()}"
        )

    def terminate(self) -> None:
        """SIGTERM to the server's process group (``stop`` waits and kills)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self, term_wait_s: float = 8.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # children share the group
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])[-5000:]


class Pool:
    """Servers by spec. ``get_many`` starts the missing ones concurrently (plugin-free
    ones first: ``before_plugin`` runs, e.g. waiting for the plugin build, before the
    others launch), waits for each to be ready, then sends each its first request
    (``first_request(server)``, all at once; one that fails is stopped and reported like
    a server that did not start); ``keep_only`` stops the servers no later stage needs;
    ``stop_all`` stops every server this pool ever launched."""

    def __init__(
        self,
        make: Callable[[ServerSpec], Server],
        ready_timeout_s: float,
        before_plugin: Callable[[], None] = lambda: None,
        first_request: Callable[[Server], None] | None = None,
    ) -> None:
        self.make = make
        self.ready_timeout_s = ready_timeout_s
        self.before_plugin = before_plugin
        self.first_request = first_request
        self.live: dict[ServerSpec, Server] = {}
        self.launched: list[Server] = []
        self.history: list[dict[str, Any]] = []

    def _bring_up(self, server: Server, timeout_s: float) -> Server:
        server.wait_ready(timeout_s)
        if self.first_request is not None:
            t0 = time.monotonic()
            try:
                self.first_request(server)
            except Exception as exc:  # noqa: BLE001 - the server's failure, with its log
                raise ServerError(f"{server.spec.label}: ready after {server.ready_s} s, "
                                  f"then its first request failed: {type(exc).__name__}: "
                                  f"{exc}\n{server.log_tail()}") from exc  # fmt: skip
            server.first_request_s = round(time.monotonic() - t0, 1)
        return server

    def get_many(
        self, specs: Sequence[ServerSpec], timeout_s: float | None = None
    ) -> dict[str, Server | Exception]:
        """label -> started server, or the exception that stopped it (others go on)."""
        out: dict[str, Server | Exception] = {}
        todo = [s for s in specs if s not in self.live]
        launched: list[Server] = []
        for plugin in (False, True):
            group = [s for s in todo if s.plugin == plugin]
            if plugin and group:
                self.before_plugin()
            for spec in group:
                server = self.make(spec)
                self.launched.append(server)  # before launch: stop_all reaches it
                server.launch()
                launched.append(server)
                self.live[spec] = server
        timeout = timeout_s or self.ready_timeout_s
        if launched:
            ex = ThreadPoolExecutor(len(launched))
            try:
                futures = {s.spec: ex.submit(self._bring_up, s, timeout) for s in launched}
                for fut in futures.values():
                    fut.exception()  # waits; the guard's TimeUp leaves the threads behind
            finally:
                ex.shutdown(wait=False, cancel_futures=True)
            for spec, fut in futures.items():
                server = self.live[spec]
                err = fut.exception()
                self.history.append(
                    {"label": spec.label, "args": list(spec.args), "env": dict(spec.env),
                     "ready_s": server.ready_s, "first_request_s": server.first_request_s,
                     "log": str(server.log_path),
                     "error": None if err is None else str(err)[:3000]}
                )  # fmt: skip
                if err is not None:
                    server.stop()
                    del self.live[spec]
        for spec in specs:
            live = self.live.get(spec)
            out[spec.label] = live if live is not None else self._error(spec)
        return out

    def _error(self, spec: ServerSpec) -> Exception:
        for row in reversed(self.history):
            if row["label"] == spec.label and row["error"]:
                return ServerError(row["error"])
        return ServerError(f"{spec.label}: not started")

    def keep_only(self, specs: Iterable[ServerSpec]) -> None:
        """Stops every live server not in ``specs``: SIGTERM to all, then SIGKILL to the
        process groups still there after a few seconds."""
        keep = set(specs)
        going = [self.live.pop(s) for s in list(self.live) if s not in keep]
        _stop(going)

    def stop_all(self, term_wait_s: float = 8.0) -> None:
        """Every server launched (live, failed, or cut by the guard while starting)."""
        self.live.clear()
        _stop(self.launched, term_wait_s)

    def tails(self, lines: int = 25) -> dict[str, str]:
        return {s.label: srv.log_tail(lines) for s, srv in self.live.items()}


def _stop(servers: list[Server], term_wait_s: float = 8.0) -> None:
    for server in servers:
        server.terminate()
    deadline = time.monotonic() + term_wait_s
    for server in servers:
        server.stop(max(0.1, deadline - time.monotonic()))


def kill_leftovers(pids_file: Path) -> list[str]:
    """SIGKILL to the process groups listed in ``pids_file`` that are still alive and
    still a server of this kit (the command line names ``--port``); the file is then
    emptied. Returns the labels ended."""
    if not pids_file.is_file():
        return []
    ended = []
    for line in pids_file.read_text().splitlines():
        pid_text, _, label = line.partition(" ")
        try:
            pid = int(pid_text)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (ValueError, OSError):
            continue
        if b"--port" not in cmdline:
            continue  # the pid was reused by something else
        try:
            os.killpg(pid, signal.SIGKILL)
            ended.append(label)
        except (ProcessLookupError, PermissionError):
            pass
    pids_file.write_text("")
    return ended
