"""The worker side of the recycled source (sglang/workers/suffix_sources.py): which logits
rows of a step are fed (the root and the accepted drafts, in the row layout of the step's
verify width, as the replay feeds them), that the tap reads nothing of the logits on the
host, and that scopes and plain steps are kept apart."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from sglang_spec_ext.config import load_config
from sglang_spec_ext.sglang.workers.suffix_sessions import DrafterSessionsMixin
from sglang_spec_ext.sglang.workers.suffix_sources import DraftSourcesMixin, accepted_path
from sglang_spec_ext.suffix.draft import DraftTree

VOCAB = 64


class _Worker(DraftSourcesMixin, DrafterSessionsMixin):
    def __init__(self) -> None:
        self._isolation = "scoped"
        self._init_recycle(load_config({"SGLANG_SPEC_EXT_RECYCLE_TOPK": "8"}))


def _req(rid: str, salt: str | None = None):
    return SimpleNamespace(rid=rid, cache_salt=salt, extra_key=None, lora_id=None)


def _logits(rows: int, best: dict[int, int]) -> torch.Tensor:
    """Logits whose top-1 at row r is ``best[r]`` (others: token r + 1)."""
    out = torch.zeros(rows, VOCAB)
    for r in range(rows):
        out[r, best.get(r, (r + 1) % VOCAB)] = 10.0
    return out


def test_accepted_path_walks_the_tree_by_the_committed_tokens():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, -1, 0, 2], probs=[0.5] * 4, score=2)
    assert accepted_path(tree, [5, 7, 8, 9]) == [0, 2, 3]
    assert accepted_path(tree, [6, 7]) == [1]
    assert accepted_path(tree, [9]) == []


def test_only_the_root_and_accepted_rows_are_fed_at_the_verify_width(monkeypatch):
    w = _Worker()
    tree_a = DraftTree(tokens=[5, 6], parents=[-1, 0], probs=[0.5, 0.4], score=0.9)
    tree_b = DraftTree(tokens=[7], parents=[-1], probs=[0.5], score=0.5)
    reqs = [_req("a"), _req("b", "tenant-b")]
    w._recycle_record(reqs, ["a", "b"], [4, 3], [tree_a, tree_b])
    width = 4  # rows b * 4 + slot: a at 0..3, b at 4..7
    logits = _logits(8, {0: 40, 1: 41, 2: 42, 4: 43, 5: 44})
    reads = []
    for name in ("cpu", "tolist", "item", "numpy"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])  # fmt: skip
    w._recycle_tap(None, SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits)))
    assert reads == []  # the tap launches the top-k; nothing is read on the host there
    monkeypatch.undo()
    assert w._recycle_rows["a"][0] == 0 and w._recycle_rows["b"][0] == width
    # a committed its whole draft and a bonus; b's draft was rejected
    w._on_committed("a", w._scope_of(reqs[0]), 4, [5, 6, 9])
    w._on_committed("b", w._scope_of(reqs[1]), 3, [8])
    w._recycle_flush()  # what the next step's drafting does first
    table = w._recycler.table
    scope_a, scope_b = w._scope_of(reqs[0]), w._scope_of(reqs[1])
    assert table.rows(scope_a, np.array([4, 5, 6]))[:, 0].tolist() == [40, 41, 42]
    assert table.rows(scope_a, np.array([9]))[0, 0] == -1  # the bonus token has no row yet
    assert table.rows(scope_b, np.array([3]))[0, 0] == 43  # root only: 7 was rejected
    assert table.rows(scope_b, np.array([7]))[0, 0] == -1
    assert table.rows(scope_a, np.array([3]))[0, 0] == -1  # b's rows stay in b's scope


def test_a_plain_step_feeds_the_roots_only_and_a_stale_root_feeds_nothing():
    w = _Worker()
    tree = DraftTree(tokens=[5, 6], parents=[-1, 0], probs=[0.5, 0.4], score=0.9)
    w._recycle_record([_req("a")], ["a"], [4], [tree])
    # a plain decode step: one logits row per request
    w._recycle_tap(None, SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=_logits(1, {0: 33}))))  # fmt: skip
    w._on_committed("a", w._scope_of(_req("a")), 4, [33])
    w._recycle_flush()
    assert w._recycler.table.rows(w._scope_of(_req("a")), np.array([4]))[0, 0] == 33
    assert w._recycler.table.rows(w._scope_of(_req("a")), np.array([5]))[0, 0] == -1
    w._recycle_record([_req("a")], ["a"], [33], [tree])
    w._recycle_tap(None, SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=_logits(4, {0: 50}))))  # fmt: skip
    w._on_committed("a", w._scope_of(_req("a")), 12, [13])  # not after that step's root
    w._recycle_flush()
    assert w._recycler.table.rows(w._scope_of(_req("a")), np.array([33]))[0, 0] == -1


def test_the_switch_turns_the_source_off():
    w = SimpleNamespace(_isolation="scoped")
    DraftSourcesMixin._init_recycle(w, load_config({"SGLANG_SPEC_EXT_RECYCLE_TOPK": "0"}))
    assert w._recycler is None


def test_rows_not_fed_before_the_next_tap_are_dropped_not_misread():
    w = _Worker()
    tree = DraftTree(tokens=[5], parents=[-1], probs=[0.5], score=0.5)
    w._recycle_record([_req("a")], ["a"], [4], [tree])
    w._recycle_tap(None, SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=_logits(2, {0: 40, 1: 41}))))  # fmt: skip
    w._on_committed("a", w._scope_of(_req("a")), 4, [5, 6])
    # no drafting in between (a faulted step): the next step's top-k replaces the rows
    w._recycle_tap(None, SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=_logits(2, {0: 50, 1: 51}))))  # fmt: skip
    w._recycle_flush()
    assert w._recycler.table.rows(w._scope_of(_req("a")), np.array([4, 5]))[:, 0].tolist() == [
        -1,
        -1,
    ]


def test_observe_many_learns_what_observe_learns():
    from sglang_spec_ext.suffix.recycler import Recycler

    one, many = Recycler(), Recycler()
    for r in (one, many):
        r.feed("s", np.array([1, 2, 3]), np.array([[2] * 8, [3] * 8, [9] * 8]))
    items = [("a", "s", 1, [2, 3, 4]), ("b", "s", 2, [7]), ("c", "t", 1, [2])]
    for it in items:
        one.observe(*it)
    many.observe_many(items)
    assert one.rates.seen == many.rates.seen and (one.rates.hits == many.rates.hits).all()
