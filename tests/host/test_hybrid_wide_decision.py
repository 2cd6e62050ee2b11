"""HYBRID's per-step width decision (``WideStepsMixin._fit_width``, hybrid_wide.py) on a
stand-in worker: a winning suffix draft longer than the model's width stays whole where
the fitted step cost says the extra tokens pay, and is cut to the model's width where
they do not (or where the table learned that its extra nodes are not accepted)."""

from __future__ import annotations

from sglang_spec_ext.hybrid.candidate import MODEL, SUFFIX, Candidate
from sglang_spec_ext.hybrid.choice import HybridState
from sglang_spec_ext.hybrid.wide import MIN_STEPS
from sglang_spec_ext.sglang.workers.hybrid_wide import PackedRows, WideStepsMixin
from sglang_spec_ext.suffix.draft import DraftTree

WIDTH, PACK = 4, 16


class Worker(WideStepsMixin):
    speculative_num_draft_tokens = WIDTH
    topk = 1

    @property
    def _width(self) -> int:
        return WIDTH


def _worker(seconds_per_token: float) -> Worker:
    w = object.__new__(Worker)
    w._init_wide(PACK, 0.1)
    w.hybrid = HybridState("learned")
    for i in range(MIN_STEPS + 8):  # the step cost: 10 ms plus seconds_per_token per token
        tokens = 4 + 8 * i
        w._wide_cost.on_step(1, tokens, 0.01 + seconds_per_token * tokens)
    return w


def _chain(n: int, p: float = 0.9) -> DraftTree:
    probs = [p ** (i + 1) for i in range(n)]
    return DraftTree(tokens=list(range(10, 10 + n)), parents=list(range(-1, n - 1)),
                     probs=probs, score=sum(probs), match_len=8)  # fmt: skip


def _step(w: Worker, bs: int):
    """Request 0: a 12-node suffix draft that won; the others: the model's 3-token chain."""
    packed = PackedRows(bs, PACK)
    trees = [_chain(12)] + [None] * (bs - 1)
    model = Candidate(MODEL, (1, 2, 3), (-1, 0, 1), 2.4)
    models = [model] * bs
    packed.flags[0] = 1
    packed.write(0, trees[0].tokens, trees[0].parents)
    for b in range(1, bs):
        packed.write(b, model.tokens, model.parents)
    w._fit_width(packed, trees, models)
    return packed


def test_flat_cost_keeps_the_long_suffix_draft_whole():
    w = _worker(0.0)
    packed = _step(w, 8)
    assert packed.flags[0] == 1 and packed.lens[0] == 12
    assert w._wide_stats.wide_steps == 1 and w._wide_stats.wide_rows == 1


def test_steep_cost_cuts_it_to_the_models_width():
    w = _worker(0.01)  # a token costs as much as the step's fixed part: 8 x 16 tokens do not pay
    packed = _step(w, 8)
    assert w._wide_stats.wide_steps == 0 and w._wide_stats.capped_rows == 1
    assert packed.lens.max() <= WIDTH - 1
    assert packed.flags[0] == 1  # chosen on its cut: it stays the suffix draft
    assert packed.tokens[0, 1:].tolist() == [10, 11, 12] + [0] * (PACK - 4)


def test_learned_acceptance_of_long_drafts_decides_the_gain():
    """The gain is what the table learned of whole drafts (the ledger resolves them beside
    the cut ones): where long suffix drafts accept no more than their first 3 nodes, a
    step stays narrow even when verify tokens are nearly free."""
    w = _worker(1e-5)
    est = w.hybrid.estimator
    whole, short = _chain(12), _chain(12).first(WIDTH - 1)
    for _ in range(200):
        est.observe(SUFFIX, whole.score, 2)
        est.observe(SUFFIX, short.score, 2)
    packed = _step(w, 8)
    assert w._wide_stats.wide_steps == 0 and packed.lens[0] == 3 and packed.flags[0] == 1


def test_a_verify_input_with_a_planned_kv_window_stays_narrow():
    from types import SimpleNamespace

    w = _worker(0.0)  # wide would pay
    w._block_wide(SimpleNamespace(kv_loc_plan=object(), draft_probs=None))
    packed = _step(w, 8)
    assert w._wide_stats.wide_steps == 0 and packed.lens.max() <= WIDTH - 1
    w._block_wide(SimpleNamespace(kv_loc_plan=None, draft_probs=None))
    packed = _step(w, 8)
    assert w._wide_stats.wide_steps == 1 and packed.lens[0] == 12
