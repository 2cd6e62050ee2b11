"""The host's NGRAM corpus as a replay drafter (``simulate --drafter ngram``).

Fed the way sglang 0.5.23's ``NGRAMWorker`` feeds it: prefill inserts nothing;
each decode step matches the last ``max_trie_depth`` tokens of the request
(``batch_get``) and, after verify, inserts that same window (``batch_put``) — the
context as it was when the draft was made. ``batch_get`` returns ``width`` tokens
per request, index 0 being the root (last committed token), with an
ancestor-or-self mask; padding slots are token 0 hanging off the root and are
dropped here (the host verifies them, but they never match real text).

The corpus is C++, JIT-built through apache-tvm-ffi on first use (~15 s on CPU).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

from sglang_spec_ext.replay.protocol import Draft, tree_from_ancestor_mask


def _drop_padding(draft: Draft) -> Draft:
    has_child = set(draft.parents)
    keep = [
        i
        for i, (tok, par) in enumerate(zip(draft.tokens, draft.parents, strict=True))
        if not (tok == 0 and par == -1 and i not in has_child)
    ]
    if len(keep) == len(draft.tokens):
        return draft
    remap = {old: new for new, old in enumerate(keep)}
    return Draft(
        [draft.tokens[i] for i in keep],
        [remap[draft.parents[i]] if draft.parents[i] >= 0 else -1 for i in keep],
    )


class HostNgramDrafter:
    """Replay adapter over ``sglang.srt.speculative.cpp_ngram.ngram_corpus.NgramCorpus``.

    ``width`` is the host verify width (``--speculative-num-draft-tokens``, root
    included); a smaller ``max_nodes`` in ``speculate`` keeps the first nodes.
    """

    def __init__(
        self,
        width: int = 16,
        max_trie_depth: int = 18,
        min_bfs_breadth: int = 1,
        max_bfs_breadth: int = 10,
        match_type: str = "BFS",
        capacity: int = 10_000_000,
    ) -> None:
        if width < 2:
            raise ValueError(f"the host NGRAM corpus needs width >= 2, got {width}")
        self.width = width
        self.max_trie_depth = max_trie_depth
        self._corpus = NgramCorpus(
            max_trie_depth=max_trie_depth,
            min_bfs_breadth=min_bfs_breadth,
            max_bfs_breadth=max_bfs_breadth,
            draft_token_num=width,
            match_type=match_type,
            capacity=capacity,
        )
        self._tail: dict[Hashable, list[int]] = {}
        self._total: dict[Hashable, int] = {}
        self._drafted: set[Hashable] = set()

    def _key(self, req_id: Hashable) -> str:
        return str(req_id)

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        self._tail[req_id] = list(prompt_ids[-self.max_trie_depth :])
        self._total[req_id] = len(prompt_ids)

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        tail = self._tail[req_id]
        if req_id in self._drafted:  # a decode step: insert the window it drafted from
            self._corpus.batch_put([list(tail)])
            self._drafted.discard(req_id)
        tail.extend(int(t) for t in token_ids)
        if len(tail) > self.max_trie_depth:
            del tail[: len(tail) - self.max_trie_depth]
        self._total[req_id] += len(token_ids)

    def speculate(self, req_id: Hashable, max_nodes: int) -> Draft:
        self._drafted.add(req_id)
        if max_nodes <= 0:
            return Draft()
        self._corpus.synchronize()
        ids, mask = self._corpus.batch_get(
            [self._key(req_id)], [list(self._tail[req_id])], [self._total[req_id]]
        )
        draft = _drop_padding(tree_from_ancestor_mask(ids, mask))
        if len(draft.tokens) > max_nodes:
            draft = Draft(draft.tokens[:max_nodes], draft.parents[:max_nodes])
        return draft

    def finish_request(self, req_id: Hashable) -> None:
        self._corpus.erase_match_state([self._key(req_id)])
        self._tail.pop(req_id, None)
        self._total.pop(req_id, None)
        self._drafted.discard(req_id)
