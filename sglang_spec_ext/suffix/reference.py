"""Pure-Python reference of the suffix drafter: the specification of its results.

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
from collections import OrderedDict
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


class _Queue:
    """Tokens waiting to enter a tree, in order."""

    __slots__ = ("tokens", "pos")

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens = tokens or []
        self.pos = 0

    def left(self) -> int:
        return len(self.tokens) - self.pos


class ReferenceEngine:
    """Requests by integer handle; same methods and results as ``_native.Engine``."""

    def __init__(self, cfg: SuffixConfig, exhaustive: bool = False) -> None:
        self.cfg = cfg
        self.exhaustive = exhaustive
        self.reset()

    def reset(self) -> None:
        self.glob = SuffixTrie(self.cfg.max_depth)
        self.local: dict[int, SuffixTrie] = {}
        self.local_queue: dict[int, _Queue] = {}
        self.tail: dict[int, list[int]] = {}  # the last tokens of each request
        self.guid: dict[int, int | None] = {}  # handle -> its global sequence id
        self.cached: OrderedDict[int, int | None] = OrderedDict()  # uid -> owner, oldest first
        self.global_queue: dict[int, _Queue] = {}  # uid -> tokens not yet in the global tree
        self.finish_pending: set[int] = set()  # finished uids whose queue is not empty
        self.work: list[tuple[int, int | None]] = []  # (handle, uid), by start
        self.next_uid = 0
        self.credit = self.cfg.step_insert_tokens

    def start(self, h: int, prompt: Iterable[int]) -> None:
        if h in self.local:
            raise ValueError("request handle already active")
        prompt = check_tokens(prompt)
        cfg = self.cfg
        trie = SuffixTrie(cfg.max_depth)
        trie.add(0)
        self.local[h] = trie
        self.local_queue[h] = _Queue(
            prompt[len(prompt) - min(len(prompt), cfg.max_request_tokens) :]
        )
        self.tail[h] = prompt[-cfg.max_depth :]
        self.guid[h] = None
        if cfg.global_enabled:
            while len(self.cached) >= cfg.max_cached_requests:
                self._evict_oldest()
            uid = self.guid[h] = self.next_uid
            self.next_uid += 1
            self.cached[uid] = h
            self.glob.add(uid)
            keep = min(len(prompt), cfg.global_prompt_tokens)
            self.global_queue[uid] = _Queue(prompt[len(prompt) - keep :])
        self.work.append((h, self.guid[h]))
        self._advance()

    def _insert_local(self, h: int, tokens: list[int]) -> None:
        trie = self.local[h]
        trie.extend(0, tokens)
        if trie.live_size(0) > self.cfg.max_request_tokens:
            trie.trim(0, len(trie.seqs[0].tokens) - self.cfg.max_request_tokens)

    def _insert_global(self, uid: int, tokens: list[int]) -> None:
        self.glob.extend(uid, tokens)
        self._enforce_token_bound()

    def extend(self, h: int, tokens: Iterable[int]) -> None:
        tokens = check_tokens(tokens)
        if h not in self.local:
            raise KeyError(h)
        self.tail[h] = (self.tail[h] + tokens)[-self.cfg.max_depth :]
        q = self.local_queue[h]
        if q.left():
            q.tokens += tokens
        else:
            self._insert_local(h, tokens)
        uid = self.guid[h]
        if uid is not None:
            gq = self.global_queue[uid]
            if gq.left():
                gq.tokens += tokens
            else:
                self._insert_global(uid, tokens)

    def _advance(self) -> None:
        while self.work:
            h, uid = self.work[0]
            q = self.local_queue.get(h)
            if q is not None and q.left():
                if self.credit <= 0:
                    return
                k = min(q.left(), self.credit)
                self._insert_local(h, q.tokens[q.pos : q.pos + k])
                q.pos += k
                self.credit -= k
                continue
            gq = self.global_queue.get(uid) if uid is not None else None
            if gq is not None and gq.left():
                if self.credit <= 0:
                    return
                k = min(gq.left(), self.credit)
                self.glob.extend(uid, gq.tokens[gq.pos : gq.pos + k])
                gq.pos += k
                self.credit -= k
                if not gq.left() and uid in self.finish_pending:
                    self.finish_pending.discard(uid)
                    self.glob.finish(uid)
                self._enforce_token_bound()
                continue
            self.work.pop(0)

    def flush(self) -> None:
        self.credit = math.inf
        self._advance()
        self.credit = self.cfg.step_insert_tokens

    def _draft(self, h: int, max_nodes: int) -> DraftTuple:
        trie = self.local[h]
        hist = self.tail[h]
        sid = 0 if not self.local_queue[h].left() else None
        local = best_in_trie(trie, sid, hist, max_nodes, self.cfg, self.exhaustive)
        if not self.cfg.global_enabled:
            return local
        uid = self.guid[h]
        gsid = uid if uid is not None and not self.global_queue[uid].left() else None
        glob = best_in_trie(self.glob, gsid, hist, max_nodes, self.cfg, self.exhaustive)
        if self.cfg.merge_drafts and self.cfg.use_tree:
            return merge_drafts(local, glob, max_nodes)
        return local if local[3] >= glob[3] else glob

    def speculate(self, h: int, max_nodes: int) -> DraftTuple:
        return self.speculate_batch([h], max_nodes)[0]

    def speculate_batch(self, hs: Iterable[int], max_nodes: int) -> list[DraftTuple]:
        self._advance()
        out = [self._draft(h, max_nodes) for h in hs]
        self.credit = self.cfg.step_insert_tokens
        return out

    def finish(self, h: int) -> None:
        del self.local[h], self.local_queue[h], self.tail[h]
        uid = self.guid.pop(h)
        if uid is not None:
            if self.global_queue[uid].left():
                self.finish_pending.add(uid)
            else:
                self.glob.finish(uid)
            self.cached[uid] = None

    def abort(self, h: int) -> None:
        del self.local[h], self.local_queue[h], self.tail[h]
        uid = self.guid.pop(h)
        if uid is not None:
            self._drop(uid)
            del self.cached[uid]

    def _drop(self, uid: int) -> None:
        self.glob.remove(uid)
        del self.global_queue[uid]
        self.finish_pending.discard(uid)

    def _evict_oldest(self) -> None:
        uid, owner = self.cached.popitem(last=False)
        self._drop(uid)
        if owner is not None:
            self.guid[owner] = None

    def _enforce_token_bound(self) -> None:
        while self.glob.num_tokens > self.cfg.max_cached_tokens and self.cached:
            self._evict_oldest()

    def stats(self) -> dict:
        pending = sum(q.left() for q in self.local_queue.values())
        pending += sum(q.left() for q in self.global_queue.values())
        return {
            "active_requests": len(self.local),
            "cached_requests": len(self.cached),
            "cached_tokens": self.glob.num_tokens,
            "pinned_tokens": 0,
            "global_nodes": self.glob.num_nodes,
            "local_nodes": sum(t.num_nodes for t in self.local.values()),
            "local_tokens": sum(t.num_tokens for t in self.local.values()),
            "pending_tokens": pending,
            "memory_bytes": 0,
        }
