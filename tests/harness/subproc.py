"""TEST HARNESS: run a Python snippet in a fresh interpreter against the host.

The host's ``load_plugins()`` runs once per process, so plugin discovery and
``SGLANG_PLUGINS`` filtering are tested in clean subprocesses.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.harness.server import cpu_server_env


def run_snippet(
    code: str, env: dict[str, str] | None = None, timeout: float = 180.0, cpu_engine: bool = False
) -> subprocess.CompletedProcess:
    base = cpu_server_env(env)
    if not cpu_engine:
        base.pop("SGLANG_USE_CPU_ENGINE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
