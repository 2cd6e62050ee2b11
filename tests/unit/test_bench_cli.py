"""``sglang-spec-ext bench`` end to end against fake servers on loopback: client
parsing, the CLI's table/JSON/PNG, parity failure detection and Ctrl-C safety."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_spec_ext.bench import client
from sglang_spec_ext.bench.workload import Load, Request
from sglang_spec_ext.cli import main
from tests.unit.test_bench_fake_server import FakeServer, fake_output

REPO = Path(__file__).resolve().parents[2]


def test_native_stream_counts_chunks_and_ids() -> None:
    with FakeServer(chunk=3) as srv:
        reqs = [Request(7, prompt_ids=(1, 2, 3)), Request(4, prompt_ids=(5,))]
        results, t0 = asyncio.run(client.run_cell(srv.url, reqs, Load("concurrency", 2)))
    r = results[0]
    assert r.ok and r.output_len == 7 and r.input_len == 3
    assert r.chunk_tokens == [1, 3, 3] and len(r.chunk_times) == 3
    assert r.output_ids == fake_output([1, 2, 3], 7)
    assert r.accept_length == pytest.approx(7 / 3) and r.verify_ct == 3
    assert all(x.start >= t0 for x in results)
    assert srv.requests[0]["sampling_params"]["ignore_eos"] is True


def test_no_stream_has_no_chunk_timing() -> None:
    with FakeServer(chunk=2) as srv:
        reqs = [Request(5, prompt_ids=(9, 9))]
        (r,), _ = asyncio.run(client.run_cell(srv.url, reqs, Load("rate", 1.0), stream=False))
    assert r.ok and r.output_len == 5 and r.output_ids == fake_output([9, 9], 5)
    assert r.ttft is None and r.tpot is None and r.latency > 0
    assert r.accept_length == pytest.approx(5 / 3)


def test_openai_api_and_poisson_rate() -> None:
    with FakeServer() as srv:
        model = asyncio.run(client.fetch_model_id(srv.url))
        reqs = [Request(5, prompt_ids=(1, 2)) for _ in range(3)]
        results, _ = asyncio.run(
            client.run_cell(srv.url, reqs, Load("rate", 50.0), api="openai", model=model)
        )
    assert model == "fake-model" and srv.requests[0]["model"] == "fake-model"
    assert all(r.ok and r.output_len == 5 and sum(r.chunk_tokens) == 5 for r in results)
    assert all(r.accept_length is None for r in results)


def test_failed_request_is_recorded() -> None:
    reqs = [Request(3, prompt_ids=(1,))]
    results, _ = asyncio.run(client.run_cell("http://127.0.0.1:9", reqs, Load("rate", 1e9)))
    assert not results[0].ok and results[0].error


def _bench(*args: str) -> list[str]:
    return ["bench", "--vocab-size", "50", "--scenario", "s:8:6", "--num-prompts", "3",
            "--no-progress", "--warmup", "1", *args]  # fmt: skip


def test_bench_cli_table_json_png(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with FakeServer(chunk=1) as base, FakeServer(chunk=3) as spec:
        rc = main(_bench("--baseline-url", base.url, "--spec-url", spec.url, "--rates", "20,inf",
                         "--concurrency", "2", "--check-parity", "--out", str(tmp_path)))  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert rc == 0
    assert out[0].startswith("bench (complete)") and out[-1].startswith("tok/s =")
    assert [ln.split()[1] for ln in out[3:6]] == ["rate=20", "rate=inf", "conc=2"]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "complete" and doc["parity"]["ok"]
    # the fake servers have no /server_info: the run says bit-identity went unchecked
    assert [c.split(":")[0] for c in doc["parity"]["caveats"]] == ["baseline", "speculative"]
    assert "cannot be expected to be bit-identical" in captured.err
    assert doc["machine"]["python"] and doc["parameters"]["num_prompts"] == 3
    cell = doc["cells"][0]
    assert cell["baseline"]["completed"] == 3 and cell["speculative"]["output_tokens"] == 18
    assert cell["speculative"]["accept_length"] == pytest.approx(2.0)  # 6 tokens / 3 steps
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_parity_detects_altered_tokens(capsys: pytest.CaptureFixture) -> None:
    with FakeServer() as base, FakeServer(alter_at=4) as spec:
        rc = main(_bench("--baseline-url", base.url, "--spec-url", spec.url, "--parity-only"))
    err = capsys.readouterr().err
    assert rc == 1
    assert "parity: FAILED, 4 of 4" in err and "first difference at output token 4" in err


def test_usage_errors(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--scenario", "s:8:6"]) == 2
    assert main(_bench("--spec-url", "http://127.0.0.1:9", "--check-parity")) == 2
    assert main(_bench("--baseline-url", "http://x", "--scenario", "bad:1")) == 2
    assert "error:" in capsys.readouterr().err


def test_ctrl_c_saves_partial_results_and_exits_130(tmp_path: Path) -> None:
    # Deterministic: the server answers exactly the requests of the first cell (counted
    # on a one-cell run) and holds every later one, so the run is still going, with one
    # cell saved, whenever the signal comes.
    args = ("--concurrency", "1")  # with _bench's one scenario: one cell
    with FakeServer() as probe:
        assert main(_bench("--baseline-url", probe.url, *args)) == 0
        first_cell = len(probe.requests)
    assert first_cell == 4  # one warm-up and three prompts
    with FakeServer(hold_after=first_cell) as srv:
        cmd = [sys.executable, "-m", "sglang_spec_ext.cli", *_bench(
            "--baseline-url", srv.url, *args, "--rates", "inf,1,2", "--out", str(tmp_path))]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        results = tmp_path / "results.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the first cell is saved
            if results.exists() and json.loads(results.read_text())["cells"]:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended although the server held its requests"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    doc = json.loads(results.read_text())
    assert doc["status"] == "interrupted" and len(doc["cells"]) == 1
    assert b"bench (interrupted)" in out
