"""Launch SGLang's router (the ``sglang-router`` package) on a free loopback port, as a user
starts it (``python -m sglang_router.launch_router ...``), and stop it.

It runs in its own process group and logs to a file; it is ready when ``ready_path``
answers 200 (the Rust router's ``/readiness``: its workers registered and healthy; the
package's Python MiniLB has ``/health`` only).
"""

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


class LaunchedRouter:
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
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError("router exited: " + log.read_text(errors="replace")[-3000:])
            try:
                if requests.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("router not ready: " + log.read_text(errors="replace")[-3000:])

    def post(self, payload: dict[str, Any], timeout: float = 300) -> requests.Response:
        return requests.post(self.url + "/generate", json=payload, timeout=timeout)

    def generate(self, payload: dict[str, Any], timeout: float = 300) -> dict:
        r = self.post(payload, timeout)
        if r.status_code != 200:
            raise RuntimeError(f"router answered {r.status_code}: {r.text[:2000]}")
        return r.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._log.close()
