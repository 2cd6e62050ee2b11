"""A short soak of SUFFIX on the GDN hybrid (tiny Qwen3-Next) on the CPU engine.

The soak harness (``benchmarks/soak.py``, as ``test_soak.py`` runs it for the Llama test
model) against a plain server of the same model: a seeded mixed load at concurrency 8
(greedy and sampled, prompts at the context limit, ``max_new_tokens`` 1, stop tokens,
``n`` = 2, logprobs, structured output, streamed clients that disconnect mid-way, invalid
and guarded requests, tenants, external-corpus operations). The server must stay up (the
host's idle memory check ends it on a leaked KV slot or Mamba state), answer every valid
request and refuse every invalid one, and give the plain server's greedy output, also when
re-sent after the aborts: the GDN states of aborted and finished requests never leak into
the next request's. Eager (overlap and the graph emulation are refused for this model on
CPU: ``test_model_families.py`` checks the refusal).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from sglang_spec_ext.models.testing.families import FAMILIES

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_gdn_hybrid_soak(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("soak_script", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = FAMILIES["qwen3_next"][0](tmp_path / "qwen3_next")
    out = tmp_path / "soak.json"
    code = module.main([
        "--model", str(model), "--requests", "40", "--max-running-requests", "8",
        "--width", "8", "--algorithms", "SUFFIX", "--deadline-s", "900",
        "--out", str(out), "--log-dir", str(tmp_path),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + printed[-3000:])
    record = json.loads(out.read_text())
    run = record["runs"]["SUFFIX"]
    assert code == 0, run["failures"][:10]
    assert run["server_alive"] and not run["fatal_log_lines"]
    assert run["parity_checked"] >= 10 and run["parity_mismatches"] == 0
    assert run["post_abort_checked"] > 0 and run["post_abort_mismatches"] == 0
    kinds = run["per_kind"]
    assert kinds["near_limit"]["ok"] == kinds["near_limit"]["sent"] > 0
    assert kinds["disconnect"].get("disconnected", 0) > 0
    assert kinds["invalid"].get("refused", 0) == kinds["invalid"]["sent"] > 0
    log = Path(run["log"]).read_text(errors="replace")
    assert "verify padded: linear-attention layers" in log
