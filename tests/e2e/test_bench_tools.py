"""``sglang-spec-ext bench`` against the real SGLang server on CPU (tiny random-weight
Llama, very small sizes, one module-scoped pair of servers): the baseline-vs-SUFFIX
table, JSON and PNG, greedy parity, and its detection of an injected difference.
(Servers launched by ``bench``/``tune`` themselves are tested with a stand-in
``sglang.launch_server`` in tests/unit/test_bench_launch.py; the recorded CPU run in
benchmarks/results/bench_cpu/ launches the real ones.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sglang_spec_ext.cli import main
from tests.unit.test_bench_fake_server import FakeServer

SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", "8")


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tiny_baseline_server, start_module_server):
    """Baseline (the session's plain server: no state a bench run could disturb) and
    SUFFIX servers."""
    spec = start_module_server(tiny_model_dir, *SUFFIX_ARGS, max_total_tokens=4096)
    return tiny_baseline_server, spec


def test_bench_baseline_vs_suffix(servers, tmp_path: Path, capsys) -> None:
    base, spec = servers
    t0 = time.monotonic()
    rc = main(["bench", "--baseline-url", base.base_url, "--spec-url", spec.base_url,
               "--scenario", "summarization", "--scenario", "generation", "--scale", "0.02",
               "--rates", "4,inf", "--num-prompts", "4", "--check-parity",
               "--out", str(tmp_path), "--label", "e2e test", "--no-progress"])  # fmt: skip
    cap = capsys.readouterr()
    print(cap.out, f"\n({time.monotonic() - t0:.0f}s)")
    assert rc == 0, cap.err
    assert "parity: OK, 4 greedy prompts" in cap.err
    lines = cap.out.strip().splitlines()
    assert lines[0] == "bench (complete): e2e test" and lines[-1].startswith("tok/s =")
    assert [ln.split()[:2] for ln in lines[3:7]] == [
        ["summarization", "rate=4"], ["summarization", "rate=inf"],
        ["generation", "rate=4"], ["generation", "rate=inf"],
    ]  # fmt: skip
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "complete" and doc["parity"]["ok"]
    # fp32 on the CPU engine: bit-identity is expected, so no caveat is printed
    assert doc["endpoints"]["speculative"]["parity_fields"]["dtype"] == "float32"
    assert doc["parity"]["caveats"] == [] and "cannot be expected" not in cap.err
    assert doc["machine"]["cpu_count"] and doc["versions"]["sglang"]
    for cell in doc["cells"]:
        b, s = cell["baseline"], cell["speculative"]
        assert b["completed"] == s["completed"] == 4 and not b["failed"] and not s["failed"]
        # exact lengths through input_ids + ignore_eos
        assert b["mean_input_len"] == s["mean_input_len"] == cell["input_len"]
        assert b["output_tokens"] == s["output_tokens"] == 4 * cell["output_len"]
        assert b["accept_length"] is None and s["accept_length"] >= 1.0
        assert s["ttft_ms"]["median"] > 0 and cell["speedup"] > 0
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_parity_detects_injected_difference(servers, capsys) -> None:
    base, spec = servers
    # a proxy in front of the SUFFIX server that changes output token 3
    with FakeServer(upstream=spec.base_url, alter_at=3) as proxy:
        rc = main(["bench", "--baseline-url", base.base_url, "--spec-url", proxy.url,
                   "--scenario", "p:24:8", "--parity-only", "--parity-prompts", "2",
                   "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert "parity: FAILED, 2 of 2" in err and "first difference at output token 3" in err
