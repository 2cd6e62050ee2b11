"""scripts/setup_env.sh stops on a failed pip install (and still hides resolver noise).

Runs the script's own ``pipq`` function (cut out of the script) with ``python``
replaced by a shell function that plays pip: a failed install must end the script
with pip's status; the harmless resolver lines must not reach the output.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_env.sh"
NOISE = "ERROR: pip's dependency resolver does not currently take into account all the packages"


def _pipq_source() -> str:
    text = SCRIPT.read_text()
    match = re.search(r"^pipq\(\) \{\n.*?^\}\n", text, flags=re.S | re.M)
    assert match, "pipq() not found in scripts/setup_env.sh"
    assert "set -euo pipefail" in text
    return match.group(0)


def _run(pip_body: str) -> subprocess.CompletedProcess:
    script = (
        "set -euo pipefail\n"
        f"python() {{ {pip_body}; }}\n" + _pipq_source() + "pipq some-package\necho AFTER-PIP\n"
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_failed_install_stops_the_script_with_pips_status():
    out = _run('echo "ERROR: No matching distribution found for some-package" >&2; return 7')
    assert out.returncode == 7
    assert "AFTER-PIP" not in out.stdout
    assert "No matching distribution" in out.stdout + out.stderr
    assert "FAILED (exit 7): pip install some-package" in out.stderr


def test_resolver_noise_is_hidden_and_a_good_install_goes_on():
    out = _run(f'echo "{NOISE}"; echo "sglang 0.5.23 requires flashinfer, which is not installed."')
    assert out.returncode == 0, out.stderr
    assert "AFTER-PIP" in out.stdout
    assert "resolver" not in out.stdout and "requires" not in out.stdout


def test_a_silent_successful_install_goes_on():
    out = _run("return 0")
    assert out.returncode == 0 and "AFTER-PIP" in out.stdout
