"""TEST HARNESS: SGLang's router (the ``sglang-router`` package) in front of test servers,
started as a user starts it: ``python -m sglang_router.launch_router ...``.

:func:`replica_router_args` gives the arguments for replicas behind one policy,
:func:`pd_router_args` those for a prefill-decode pair (the Rust PD router, or the
package's Python ``--mini-lb``, which forwards each request body as sent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from sglang_spec_ext.bench.servers import free_port

#: The host's /health runs a one-token generation: on the CPU engine, under load, that can
#: take longer than the router's default health-check timeout.
ROUTER_CPU_ARGS = ("--health-check-timeout-secs", "60", "--health-check-interval-secs", "30")


def replica_router_args(workers: Sequence[str], policy: str) -> list[str]:
    """Replicas behind one policy (cache_aware, round_robin, ...)."""
    return ["--policy", policy, "--worker-urls", *workers, *ROUTER_CPU_ARGS]


def pd_router_args(prefill: str, bootstrap_port: int, decode: str, mini_lb: bool = False
                   ) -> list[str]:  # fmt: skip
    """A prefill server (with its KV bootstrap port) and a decode server."""
    args = ["--pd-disaggregation", "--prefill", prefill, str(bootstrap_port), "--decode", decode]
    if mini_lb:
        return [*args, "--mini-lb"]
    return [*args, "--policy", "round_robin", *ROUTER_CPU_ARGS]


class Router:
    """``python -m sglang_router.launch_router <args>`` on a free loopback port, ready when
    ``ready_path`` answers 200 (the Rust router's ``/readiness``: its workers registered
    and healthy; the MiniLB has ``/health`` only)."""

    def __init__(self, args: Sequence[str], log: Path, ready_path: str = "/readiness",
                 timeout: float = 240.0) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "warn", *args]  # fmt: skip
        if "--mini-lb" in args:
            cmd.remove("--log-level")
            cmd.remove("warn")
        else:  # its metrics exporter's default port would be taken by a second router
            cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        self.log = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if requests.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError("router not ready: " + log.read_text(errors="replace")[-3000:])

    def post(self, payload: dict[str, Any], timeout: float = 300) -> requests.Response:
        return requests.post(self.url + "/generate", json=payload, timeout=timeout)

    def generate(self, payload: dict[str, Any], timeout: float = 300) -> dict:
        r = self.post(payload, timeout)
        assert r.status_code == 200, r.text[:2000]
        return r.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
