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


#: The line a snippet prints its result on: ``print("RESULT " + json.dumps(res))``.
RESULT_MARK = "RESULT "


def snippet_result(
    code: str, env: dict[str, str] | None = None, cpu_engine: bool = False
) -> object:
    """Run ``code`` (see :func:`run_snippet`) and return the JSON of its last ``RESULT``
    line; fails with the snippet's output when it exits non-zero or prints none."""
    import json

    out = run_snippet(code, env=env, cpu_engine=cpu_engine)
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-5000:]
    return json.loads(lines[-1][len(RESULT_MARK) :])
