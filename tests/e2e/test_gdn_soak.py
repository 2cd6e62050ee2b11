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

from pathlib import Path

from sglang_spec_ext.models.testing.families import FAMILIES
from tests.e2e.soak_run import run_soak


def test_gdn_hybrid_soak(tmp_path, capsys):
    model = FAMILIES["qwen3_next"][0](tmp_path / "qwen3_next")
    run, _record = run_soak(tmp_path, capsys, [
        "--model", str(model), "--requests", "40", "--max-running-requests", "8",
        "--width", "8", "--algorithms", "SUFFIX", "--deadline-s", "900",
    ], min_parity=10)  # fmt: skip
    log = Path(run["log"]).read_text(errors="replace")
    assert "verify padded: linear-attention layers" in log
