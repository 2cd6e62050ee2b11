"""Metric computation of ``sglang-spec-ext bench`` from synthetic timestamps."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sglang_spec_ext.bench.metrics import (
    RequestResult,
    itl_samples,
    percentile,
    speedup,
    stats,
    summarize,
    weighted_accept_length,
)


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(0)
    for n in (1, 2, 5, 100):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None
    assert stats([]) == {"mean": None, "median": None, "p99": None}
    assert stats([1.0, 3.0], scale=1000) == {"mean": 2000.0, "median": 2000.0, "p99": 2980.0}


def test_ttft_tpot_itl_from_chunks() -> None:
    # sent at 10.0; chunks of 1, 3 and 2 tokens at 10.5, 10.8, 11.0
    r = RequestResult(ok=True, start=10.0, end=11.1, output_len=6,
                      chunk_times=[10.5, 10.8, 11.0], chunk_tokens=[1, 3, 2])  # fmt: skip
    assert r.ttft == pytest.approx(0.5)
    assert r.latency == pytest.approx(1.1)
    assert r.tpot == pytest.approx(0.5 / 5)
    itl = itl_samples(r.chunk_times, r.chunk_tokens)
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
    assert RequestResult(ok=True, chunk_times=[1.0], output_len=1).tpot is None


def test_summarize_throughput_latency_and_accept_length() -> None:
    results = [
        RequestResult(ok=True, start=0.0, end=2.0, input_len=10, output_len=20,
                      chunk_times=[0.5, 2.0], chunk_tokens=[1, 19], accept_length=2.0),
        RequestResult(ok=True, start=1.0, end=4.0, input_len=10, output_len=60,
                      chunk_times=[1.2, 4.0], chunk_tokens=[1, 59], accept_length=4.0),
        RequestResult(ok=False, start=1.0, end=1.5, error="HTTP 500: boom"),
    ]  # fmt: skip
    m = summarize(results, t_start=0.0)
    assert (m["completed"], m["failed"], m["errors"]) == (2, 1, ["HTTP 500: boom"])
    assert m["duration_s"] == pytest.approx(4.0)
    assert m["output_throughput"] == pytest.approx(80 / 4.0)
    assert m["total_throughput"] == pytest.approx(100 / 4.0)
    assert m["request_throughput"] == pytest.approx(0.5)
    assert m["e2e_latency_s"]["mean"] == pytest.approx(2.5)
    assert m["ttft_ms"]["median"] == pytest.approx(350.0)
    assert m["accept_length"] == pytest.approx((2 * 20 + 4 * 60) / 80)
    assert m["itl_ms"]["mean"] == pytest.approx((1.5 + 2.8) / 78 * 1000)


def test_accept_length_absent_and_speedup() -> None:
    assert weighted_accept_length([RequestResult(ok=True, output_len=5)]) is None
    assert summarize([], t_start=0.0)["output_throughput"] == 0.0
    assert speedup({"output_throughput": 10.0}, {"output_throughput": 25.0}) == 2.5
    assert speedup(None, {"output_throughput": 1.0}) is None
    assert speedup({"output_throughput": 0.0}, {"output_throughput": 1.0}) is None
