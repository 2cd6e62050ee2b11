"""SGLang servers for the stages: what to start (:class:`ServerSpec`), one process group
per server with its log, readiness on ``/health``, and a pool that starts several at once,
keeps a server while a later stage still needs it and stops everything on the way out."""

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


class ServerError(RuntimeError):
    """A server exited or did not answer ``/health`` in time."""


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

    def wait_ready(self, timeout_s: float) -> Server:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ServerError(f"{self.spec.label}: exited with code {code}\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
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
    others launch); ``keep_only`` stops the servers no later stage needs."""

    def __init__(
        self,
        make: Callable[[ServerSpec], Server],
        ready_timeout_s: float,
        before_plugin: Callable[[], None] = lambda: None,
    ) -> None:
        self.make = make
        self.ready_timeout_s = ready_timeout_s
        self.before_plugin = before_plugin
        self.live: dict[ServerSpec, Server] = {}
        self.history: list[dict[str, Any]] = []

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
                server.launch()
                launched.append(server)
                self.live[spec] = server
        timeout = timeout_s or self.ready_timeout_s
        if launched:
            ex = ThreadPoolExecutor(len(launched))
            try:
                futures = {s.spec: ex.submit(s.wait_ready, timeout) for s in launched}
                for fut in futures.values():
                    fut.exception()  # waits; the guard's TimeUp leaves the threads behind
            finally:
                ex.shutdown(wait=False, cancel_futures=True)
            for spec, fut in futures.items():
                server = self.live[spec]
                err = fut.exception()
                self.history.append(
                    {"label": spec.label, "args": list(spec.args), "env": dict(spec.env),
                     "ready_s": server.ready_s, "log": str(server.log_path),
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
        for server in going:
            server.terminate()
        deadline = time.monotonic() + 8.0
        for server in going:
            server.stop(max(0.1, deadline - time.monotonic()))

    def stop_all(self) -> None:
        self.keep_only(())

    def tails(self, lines: int = 25) -> dict[str, str]:
        return {s.label: srv.log_tail(lines) for s, srv in self.live.items()}
