"""sglang_spec_ext/sglang/serving/metrics.py without a server: the no-op path when metrics are
off, the series and their values when on (a private prometheus registry), and the
per-request record."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sglang_spec_ext.config import PluginConfig
from sglang_spec_ext.sglang.serving import metrics as m

HOST_LABELS = {"model_name": "tiny", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
               "moe_ep_rank": 0}  # fmt: skip
L = {k: str(v) for k, v in HOST_LABELS.items()}


TOUCHED: list[str] = []


class Untouchable(dict):
    """Stats whose any read is recorded (and fails): proves the off path does no work."""

    def __getitem__(self, key):
        TOUCHED.append(str(key))
        raise AssertionError("read while metrics are off")

    get = items = __iter__ = keys = values = __getitem__

    def __getattr__(self, name):
        TOUCHED.append(name)
        raise AssertionError("read while metrics are off")


class Policy:
    tiers = [1, 4, 16]

    def tier_index(self, bs: int) -> int:
        return next((i for i, t in enumerate(self.tiers) if bs <= t), len(self.tiers) - 1)


class Controller:
    policy = Policy()


class Req:
    def __init__(self, finished: bool = False) -> None:
        self._finished = finished
        self.finished_output = False
        self.customized_info = None

    def finished(self) -> bool:
        return self._finished


@pytest.fixture
def off(monkeypatch):
    metrics = m.SpecExtMetrics()
    monkeypatch.setattr(m, "METRICS", metrics)
    return metrics


@pytest.fixture
def on(monkeypatch):
    metrics = m.SpecExtMetrics()
    registry = CollectorRegistry()
    metrics.enable(HOST_LABELS, registry=registry)
    monkeypatch.setattr(m, "METRICS", metrics)
    return registry


def test_metrics_off_is_a_no_op(off, monkeypatch):
    monkeypatch.setattr(m, "_FAILED", [])
    TOUCHED.clear()
    bad = Untouchable()
    m.publish_drafter(bad, bad)
    m.publish_hybrid(bad)
    m.publish_repairs(bad)
    m.on_adaptive_step("steps", bad, 3, 2)  # no requests: nothing per request either
    assert TOUCHED == [] and m._FAILED == []
    assert not off.enabled and off._series == {}


def test_reporter_hook_follows_the_hosts_decision(off):
    class Collector:
        labels = HOST_LABELS

    class Reporter:
        current_scheduler_metrics_enabled = False
        metrics_collector = Collector()

    m._after_reporter_init(None, Reporter())  # a rank that does not export
    assert not off.enabled
    Reporter.current_scheduler_metrics_enabled = True
    m._after_reporter_init(None, Reporter())
    assert off.enabled and off.labels == L
    assert set(off._series) == set(m.SERIES)


def test_drafter_series_equal_the_stats_line(on):
    config = PluginConfig()
    stats = {"sessions": 3, "cached_tokens": 120, "cached_requests": 4, "local_tokens": 50,
             "pending_tokens": 0, "memory_bytes": 4096, "draft_faults": 2,
             "draft_faults_by_stage": {"sync": 2}, "backend": "native"}  # fmt: skip
    m.publish_drafter(stats, config)
    get = on.get_sample_value
    assert get("sglang:spec_ext_drafter_sessions", L) == 3
    assert get("sglang:spec_ext_drafter_cached_tokens", L) == 120
    assert get("sglang:spec_ext_drafter_memory_bytes", L) == 4096
    assert get("sglang:spec_ext_drafter_cached_tokens_bound", L) == config.max_cached_tokens
    assert get("sglang:spec_ext_drafter_memory_bound_bytes", L) > 4096
    assert get("sglang:spec_ext_draft_faults_total", {**L, "stage": "sync"}) == 2
    # cumulative figures: the counter follows the line (increase by the difference)
    m.publish_drafter({**stats, "draft_faults_by_stage": {"sync": 5, "pack": 1}}, config)
    assert get("sglang:spec_ext_draft_faults_total", {**L, "stage": "sync"}) == 5
    assert get("sglang:spec_ext_draft_faults_total", {**L, "stage": "pack"}) == 1
    m.publish_drafter({**stats, "sessions": 0}, None)
    assert get("sglang:spec_ext_drafter_sessions", L) == 0
    assert get("sglang:spec_ext_draft_gate_steps_total", {**L, "decision": "plain"}) is None
    m.publish_drafter({**stats, "gate_steps_verified": 7, "gate_steps_plain": 3}, None)
    assert get("sglang:spec_ext_draft_gate_steps_total", {**L, "decision": "verify"}) == 7
    assert get("sglang:spec_ext_draft_gate_steps_total", {**L, "decision": "plain"}) == 3


def test_hybrid_and_repair_counters(on):
    # a source that has not won yet is exported at 0, not missing
    m.publish_hybrid({"by_source": {"model": {"steps": 0, "committed_tokens": 0}}})
    assert on.get_sample_value("sglang:spec_ext_hybrid_steps_total", {**L, "source": "model"}) == 0
    by_source = {"suffix": {"steps": 10, "committed_tokens": 31},
                 "model": {"steps": 4, "committed_tokens": 6}}  # fmt: skip
    m.publish_hybrid({"by_source": by_source, "choice_faults": 1})
    m.publish_hybrid({"by_source": by_source, "choice_faults": 1})  # same line again: no change
    get = on.get_sample_value
    assert get("sglang:spec_ext_hybrid_steps_total", {**L, "source": "suffix"}) == 10
    assert get("sglang:spec_ext_hybrid_committed_tokens_total", {**L, "source": "model"}) == 6
    assert get("sglang:spec_ext_hybrid_choice_faults_total", L) == 1

    class Repair:
        repairs, requests, tokens, deferred, truncated, failures = 2, 3, 40, 1, 0, 0
        unwritten_tokens = 7

    m.publish_repairs(Repair())
    assert get("sglang:spec_ext_draft_kv_repaired_tokens_total", L) == 40
    assert get("sglang:spec_ext_draft_kv_unwritten_tokens", L) == 7


def test_adaptive_decisions_per_tier_and_per_request(on):
    reqs = [Req(), Req()]
    m.on_adaptive_step("width", Controller(), 2, 5, reqs)
    m.on_adaptive_step("width", Controller(), 2, 5, reqs)
    m.on_adaptive_step("steps", Controller(), 9, 0)
    get = on.get_sample_value
    assert get("sglang:spec_ext_adaptive_decisions_total",
               {**L, "kind": "width", "tier": "4", "value": "5"}) == 2  # fmt: skip
    assert get("sglang:spec_ext_adaptive_decisions_total",
               {**L, "kind": "steps", "tier": "16", "value": "0"}) == 1  # fmt: skip
    assert getattr(reqs[0], m.REQ_ATTR).summary() == {"verify_widths": {"5": 2}}


def test_per_request_record_reaches_meta_info(off):
    done, running = Req(finished=True), Req()
    m.note_sources([done, running], ["suffix", "model"], [3, 1])
    m.note_sources([done], ["suffix"], [2])
    m.note_requests([done], "steps", 3)
    m._before_accept(None, req=running)
    assert running.customized_info is None  # only a finished request sends it
    m._before_accept(None, req=done)
    record = {"drafted_by": {"suffix": {"steps": 2, "committed_tokens": 5}},
              "draft_steps": {"3": 1}}  # fmt: skip
    assert done.customized_info == {m.META_KEY: [record]}
    assert m._request_level(lambda self, key: False, None, m.META_KEY)
    assert not m._request_level(lambda self, key: False, None, "other")
    meta = {m.META_KEY: [record], "spec_verify_ct": 1}
    m._after_meta_info(None, None, meta)
    assert meta[m.META_KEY] == record
    assert Req().customized_info is None and not hasattr(Req(), m.REQ_ATTR)


def test_a_failing_feed_never_reaches_the_decode_step(on, caplog, monkeypatch):
    monkeypatch.setattr(m, "_FAILED", [])
    m.publish_drafter({"sessions": "not a number", "draft_faults_by_stage": None}, object())
    m.note_sources([Req()], ["suffix", "model"], [1])  # mismatched lengths
    failed = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert any("publish_drafter failed" in f for f in failed)
    assert any("note_sources failed" in f for f in failed)
