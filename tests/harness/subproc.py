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


def interpreted_result(module: str, function: str, *args: object) -> object:
    """``module.function(*args)`` (JSON-able args and result) in a fresh interpreter with
    Triton's CPU interpreter on (``TRITON_INTERPRET=1``, set before any kernel is defined)
    and the repository on the path: how tests run the host's Triton kernels on CPU."""
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import json, os\n"
        'os.environ["TRITON_INTERPRET"] = "1"\n'
        f"from {module} import {function}\n"
        f"print({RESULT_MARK!r} + json.dumps({function}(*{list(args)!r})))\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    assert proc.returncode == 0 and lines, (
        f"subprocess failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len(RESULT_MARK) :])
