"""The reference engine: requests, scoped global tries, corpora and bounds.

Same methods and results as ``_native.Engine`` (csrc/suffix/engine.cc); the
drafting rules are in ``reference.py``.

Scopes. Every request names the scope of the global trie it reads and feeds
(``""``, the shared default, unless the caller says otherwise) or none at all
(``use_global=False``: its own trie and the corpora only). Cached sequences are
bounded per scope (``max_scope_tokens``: the scope's oldest go first) and in
total (``max_cached_requests`` and ``max_cached_tokens``: the oldest of any
scope go first). A scope other than ``""`` disappears with its last sequence.

Corpora. Read-only tries over an operator's documents, one sequence each,
attached by name to every scope (no scopes listed) or to the listed ones. A
request's draft from the corpora (the best, the first name on ties) replaces
its global draft where it scores strictly higher.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from .config import SuffixConfig
from .reference import DraftTuple, SuffixTrie, best_in_trie, check_tokens, merge_drafts


class _Queue:
    """Tokens waiting to enter a tree, in order."""

    __slots__ = ("tokens", "pos")

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens = tokens or []
        self.pos = 0

    def left(self) -> int:
        return len(self.tokens) - self.pos


class ReferenceCorpus:
    """A read-only trie over documents (the twin of ``_native.build_corpus``)."""

    def __init__(self, docs: Iterable[Iterable[int]], max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError("max_depth must be >= 1")
        self.trie = SuffixTrie(max_depth)
        self.tokens = 0
        for sid, doc in enumerate(check_tokens(d) for d in docs):
            if not doc:
                continue
            self.trie.add(sid)
            self.trie.extend(sid, doc)
            self.trie.finish(sid)
            self.tokens += len(doc)

    memory_bytes = 0


class ReferenceEngine:
    """Requests by integer handle; same methods and results as ``_native.Engine``."""

    def __init__(
        self, cfg: SuffixConfig, exhaustive: bool = False, max_scope_tokens: int = -1
    ) -> None:
        self.cfg = cfg
        self.exhaustive = exhaustive
        self.max_scope_tokens = max_scope_tokens if max_scope_tokens >= 0 else cfg.max_cached_tokens
        self.corpora_: dict[str, tuple[ReferenceCorpus, list[str]]] = {}
        self.reset()

    def reset(self) -> None:
        self.scopes: dict[str, SuffixTrie] = {"": SuffixTrie(self.cfg.max_depth)}
        self.scope_of: dict[int, str] = {}  # uid -> scope
        self.req_scope: dict[int, str | None] = {}  # handle -> scope (None: no global tree)
        self.local: dict[int, SuffixTrie] = {}
        self.local_queue: dict[int, _Queue] = {}
        self.tail: dict[int, list[int]] = {}  # the last tokens of each request
        self.guid: dict[int, int | None] = {}  # handle -> its global sequence id
        self.cached: OrderedDict[int, int | None] = OrderedDict()  # uid -> owner, oldest first
        self.global_queue: dict[int, _Queue] = {}  # uid -> tokens not yet in its scope's trie
        self.finish_pending: set[int] = set()  # finished uids whose queue is not empty
        self.work: list[tuple[int, int | None]] = []  # (handle, uid), by start
        self.next_uid = 0
        self.credit = self.cfg.step_insert_tokens

    # -- cached sequences -------------------------------------------------------
    def _new_cached(self, scope: str, owner: int | None) -> int:
        while len(self.cached) >= self.cfg.max_cached_requests and self.cached:
            self._evict(next(iter(self.cached)))
        uid = self.next_uid
        self.next_uid += 1
        self.cached[uid] = owner
        self.scope_of[uid] = scope
        self.scopes.setdefault(scope, SuffixTrie(self.cfg.max_depth)).add(uid)
        self.global_queue[uid] = _Queue()
        return uid

    def _trie(self, uid: int) -> SuffixTrie:
        return self.scopes[self.scope_of[uid]]

    def _evict(self, uid: int) -> None:
        owner = self.cached.pop(uid)
        self._drop(uid)
        if owner is not None:
            self.guid[owner] = None

    def _drop(self, uid: int) -> None:
        scope = self.scope_of.pop(uid)
        trie = self.scopes[scope]
        trie.remove(uid)
        del self.global_queue[uid]
        self.finish_pending.discard(uid)
        if scope and not trie.seqs:
            del self.scopes[scope]

    def _enforce_bounds(self, scope: str) -> None:
        while scope in self.scopes and self.scopes[scope].num_tokens > self.max_scope_tokens:
            self._evict(next(u for u in self.cached if self.scope_of[u] == scope))
        while self._total_tokens() > self.cfg.max_cached_tokens and self.cached:
            self._evict(next(iter(self.cached)))

    def _total_tokens(self) -> int:
        return sum(t.num_tokens for t in self.scopes.values())

    # -- requests -------------------------------------------------------------------
    def start(
        self, h: int, prompt: Iterable[int], scope: str = "", use_global: bool = True
    ) -> None:
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
        self.req_scope[h] = scope if use_global else None
        if cfg.global_enabled and use_global:
            uid = self.guid[h] = self._new_cached(scope, h)
            keep = min(len(prompt), cfg.global_prompt_tokens)
            self.global_queue[uid] = _Queue(prompt[len(prompt) - keep :])
        self.work.append((h, self.guid[h]))
        self._advance()

    def _insert_local(self, h: int, tokens: list[int]) -> None:
        trie = self.local[h]
        trie.extend(0, tokens)
        if trie.live_size(0) > self.cfg.max_request_tokens:
            trie.trim(0, len(trie.seqs[0].tokens) - self.cfg.max_request_tokens)

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
                scope = self.scope_of[uid]
                self._trie(uid).extend(uid, tokens)
                self._enforce_bounds(scope)

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
                trie, scope = self._trie(uid), self.scope_of[uid]
                trie.extend(uid, gq.tokens[gq.pos : gq.pos + k])
                gq.pos += k
                self.credit -= k
                if not gq.left() and uid in self.finish_pending:
                    self.finish_pending.discard(uid)
                    trie.finish(uid)
                self._enforce_bounds(scope)
                continue
            self.work.pop(0)

    def flush(self) -> None:
        self.credit = math.inf
        self._advance()
        self.credit = self.cfg.step_insert_tokens

    def _draft(self, h: int, max_nodes: int) -> DraftTuple:
        cfg, hist = self.cfg, self.tail[h]
        sid = 0 if not self.local_queue[h].left() else None
        local = best_in_trie(self.local[h], sid, hist, max_nodes, cfg, self.exhaustive)
        glob: DraftTuple = ([], [], [], 0.0, 0)
        scope = self.req_scope[h]
        if cfg.global_enabled and scope is not None and scope in self.scopes:
            uid = self.guid[h]
            gsid = uid if uid is not None and not self.global_queue[uid].left() else None
            glob = best_in_trie(self.scopes[scope], gsid, hist, max_nodes, cfg, self.exhaustive)
        for name in sorted(self.corpora_):
            corpus, only = self.corpora_[name]
            if only and scope not in only:
                continue
            found = best_in_trie(corpus.trie, None, hist, max_nodes, cfg, self.exhaustive)
            if found[3] > glob[3]:
                glob = found
        if cfg.merge_drafts and cfg.use_tree:
            return merge_drafts(local, glob, max_nodes)
        return local if local[3] >= glob[3] else glob

    def speculate(self, h: int, max_nodes: int) -> DraftTuple:
        return self.speculate_batch([h], max_nodes)[0]

    def speculate_batch(self, hs: Iterable[int], max_nodes: int) -> list[DraftTuple]:
        self._advance()
        out = [self._draft(h, max_nodes) for h in hs]
        self.credit = self.cfg.step_insert_tokens
        return out

    def _end(self, h: int) -> int | None:
        del self.local[h], self.local_queue[h], self.tail[h], self.req_scope[h]
        return self.guid.pop(h)

    def finish(self, h: int) -> None:
        uid = self._end(h)
        if uid is not None:
            if self.global_queue[uid].left():
                self.finish_pending.add(uid)
            else:
                self._trie(uid).finish(uid)
            self.cached[uid] = None

    def abort(self, h: int) -> None:
        uid = self._end(h)
        if uid is not None:
            del self.cached[uid]
            self._drop(uid)

    # -- corpora and warm restarts ------------------------------------------------
    def add_corpus(self, name: str, corpus: ReferenceCorpus, scopes: Sequence[str]) -> None:
        if corpus.trie.max_depth != self.cfg.max_depth:
            raise ValueError("corpus built with another max_depth")
        self.corpora_[name] = (corpus, list(scopes))

    def remove_corpus(self, name: str) -> bool:
        return self.corpora_.pop(name, None) is not None

    def corpora(self) -> dict[str, int]:
        return {name: self.corpora_[name][0].tokens for name in sorted(self.corpora_)}

    def export_cached(self) -> list[tuple[str, list[int]]]:
        out = []
        for uid in self.cached:
            seq = self._trie(uid).seqs[uid]
            q = self.global_queue[uid]
            out.append((self.scope_of[uid], seq.tokens[seq.first :] + q.tokens[q.pos :]))
        return out

    def import_cached(self, scope: str, tokens: Iterable[int]) -> None:
        tokens = check_tokens(tokens)
        if not self.cfg.global_enabled:
            return
        uid = self._new_cached(scope, None)
        trie = self._trie(uid)
        trie.extend(uid, tokens)
        trie.finish(uid)
        self._enforce_bounds(scope)

    def stats(self) -> dict:
        pending = sum(q.left() for q in self.local_queue.values())
        pending += sum(q.left() for q in self.global_queue.values())
        return {
            "active_requests": len(self.local),
            "cached_requests": len(self.cached),
            "cached_tokens": self._total_tokens(),
            "pinned_tokens": 0,
            "global_nodes": sum(t.num_nodes for t in self.scopes.values()),
            "local_nodes": sum(t.num_nodes for t in self.local.values()),
            "local_tokens": sum(t.num_tokens for t in self.local.values()),
            "pending_tokens": pending,
            "memory_bytes": 0,
            "scopes": len(self.scopes),
            "corpora": len(self.corpora_),
            "corpus_tokens": sum(c.tokens for c, _ in self.corpora_.values()),
        }
