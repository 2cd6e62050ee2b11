"""Memory bounds of the suffix drafter: the global bound holds over a long run,
memory stays flat once it is reached, per-request trees keep a window, and
the configured worst case is computed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter, native_available
from sglang_spec_ext.suffix.memory import estimate_bytes, worst_bytes_per_token

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "drafter_memory", ROOT / "benchmarks/drafter_memory.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not native_available(), reason="native backend not built")
def test_global_bound_holds_and_memory_is_flat_after_reaching_it():
    res = _bench().drive(tokens=50_000, bound=10_000, live=8, samples=50, backend="native")
    rows = res["samples"]
    assert all(r["cached_tokens"] <= 10_000 for r in rows)
    full = [r for r in rows if r["cached_tokens"] >= 9_000]
    assert len(full) >= 20  # the bound is reached early
    # No growth once full: the later half never exceeds the earlier half's peak
    # (memory also holds the live requests' own trees, which come and go).
    mem = [r["memory_bytes"] for r in full]
    half = len(mem) // 2
    assert max(mem[half:]) <= 1.3 * max(mem[:half]), mem
    # ... and within the worst case: bound + 8 live requests of < 3000 tokens each.
    assert max(mem) <= worst_bytes_per_token() * (10_000 + 100 + 8 * 3000)
    assert all(r["pinned_tokens"] <= 10_000 for r in rows)


@pytest.mark.parametrize("backend", ["python"] + (["native"] if native_available() else []))
def test_request_tree_keeps_a_window_of_recent_tokens(backend):
    d = SuffixDrafter(
        SuffixConfig(max_depth=4, max_request_tokens=20, max_cached_requests=0), backend
    )
    d.start_request("a", list(range(100, 150)))  # 50 prompt tokens: the last 20 are kept
    assert d.stats()["local_tokens"] == 20
    d.extend_request("a", [1, 2, 3])
    assert d.stats()["local_tokens"] == 20
    d.extend_request("a", [100, 101])  # 100 101 left the window: no draft from it
    assert d.speculate("a", 4).tokens == []
    d.extend_request("a", [140, 141])  # 140 141 are still inside
    assert d.speculate("a", 4).tokens[:2] == [142, 143]


@pytest.mark.parametrize("backend", ["python"] + (["native"] if native_available() else []))
def test_long_prompt_is_inserted_over_steps_and_capped_in_the_global_tree(backend):
    cfg = SuffixConfig(
        max_depth=8, max_cached_tokens=1000, step_insert_tokens=100, global_prompt_cap=65536
    )
    d = SuffixDrafter(cfg, backend)
    d.start_request("old", [5, 6, 7])
    d.start_request("long", list(range(3000)))
    steps = 0
    while d.stats()["pending_tokens"]:
        d.speculate_batch(["old", "long"], 4)
        steps += 1
    s = d.stats()
    # 3000 into its own tree, 500 (= 1000 // 2) into the global tree, 100 per
    # step: start used the 94 the step had left, the first call ends that step.
    assert steps == 1 + 35 and s["local_tokens"] == 3003
    assert s["cached_tokens"] == 503 and s["cached_requests"] == 2  # "old" not evicted
    assert d.speculate("long", 4).tokens == []  # no repeat in range(3000)


def test_estimate_bytes_scales_with_the_bounds():
    per_token = worst_bytes_per_token()
    assert 100 < per_token < 1000
    cfg = SuffixConfig(max_cached_tokens=1_000_000, max_request_tokens=1000, step_insert_tokens=1)
    est = estimate_bytes(cfg, max_running_requests=10)
    assert est.global_tree == 1_000_001 * per_token
    assert est.total == est.global_tree + 10 * 1000 * per_token
    assert "per TP rank" in est.describe()
    assert estimate_bytes(SuffixConfig(max_cached_requests=0), 0).total == 0
    with pytest.raises(ValueError):
        estimate_bytes(cfg, -1)
    with pytest.raises(ValueError, match="max_request_tokens"):
        SuffixConfig(max_depth=64, max_request_tokens=10)
    with pytest.raises(ValueError, match="max_cached_tokens"):
        SuffixConfig(max_cached_tokens=1 << 30)
