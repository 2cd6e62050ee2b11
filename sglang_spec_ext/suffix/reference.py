"""Pure-Python reference of the suffix drafter: the specification of its results.

This module holds the trie and the drafting rules; reference_engine.py the
engine over them (requests, scopes, corpora, bounds, incremental insertion).

The compiled core (csrc/suffix, ``_native.Engine``) must return exactly what
this module returns; tests/unit/test_suffix_equivalence.py checks it. Here the
suffix tree is an uncompressed trie (one node per token, memory about
max_depth nodes per stored token), so this backend suits tests and small caches.

Model. For every stored sequence s and start i the string s[i : i + max_depth]
is inserted; count(x) is the number of occurrences of x (|x| <= max_depth) in
the stored sequences, and endings(x) the number of inserted strings that end at
x. The conditional frequency of token a after x is count(xa) / cont(x) with
cont(x) = count(x) - endings(x), the occurrences of x followed by some token;
when count(xa) == cont(x) the probability is carried over unchanged.

Speculation for a request with history h, in each tree (the request's own, and
the global one): for every match length m (longest first) with h[-m:] present,
grow a draft of at most budget(m) nodes from h[-m:] and keep the best score
(a shorter match must score strictly higher). With merge_drafts (and use_tree) the two trees'
drafts are merged into one tree by path probability (``merge_drafts``);
otherwise the higher score wins, the request's own tree on ties.

Bounds and incremental insertion (SuffixConfig documents them): the request's
tree holds its last max_request_tokens tokens (older strings are removed as
tokens arrive); the global tree gets the last ``global_prompt_tokens`` prompt
tokens; prompt tokens wait in per-tree queues and are inserted oldest request
first, at most step_insert_tokens per step (a step ends with each speculate
call; start uses what the step has left); output tokens of a request whose
queue is not empty join the queue.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Iterable

from .config import SuffixConfig

DraftTuple = tuple[list[int], list[int], list[float], float, int]
_MAX_TOKEN = 2**31 - 1


def check_tokens(tokens: Iterable[int]) -> list[int]:
    out = [operator.index(t) for t in tokens]
    for t in out:
        if not 0 <= t <= _MAX_TOKEN:
            raise ValueError(f"token ids must be in [0, 2**31 - 1], got {t}")
    return out


class _Seq:
    __slots__ = ("tokens", "active", "first")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.first = 0  # strings starting before this index were trimmed
        # active[j]: node of the suffix of length j (active[0] is the root);
        # None once the sequence is finished.
        self.active: list[int] | None = [ROOT]


ROOT = 0


class SuffixTrie:
    """Occurrence counts of every substring of length <= max_depth of a set of sequences.

    Node n (0 is the root, the empty string) has count[n], endings[n] and
    children[n] (token -> node). Flat lists of ints keep the garbage collector
    out of the way on large tries.
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.count = [0]
        self.endings = [0]
        self.children: list[dict[int, int]] = [{}]
        self.free: list[int] = []
        self.seqs: dict[int, _Seq] = {}
        self.num_tokens = 0

    @property
    def num_nodes(self) -> int:
        return len(self.count) - len(self.free) - 1

    def _new_node(self) -> int:
        if self.free:
            n = self.free.pop()
            self.children[n] = {}
            return n
        self.count.append(0)
        self.endings.append(0)
        self.children.append({})
        return len(self.count) - 1

    def add(self, sid: int) -> None:
        self.seqs[sid] = _Seq()

    def extend(self, sid: int, tokens: list[int]) -> None:
        seq = self.seqs[sid]
        count, endings, children = self.count, self.endings, self.children
        for t in tokens:
            seq.tokens.append(t)
            self.num_tokens += 1
            count[ROOT] += 1
            grown = [ROOT]
            for j, node in enumerate(seq.active[: self.max_depth]):  # strings shorter than max
                child = children[node].get(t)
                if child is None:
                    child = children[node][t] = self._new_node()
                count[child] += 1
                endings[child] += 1
                if j:
                    endings[node] -= 1
                grown.append(child)
            seq.active = grown

    def finish(self, sid: int) -> None:
        self.seqs[sid].active = None

    def remove(self, sid: int) -> None:
        seq = self.seqs.pop(sid)
        toks = seq.tokens
        self.num_tokens -= len(toks) - seq.first
        for i in range(seq.first, len(toks)):
            self._remove_string(toks[i : i + self.max_depth])

    def trim(self, sid: int, first: int) -> None:
        """Remove the strings starting before `first` (complete ones only)."""
        seq = self.seqs[sid]
        assert first <= len(seq.tokens) - self.max_depth
        for i in range(seq.first, first):
            self._remove_string(seq.tokens[i : i + self.max_depth])
        if first > seq.first:
            self.num_tokens -= first - seq.first
            seq.first = first

    def live_size(self, sid: int) -> int:
        seq = self.seqs[sid]
        return len(seq.tokens) - seq.first

    def _remove_string(self, string: list[int]) -> None:
        self.count[ROOT] -= 1
        node = ROOT
        for depth, t in enumerate(string, start=1):
            child = self.children[node][t]
            self.count[child] -= 1
            if self.count[child] == 0:  # the rest of the path held only this string
                del self.children[node][t]
                self._free_path(child, string[depth:])
                return
            node = child
        self.endings[node] -= 1

    def _free_path(self, node: int, rest: list[int]) -> None:
        for t in [*rest, None]:
            nxt = self.children[node].get(t) if t is not None else None
            self.count[node] = self.endings[node] = 0
            self.children[node] = {}
            self.free.append(node)
            if nxt is None:
                return
            node = nxt

    def tracked(self, sid: int | None) -> list[int]:
        """Nodes of the suffixes of a growing sequence, by length (index 0: root)."""
        if sid is None or sid not in self.seqs or self.seqs[sid].active is None:
            return [ROOT]
        return self.seqs[sid].active

    def find(self, string: list[int]) -> int | None:
        node = ROOT
        for t in string:
            node = self.children[node].get(t)
            if node is None:
                return None
        return node


def next_tokens(trie: SuffixTrie, node: int, prob: float, min_prob: float, limit: int) -> list:
    """Continuations (token, prob, node), best first by (count desc, token asc)."""
    count = trie.count
    cont = count[node] - trie.endings[node]
    out: list = []
    if cont <= 0 or limit <= 0:
        return out
    for tok, child in sorted(trie.children[node].items(), key=lambda kv: (-count[kv[1]], kv[0])):
        c = count[child]
        q = prob if c == cont else prob * c / cont
        if q < min_prob or len(out) == limit:
            break
        out.append((tok, q, child))
    return out


def grow(
    trie: SuffixTrie, node: int, depth: int, budget: int, cfg: SuffixConfig
) -> tuple[DraftTuple, bool]:
    """Draft from the node of the matched string (at `depth`); also says whether
    the match or a drafted node sits at max_depth (the tree's depth cut it)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    limited = depth == cfg.max_depth
    if cfg.use_tree:
        heap: list = []
        order = 0
        for tok, q, child in next_tokens(trie, node, 1.0, cfg.min_token_prob, budget):
            heap.append((-q, order, tok, child, -1, depth + 1))
            order += 1
        heapq.heapify(heap)
        while heap and len(tokens) < budget:
            neg_q, _, tok, child, parent, d = heapq.heappop(heap)
            tokens.append(tok)
            parents.append(parent)
            probs.append(-neg_q)
            limited |= d == cfg.max_depth
            idx = len(tokens) - 1
            # Children ranked below the remaining budget could never be popped in time.
            left = budget - idx - 1
            for t2, q2, c2 in next_tokens(trie, child, -neg_q, cfg.min_token_prob, left):
                heapq.heappush(heap, (-q2, order, t2, c2, idx, d + 1))
                order += 1
    else:
        prob = 1.0
        while len(tokens) < budget:
            nxt = next_tokens(trie, node, prob, cfg.min_token_prob, 1)
            if not nxt:
                break
            tok, prob, node = nxt[0]
            parents.append(len(tokens) - 1)
            tokens.append(tok)
            probs.append(prob)
            depth += 1
            limited |= depth == cfg.max_depth
    score = 0.0
    for p in probs:
        score += p
    return (tokens, parents, probs, score, 0), limited


def budget(cfg: SuffixConfig, match_len: int, max_nodes: int) -> int:
    b = math.floor(cfg.max_spec_factor * match_len + cfg.max_spec_offset + 1e-9)
    return max(0, min(max_nodes, b))


def best_in_trie(
    trie: SuffixTrie,
    sid: int | None,
    hist: list[int],
    max_nodes: int,
    cfg: SuffixConfig,
    exhaustive: bool = False,
) -> DraftTuple:
    """Best draft over all match lengths. Unless `exhaustive`, two shortcuts that
    cannot change the result: the budget bounds the score, and a shorter suffix
    with the same count as the last drafted one has the same continuations."""
    longest_possible = min(cfg.max_depth, len(hist))
    nodes: list[int | None] = list(trie.tracked(sid)[: longest_possible + 1])
    for m in range(len(nodes), longest_possible + 1):
        nodes.append(trie.find(hist[-m:]))
        if nodes[-1] is None:
            nodes.pop()
            break
    best: DraftTuple = ([], [], [], 0.0, 0)
    ref_count, ref_limited = -1, True
    for m in range(len(nodes) - 1, 0, -1):
        b = budget(cfg, m, max_nodes)
        if b <= best[3] and not exhaustive:
            break
        count = trie.count[nodes[m]]
        if count == ref_count and not ref_limited and not exhaustive:
            continue
        draft, limited = grow(trie, nodes[m], m, b, cfg)
        ref_count, ref_limited = count, limited
        if draft[3] > best[3]:
            best = (*draft[:4], m)
    return best


def merge_drafts(first: DraftTuple, second: DraftTuple, max_nodes: int) -> DraftTuple:
    """One tree from two drafts, by path probability (expected accepted tokens).

    Nodes of both drafts (``first``'s in order, then ``second``'s) are merged by
    their token path below the root: a path present in both keeps the larger
    probability. Then the best ``max_nodes`` nodes are taken best first: a node
    becomes a candidate once its parent is taken, and the candidate with the
    highest probability is taken next, earlier-merged nodes first on ties. The
    score is the sum of the taken probabilities; match_len is that of the draft
    with the higher score (``first`` on ties). An empty draft leaves the other
    one unchanged.
    """
    if not second[0]:
        return first
    if not first[0]:
        return second
    match_len = first[4] if first[3] >= second[3] else second[4]
    # Merged nodes: token, merged parent (-1: the root), probability, children.
    tok: list[int] = []
    prob: list[float] = []
    kids: list[list[int]] = []
    roots: list[int] = []
    for d in (first, second):
        ids: list[int] = []
        for t, par, q in zip(d[0], d[1], d[2], strict=True):
            siblings = roots if par < 0 else kids[ids[par]]
            found = -1
            for c in siblings:
                if tok[c] == t:
                    found = c
                    break
            if found < 0:
                found = len(tok)
                tok.append(t)
                prob.append(q)
                kids.append([])
                siblings.append(found)
            elif q > prob[found]:
                prob[found] = q
            ids.append(found)
    heap = [(-prob[c], c, -1) for c in roots]
    heapq.heapify(heap)
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    while heap and len(tokens) < max_nodes:
        neg_q, c, parent = heapq.heappop(heap)
        idx = len(tokens)
        tokens.append(tok[c])
        parents.append(parent)
        probs.append(-neg_q)
        for k in kids[c]:
            heapq.heappush(heap, (-prob[k], k, idx))
    score = 0.0
    for q in probs:
        score += q
    return (tokens, parents, probs, score, match_len)
