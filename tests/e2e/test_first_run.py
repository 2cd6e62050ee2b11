"""A newcomer's first run (README's first command, ``bash scripts/demo.sh``): no traceback,
a clone left clean, help that says what the tool does, and SGLang's own serving benchmark
runnable on this machine.

The demo's steps run as the README's command runs them (set-up, doctor, two real CPU
servers, baseline then SUFFIX) on the tiny test model and two short requests, so the suite
stays quick; the SmolLM2 demo itself is the same script with its defaults."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _git_status() -> list[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(out.stdout.splitlines())


def test_help_names_the_algorithms_the_tools_and_the_docs(capsys):
    from sglang_spec_ext.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("SUFFIX", "HYBRID", "MTP", "ragged verify", "per-request", "grammar"):
        assert word in out, word
    for cmd in ("doctor", "simulate", "bench", "tune", "serve-cpu", "cpu-env"):
        assert cmd in out, cmd
    assert "docs/" in out


def test_the_hosts_serving_benchmark_runs_on_this_machine():
    """``python -m sglang.benchmark.serving`` imports ``datasets`` and the host's model
    configs (``torchvision``): the set-up installs the first, ``cpu-env`` supplies the
    second's placeholder."""
    exe = shutil.which("sglang-spec-ext", path=os.path.dirname(sys.executable))
    assert exe, "the console script is installed beside this interpreter"
    res = subprocess.run(
        [exe, "cpu-env", "--", "python", "-m", "sglang.benchmark.serving", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "--dataset-name" in res.stdout


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_demo_prints_no_traceback_and_leaves_the_clone_clean(tiny_model_dir):
    before = _git_status()
    # a user's shell: none of the harness's server settings (the demo sets what it needs;
    # no placeholder modules on the path, so doctor meets the host as a user's doctor does)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG")}
    env.pop("PYTHONPATH", None)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    res = subprocess.run(
        [
            "bash",
            "scripts/demo.sh",
            "--model-dir",
            str(tiny_model_dir),
            "--cases",
            "2",
            "--max-new-tokens",
            "12",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "doctor: all checks passed" in out
    assert "greedy outputs identical: True" in out
    assert "Traceback" not in out, out[-5000:]
    doctor_lines = out[: out.index("doctor: all checks passed")].splitlines()
    doctor_lines = doctor_lines[
        next(i for i, x in enumerate(doctor_lines) if x.startswith("sglang-spec-ext ")) :
    ]
    assert len(doctor_lines) < 40, "\n".join(doctor_lines)
    assert _git_status() == before
