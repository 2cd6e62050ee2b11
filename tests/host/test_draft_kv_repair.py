"""The draft-KV repair's bookkeeping (sglang/model_drafts/kv_repair.py, kv_repair_marks.py,
kv_repair_forward.py) without a model: which
positions a request recomputes, when a skipped step marks it, and that a failing repair
switches itself off instead of failing the decode step. The batches and requests are
stand-ins with the fields the hooks read (the real ScheduleBatch of a decode step needs
model runners); the real repair forward runs in tests/e2e/test_model_draft_adaptive_serving.py
(HYBRID's server) and benchmarks/cold_recovery_smollm2.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.model_drafts import adaptive as mda
from sglang_spec_ext.sglang.model_drafts import kv_repair as dkr
from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as rebuild
from sglang_spec_ext.sglang.model_drafts import kv_repair_marks as marks
from sglang_spec_ext.sglang.model_drafts import step_policy
from tests.host.test_model_draft_adaptive import StandInWorker


@pytest.fixture(autouse=True)
def fresh_stats(monkeypatch):
    monkeypatch.setattr(marks, "STATS", marks.RepairStats())


def _req(prompt: int, output: int):
    return SimpleNamespace(origin_input_ids=list(range(prompt)), output_ids=list(range(output)))


def _batch(reqs, seq_lens, cpu_lens=True):
    mode = SimpleNamespace(is_idle=lambda: False)
    lens = torch.tensor(seq_lens)
    return SimpleNamespace(
        reqs=reqs, seq_lens=lens, seq_lens_cpu=lens if cpu_lens else None, forward_mode=mode
    )


def test_rows_cover_the_unwritten_positions_within_the_budget():
    # marked at 40 with 50 positions: 40..49; unmarked: its last position only
    assert marks.plan_rows([40, None], [50, 30], [51, 31], 8192) == (
        [40, 29],
        [10, 1],
        [True, False],
    )
    # two marked requests share a budget of 8: the last 4 positions each, marks cleared
    assert marks.plan_rows([10, 0], [50, 20], [51, 21], 8) == ([46, 16], [4, 4], [True, True])
    # committed tokens not seen yet (overlap): last position only, the mark stays
    assert marks.plan_rows([10], [50], [49], 8192) == ([49], [1], [False])
    # a mark at or past the last position still recomputes that one
    assert marks.plan_rows([60], [50], [51], 8192) == ([49], [1], [True])


def test_token_slices_cross_from_prompt_into_output():
    req = SimpleNamespace(origin_input_ids=[10, 11, 12], output_ids=[20, 21])
    assert marks.known_len(req) == 5
    assert marks.token_slice(req, 1, 4) == [11, 12, 20]
    assert marks.token_slice(req, 3, 5) == [20, 21] and marks.token_slice(req, 0, 2) == [10, 11]
    assert marks.token_slice(req, 2, 3) == [12] and marks.token_slice(req, 4, 4) == []


def test_a_skipped_step_marks_each_request_once_never_late(monkeypatch):
    a, b = _req(30, 10), _req(5, 2)  # 40 and 7 tokens known to the scheduler
    worker = SimpleNamespace()  # the hook reads nothing of the worker
    dkr._mark_skipped(None, worker, _batch([a, b], [39, 6]))
    assert (getattr(a, marks.STALE_ATTR), getattr(b, marks.STALE_ATTR)) == (39, 6)
    a.output_ids.append(0)
    dkr._mark_skipped(None, worker, _batch([a, b], [40, 7]))
    assert getattr(a, marks.STALE_ATTR) == 39  # the first unwritten position stays
    # without CPU lengths (overlap), the mark backs off by one step's worth of tokens
    monkeypatch.setattr(dkr, "max_steps", lambda: 3)  # --speculative-num-steps 3
    c = _req(30, 10)
    dkr._mark_skipped(None, worker, _batch([c], [41], cpu_lens=False))
    assert getattr(c, marks.STALE_ATTR) == 39 - 4
    assert marks.STATS.marked_steps == 3


def test_skipped_steps_count_what_the_next_repair_rebuilds():
    """The gauge the controller prices a probe up with: the tokens of the last skipped
    step's requests from their marks on (capped at the per-forward budget), none once a
    repair ran."""
    a, b = _req(30, 10), _req(5, 2)
    dkr._mark_skipped(None, None, _batch([a, b], [39, 6]))  # marks 39 and 6
    assert (marks.STATS.unwritten_tokens, marks.STATS.unwritten_requests) == (1 + 1, 2)
    a.output_ids.extend([0] * 20)
    b.output_ids.extend([0] * 20)
    dkr._mark_skipped(None, None, _batch([a], [59]))  # b finished: only a counts
    assert (marks.STATS.unwritten_tokens, marks.STATS.unwritten_requests) == (21, 1)
    marks.STATS.max_tokens = 16
    dkr._mark_skipped(None, None, _batch([a, b], [59, 26]))
    assert marks.STATS.unwritten_tokens == 16  # one forward rebuilds at most that many
    # a drafting step of requests without marks (those finished): nothing left
    standalone = SimpleNamespace(speculative_algorithm=SimpleNamespace(is_standalone=lambda: True))
    dkr._repair_before_draft(standalone, _batch([_req(4, 4)], [8]))
    assert (marks.STATS.unwritten_tokens, marks.STATS.unwritten_requests) == (0, 0)


@pytest.mark.parametrize("stage", ["prepare", "forward"])
def test_a_failing_repair_is_logged_and_switches_off(monkeypatch, caplog, stage):
    def boom(*_a):
        raise RuntimeError("no extend metadata")

    if stage == "prepare":
        monkeypatch.setattr(rebuild, "prepare_repair", boom)
    else:
        monkeypatch.setattr(rebuild, "prepare_repair", lambda *_a: boom)
    draft_worker = SimpleNamespace(
        speculative_algorithm=SimpleNamespace(is_standalone=lambda: True)
    )
    req = _req(8, 4)
    setattr(req, marks.STALE_ATTR, 5)
    batch = _batch([req], [11])
    with caplog.at_level(logging.ERROR, logger="sglang_spec_ext"):
        assert dkr._repair_before_draft(draft_worker, batch) is None  # the step goes on
    assert "draft-KV repair failed; switched off" in caplog.text
    assert (marks.STATS.failures, marks.STATS.enabled) == (1, False)
    monkeypatch.setattr(
        rebuild, "prepare_repair", lambda *_a: pytest.fail("ran while switched off")
    )
    dkr._repair_before_draft(draft_worker, batch)


def test_an_eagle_draft_is_not_repaired_and_attach_refuses_it(monkeypatch):
    eagle = SimpleNamespace(speculative_algorithm=SimpleNamespace(is_standalone=lambda: False))
    assert not dkr.repairable(eagle)
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    monkeypatch.setenv("SGLANG_SPEC_EXT_DRAFT_KV_REPAIR", "1")
    with pytest.raises(dkr.DraftKVRepairError, match="DRAFT_KV_REPAIR=1 with a eagle draft"):
        mda.attach(StandInWorker())  # no STANDALONE algorithm: an EAGLE worker


def test_install_refuses_an_explicit_skip_flag_of_zero(monkeypatch):
    monkeypatch.setenv(dkr.SKIP_ZERO_STEP_ENV, "0")
    with pytest.raises(ValueError, match="unset SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"):
        dkr.install_draft_kv_repair()


def test_a_step_with_a_repair_is_reported_as_one(monkeypatch):
    """The policy the host's controller asks (GoodputStepPolicy): when the draft-KV
    repair ran during the last step, that step's time goes to the controller with the
    repair's size (it splits it between step and repair), not as a plain step time."""
    from tests.host.test_model_draft_adaptive import Clock, _policy

    monkeypatch.setattr(step_policy, "REPAIR_STATS", marks.STATS)
    clock = Clock()
    policy = _policy(clock=clock)
    times, repairs = [], []
    ctl = policy.controller
    ctl.observe_step_time = lambda bs, k, dt: times.append((bs, k, dt))
    ctl.observe_repair_step = lambda bs, k, dt, n, r: repairs.append((bs, k, dt, n, r))
    k = policy.get_steps_for_batch(4)
    marks.STATS.repairs, marks.STATS.requests, marks.STATS.tokens = 1, 3, 120  # a repair ran
    clock.t = 0.016
    policy.get_steps_for_batch(4)
    assert times == [] and repairs == [(4, k, pytest.approx(0.016), 120, 3)]
    clock.t = 0.026
    policy.get_steps_for_batch(4)  # no repair since: an ordinary step time
    assert len(times) == 1 and len(repairs) == 1
    # before each decision the controller learns what a repair would rebuild now
    noted = []
    ctl.note_unwritten = lambda tokens, reqs: noted.append((tokens, reqs))
    marks.STATS.unwritten_tokens, marks.STATS.unwritten_requests = 300, 4
    policy.get_steps_for_batch(4)
    assert noted == [(300, 4)]


def test_the_controller_splits_a_repair_step_between_step_and_repair():
    from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController

    ctl = AdaptiveController(AdaptiveConfig(candidate_ks=(0, 1), max_k=1))
    ctl.expect_repairs(lambda tokens, requests: 1e-4 * tokens)
    ctl.cost.predict = lambda bs, ks: np.full(len(ks), 0.010)
    steps = []
    ctl.observe_step_time = lambda bs, k, dt: steps.append(dt)
    ctl.observe_repair_step(4, 1, 0.030, 100, 4)  # 10 ms step + a 20 ms repair (10 predicted)
    assert ctl.repair_scale == pytest.approx(1.2)  # 2x the prior, 20% of the way
    assert steps == [pytest.approx(0.020)]  # the time beyond the predicted repair


def _logits_runner(seen: list[bool], bs: int, vocab: int = 8):
    """A draft runner stand-in (the real one needs a loaded draft model): the n-th
    forward's logits put n + 1 on token 3, and each forward records whether the repair
    said it was running."""

    def forward(_forward_batch, *_a, **_k):
        seen.append(rebuild.repairing())
        logits = torch.zeros(bs, vocab)
        logits[:, 3] = float(len(seen))
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    return SimpleNamespace(forward=forward, req_to_token_pool=SimpleNamespace(size=8))


def test_the_repair_forward_says_it_is_a_repair(monkeypatch):
    """HYBRID reads its draft steps' confidence from the draft runner's forwards during
    draft(); the repair's forward runs inside draft() too (a BEFORE hook) and must be
    told apart: ``repairing()`` is true during it and only then."""
    from sglang.srt.speculative import eagle_worker_v2 as host

    monkeypatch.setattr(host, "get_spec", lambda: SimpleNamespace(
        speculative_use_rejection_sampling=False))  # fmt: skip
    seen: list[bool] = []
    req = _req(8, 4)
    setattr(req, marks.STALE_ATTR, 5)
    batch = _batch([req], [12])
    batch.spec_info = SimpleNamespace(topk_p=torch.zeros(1, 1), topk_index=torch.zeros(1, 1, dtype=torch.int64))  # fmt: skip
    draft_worker = SimpleNamespace(topk=1, draft_runner=_logits_runner(seen, 1))
    assert not rebuild.repairing()
    rebuild._run_repair(draft_worker, batch, None, [5], [5], [7], [True])
    assert seen == [True] and not rebuild.repairing()
    assert batch.spec_info.topk_index.tolist() == [[3]]  # the repair's own top-1


def test_hybrid_does_not_take_the_repair_forward_for_a_draft_step(monkeypatch):
    """HYBRID's draft confidence (hybrid_confidence.py, read by hybrid_worker.py) around a
    draft() whose repair forward runs first (the BEFORE hook), then the host's
    draft_forward with two step forwards: the two steps are the score columns, not the
    repair (before the fix its logits were a third column, shifting every step)."""
    from sglang_spec_ext.sglang.workers import hybrid_worker
    from sglang_spec_ext.sglang.workers.hybrid_confidence import top_prob
    from sglang_spec_ext.sglang.workers.hybrid_worker import HybridMixin

    monkeypatch.setattr(hybrid_worker, "tp_sync", lambda: None)  # one rank, no host context
    seen: list[bool] = []
    runner = _logits_runner(seen, 2)
    draft_worker = SimpleNamespace(
        draft_runner=runner, topk=1, speculative_num_steps=3, device="cpu",
        _draft_extend_for_decode=lambda *a, **k: None,
        _draft_extend_for_prefill=lambda *a, **k: None,
    )  # fmt: skip

    def draft_forward(forward_batch):  # the host's: one forward per step after the first
        for _ in range(draft_worker.speculative_num_steps - 1):
            draft_worker.draft_runner.forward(forward_batch)
        return "draft result"

    def draft(batch, with_topology=False):
        with rebuild._repair_forward():  # what _run_repair does inside the BEFORE hook
            draft_worker.draft_runner.forward(None)
        return draft_worker.draft_forward(None)

    draft_worker.draft_forward, draft_worker.draft = draft_forward, draft
    worker = object.__new__(type("Hybrid", (HybridMixin,), {}))
    worker._draft_worker, worker.topk = draft_worker, 1
    worker.speculative_num_draft_tokens, worker.speculative_num_steps = 4, 3
    worker._init_hybrid()
    idle = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), reqs=[])
    assert draft_worker.draft(idle) == "draft result"
    assert seen == [True, False, False]
    steps = worker._model_step_probs(2)
    logits = torch.zeros(2, 8)
    want = [top_prob(logits.index_fill(1, torch.tensor([3]), v))[0].item() for v in (2.0, 3.0)]
    assert steps.tolist() == [pytest.approx(want)] * 2  # forwards 2 and 3; not the repair's 1
