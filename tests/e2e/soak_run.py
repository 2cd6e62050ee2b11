"""The soak harness (``benchmarks/soak.py``) as the e2e soaks run it, and the checks every
soak shares: the server alive with no fatal log line, every valid request answered and
every invalid one refused, the plain server's greedy output (also re-sent after aborts),
prompts at the context limit served, clients that disconnect mid-stream seen."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def run_soak(tmp_path: Path, capsys: Any, argv: list[str], *, min_parity: int,
             algorithm: str = "SUFFIX") -> tuple[dict, dict]:  # fmt: skip
    """Run the harness with ``argv`` (``--out`` and ``--log-dir`` added), print its last
    lines, check what every soak shares; returns ``(run, record)`` for ``algorithm``."""
    spec = importlib.util.spec_from_file_location("soak_script", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "soak.json"
    code = module.main([*argv, "--out", str(out), "--log-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + printed[-4000:])
    record = json.loads(out.read_text())
    run = record["runs"][algorithm]
    assert code == 0, run["failures"][:10]
    assert run["server_alive"] and not run["fatal_log_lines"]
    assert run["parity_checked"] >= min_parity and run["parity_mismatches"] == 0
    assert run["post_abort_checked"] > 0 and run["post_abort_mismatches"] == 0
    kinds = run["per_kind"]
    assert kinds["near_limit"]["ok"] == kinds["near_limit"]["sent"] > 0
    assert kinds["invalid"].get("refused", 0) == kinds["invalid"]["sent"] > 0
    assert kinds["disconnect"].get("disconnected", 0) > 0
    return run, record
