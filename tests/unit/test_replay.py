"""Replay engine: exact accept lengths on hand-made traces where the answer is known."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from sglang_spec_ext.replay import Draft, TraceRecord, greedy_accept, replay
from sglang_spec_ext.replay.protocol import node_depths, tree_from_ancestor_mask, validate_draft


class OracleDrafter:
    """Knows every request's output; proposes the next ``max_nodes`` tokens as a chain,
    wrong from draft position ``wrong_at`` (1-based) on if given."""

    def __init__(self, outputs: dict[int, Sequence[int]], wrong_at: int | None = None) -> None:
        self.outputs = outputs
        self.wrong_at = wrong_at
        self.pos: dict[Hashable, int] = {}
        self.idx: dict[Hashable, int] = {}
        self.calls: list[tuple[str, Hashable, object]] = []
        self._next = 0

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        self.calls.append(("start", req_id, tuple(prompt_ids)))
        self.pos[req_id] = 0
        self.idx[req_id] = self._next
        self._next += 1

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        self.calls.append(("extend", req_id, tuple(token_ids)))
        out = self.outputs[self.idx[req_id]]
        p = self.pos[req_id]
        assert tuple(token_ids) == tuple(out[p : p + len(token_ids)]), (
            "commits must follow the output"
        )
        self.pos[req_id] = p + len(token_ids)

    def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
        out = self.outputs[self.idx[req_id]]
        p = self.pos[req_id]
        chain = list(out[p : p + max_nodes])
        if self.wrong_at is not None and len(chain) >= self.wrong_at:
            chain[self.wrong_at - 1] = 10_000
        return Draft.chain(chain)

    def finish_request(self, req_id: Hashable) -> None:
        self.calls.append(("finish", req_id, None))


class NullDrafter(OracleDrafter):
    def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
        return Draft()


def _records(*lengths: int) -> list[TraceRecord]:
    return [
        TraceRecord(
            prompt_ids=(7, 7), output_ids=tuple(range(100 * i, 100 * i + n)), set=f"s{i % 2}"
        )
        for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("width", [1, 2, 4, 16])
@pytest.mark.parametrize("n", [0, 1, 2, 9, 33])
def test_oracle_commits_width_per_step(width: int, n: int) -> None:
    recs = _records(n)
    res = replay(recs, OracleDrafter({0: recs[0].output_ids}), width, check=True)
    # prefill commits output[0]; each decode step then commits `width` tokens (last may be short)
    expected: list[int] = []
    left = max(n - 1, 0)
    while left:
        expected.append(min(width, left))
        left -= expected[-1]
    assert res.steps == [expected]
    s = res.overall.summary()
    assert s["output_tokens"] == n
    assert res.overall.steps == len(expected)
    if expected:
        assert s["accept_len"] == pytest.approx((n - 1) / len(expected))


def test_null_drafter_accept_len_is_one() -> None:
    recs = _records(10, 5)
    res = replay(recs, NullDrafter({0: recs[0].output_ids, 1: recs[1].output_ids}), 8)
    assert res.steps == [[1] * 9, [1] * 4]
    s = res.overall.summary()
    assert s["accept_len"] == 1.0 and s["drafted_per_step"] == 0.0
    assert set(res.by_set) == {"s0", "s1"}
    assert res.by_set["s0"].steps == 9 and res.by_set["s1"].steps == 4


def test_wrong_token_stops_acceptance() -> None:
    recs = _records(20)
    res = replay(recs, OracleDrafter({0: recs[0].output_ids}, wrong_at=3), 8)
    # accepts 2 drafts + bonus = 3 per step over the 19 decode tokens
    assert res.steps == [[3] * 6 + [1]]
    rates = res.overall.summary()["accept_rate_by_depth"]
    assert rates[:2] == [1.0, 1.0] and rates[2] == 0.0


def test_protocol_call_order() -> None:
    recs = _records(4)
    drafter = OracleDrafter({0: recs[0].output_ids})
    replay(recs, drafter, 2)
    assert drafter.calls == [
        ("start", "req-0", (7, 7)),
        ("extend", "req-0", (0,)),
        ("extend", "req-0", (1, 2)),
        ("extend", "req-0", (3,)),
        ("finish", "req-0", None),
    ]


def test_factory_is_accepted() -> None:
    recs = _records(5)
    res = replay(recs, lambda: OracleDrafter({0: recs[0].output_ids}), 3)
    assert res.steps == [[3, 1]]


def test_greedy_accept_walks_the_matching_branch() -> None:
    #        root
    #       /    \
    #     5(0)   6(1)
    #      |      |  \
    #     7(2)   8(3) 9(4)
    #                  |
    #                 10(5)
    tree = Draft([5, 6, 7, 8, 9, 10], [-1, -1, 0, 1, 1, 4])
    validate_draft(tree, 6)
    assert node_depths(tree.parents) == [1, 1, 2, 2, 2, 3]
    assert greedy_accept(tree, [6, 9, 10, 11]) == 3
    assert greedy_accept(tree, [6, 9, 10]) == 3
    assert greedy_accept(tree, [6, 9]) == 2
    assert greedy_accept(tree, [5, 7, 1]) == 2
    assert greedy_accept(tree, [6, 7]) == 1
    assert greedy_accept(tree, [4]) == 0
    assert greedy_accept(tree, []) == 0
    assert greedy_accept(Draft(), [1]) == 0


def test_tree_step_commits_accepted_plus_bonus() -> None:
    class TreeDrafter(NullDrafter):
        def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
            return Draft([50, 1, 51, 2, 3], [-1, -1, 1, 1, 3])

    rec = TraceRecord(prompt_ids=(9,), output_ids=(0, 1, 2, 3, 4, 5))
    res = replay([rec], TreeDrafter({0: rec.output_ids}), 6)
    # step 1 at p=1: accepts 1,2,3 (3 drafts) + bonus 4 -> 4; step 2 at p=5: only 1 left
    assert res.steps == [[4, 1]]
    s = res.overall.summary()
    assert s["drafted_per_step"] == 5.0
    assert s["accept_rate_by_depth"] == [0.5, 0.5, 0.5]


def test_validate_draft_rejects_bad_trees() -> None:
    with pytest.raises(ValueError, match="parents must precede"):
        validate_draft(Draft([1, 2], [1, -1]))
    with pytest.raises(ValueError, match="budget"):
        validate_draft(Draft.chain([1, 2, 3]), 2)
    with pytest.raises(ValueError, match="tokens but"):
        validate_draft(Draft([1, 2], [-1]))


def test_tree_from_ancestor_mask_host_layout() -> None:
    # root 3; children 4 and 44; 4->5->6, 44->55->66->77
    tokens = [3, 4, 44, 5, 55, 6, 66, 77]
    mask = [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0, 1, 0],
        [1, 0, 1, 0, 1, 0, 1, 1],
    ]
    draft = tree_from_ancestor_mask(tokens, mask)
    assert draft.tokens == [4, 44, 5, 55, 6, 66, 77]
    assert draft.parents == [-1, -1, 0, 1, 2, 3, 5]
    assert greedy_accept(draft, [44, 55, 66, 77, 1]) == 4


def test_bad_width_rejected() -> None:
    with pytest.raises(ValueError, match="width"):
        replay(_records(3), NullDrafter({0: (0, 1, 2)}), 0)


def test_matches_the_shared_tree_module() -> None:
    from sglang_spec_ext.suffix import DraftTree
    from sglang_spec_ext.verify import layout as tree_mod

    tree = DraftTree(
        tokens=[5, 6, 7, 8, 9, 10],
        parents=[-1, -1, 0, 1, 1, 4],
        probs=[1.0] * 6,
        score=6.0,
        match_len=1,
    )
    for cont in ([6, 9, 10, 11], [5, 7], [6, 7], [4], []):
        assert greedy_accept(tree, cont) == tree_mod.accepted_length(tree, cont)
