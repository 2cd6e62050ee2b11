"""SUFFIX's draft sources in one step: the suffix trees, the grammar's shaping of
structured-output requests' drafts (``suffix_grammar.py``), and the target's own top-k
recycled beside the trees.

The recycled source's engine-agnostic part is ``suffix/recycler.py`` (the table per tenant
scope, the rank rates, the merged trees). This mixin is what the worker adds around the
host's step:

* after each decode step (verify, or a plain / narrow step), the top-k of the step's
  logits rows is taken on the device (``torch.topk``, launched on the step's stream
  behind the verify) and copied to the host without waiting (a pinned buffer on a GPU,
  an event recorded). Nothing waits on it in the step: the next step's draft reads it
  after the overlap relay's read (or the scheduler's result processing without overlap)
  has already waited for the whole stream, so the copy has landed by then.
* at the next step, each request's committed tokens (``_sync``) say which rows were on
  the target's path: the root and the accepted draft nodes (the walk of the request's
  last draft against its committed tokens). Those rows' top-k are fed to the request's
  scope, exactly what the replay feeds (``replay/recycle.py``), and the committed
  transitions teach the rank rates.
* drafting merges each request's suffix draft with a recycled one (``_recycle_merge``).

Under TP every rank verifies the first rank's drafts (``tp_sync.py``), so only the first
rank's table decides what is drafted; each rank feeds its own from the gathered logits,
with no collective. Grammar requests keep their grammar-shaped suffix drafts (not merged).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.recycler import Recycler

logger = logging.getLogger("sglang_spec_ext")


def accepted_path(tree: DraftTree, committed: Sequence[int]) -> list[int]:
    """Indices of ``tree``'s nodes on the target's path: node by node, the child of the
    last matched node (the root first) whose token is the next committed token."""
    if not tree.tokens:
        return []
    child = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens, strict=True))}
    path: list[int] = []
    parent = -1
    for tok in committed:
        nxt = child.get((parent, int(tok)))
        if nxt is None:
            break
        path.append(nxt)
        parent = nxt
    return path


class DraftSourcesMixin:
    """The worker's draft sources (see the module doc)."""

    def _drafts(
        self,
        reqs: list,
        rids: list[str],
        ok: list[bool],
        slots: int,
        prevs: list[list[int]],
        roots: list[int] | None = None,
    ) -> list[DraftTree]:
        """Each request's draft of up to ``slots`` nodes (empty where its session is not
        live): its suffix draft merged with a recycled one where ``roots`` are given and
        the source is on; a grammar request's drafted from more candidates and shaped by
        its grammar (suffix_grammar.py). ``prevs``: each request's committed tokens not yet
        in ``req.output_ids`` (overlap relay)."""
        matchers = [self._grammar.matcher_of(req, prev) if good else None
                    for req, good, prev in zip(reqs, ok, prevs, strict=True)]  # fmt: skip
        trees = [DraftTree() for _ in reqs]
        plain = [i for i, good in enumerate(ok) if good and matchers[i] is None]
        shaped = [i for i, m in enumerate(matchers) if m is not None]
        for group, nodes in ((plain, slots), (shaped, self._grammar.candidates(slots))):
            for i, tree in zip(
                group, self._speculate([rids[i] for i in group], nodes), strict=True
            ):
                trees[i] = tree
        if shaped:
            trees = self._grammar.shape_batch(reqs, trees, slots, matchers, prevs)
        if roots is not None:
            trees = self._recycle_merge(reqs, rids, roots, trees, slots, plain)
        return trees

    def _init_recycle(self, config: Any) -> None:
        rc = config.recycle_config()
        runner = getattr(self, "model_runner", None)  # absent for a drafting-only worker
        vocab = getattr(getattr(runner, "model_config", None), "vocab_size", 0) or 0
        rc = dataclasses.replace(rc, vocab_size=int(vocab))
        # its own calibration of the suffix nodes, as in the replay (the draft gate's
        # labels every draft only under ragged verify)
        self._recycler: Recycler | None = Recycler(rc) if rc.enabled else None
        # rid -> (row of its root in the last step's top-k, its draft, its root, scope)
        self._recycle_rows: dict[Hashable, tuple[int, DraftTree, int, Hashable]] = {}
        self._recycle_step: dict[Hashable, tuple[int, DraftTree, int, Hashable]] = {}
        self._recycle_topk: torch.Tensor | None = None  # the last step's, on the host
        self._recycle_event: Any = None
        self._recycle_skipped = 0  # steps whose logits rows did not match their drafts
        self._recycle_seen: list[tuple[Hashable, Hashable, int, list[int]]] = []
        self._recycle_feeds: dict[Hashable, tuple[list[int], list[int]]] = {}

    # -- drafting ------------------------------------------------------------------
    def _recycle_merge(
        self,
        reqs: list,
        rids: list[Hashable],
        roots: list[int],
        trees: list[DraftTree],
        budget: int,
        plain: list[int],
    ) -> list[DraftTree]:
        """``trees`` with the plain (non-grammar) requests' drafts merged with recycled
        ones; every drafted request's tree recorded for the feed after its step."""
        rec = self._recycler
        if rec is None:
            return trees
        self._recycle_flush()
        if plain:
            scopes = [self._scope_of(reqs[i]) for i in plain]
            merged = rec.draft(
                [rids[i] for i in plain],
                scopes,
                [roots[i] for i in plain],
                [trees[i] for i in plain],
                budget,
            )
            for i, tree in zip(plain, merged, strict=True):
                trees[i] = tree
        return trees

    def _recycle_record(
        self, reqs: list, rids: list[Hashable], roots: list[int], trees: list[DraftTree]
    ) -> None:
        """The step's final drafts (after caps, the gate and packing), per request, for
        reading its logits rows at the next step."""
        if self._recycler is None:
            return
        self._recycle_step = {
            rid: (b, tree, root, self._scope_of(req))
            for b, (req, rid, root, tree) in enumerate(zip(reqs, rids, roots, trees, strict=True))
        }

    def _scope_of(self, req: Any) -> Hashable:
        session = getattr(self, "_sessions", {}).get(req.rid)
        if session is not None:  # computed when its session started (suffix_sessions.py)
            return session.scope
        return self._request_scope(req)

    # -- after the step: the top-k, without a wait -----------------------------------
    def _recycle_tap(self, batch: Any, result: Any) -> None:
        """Launch the top-k of the step's logits rows and its copy to the host."""
        step, self._recycle_step = self._recycle_step, {}
        rec = self._recycler
        if rec is None:
            return
        self._recycle_feeds = {}  # rows of the previous top-k not fed by now never will be
        logits = getattr(getattr(result, "logits_output", None), "next_token_logits", None)
        bs = len(step)
        if logits is None or not bs or logits.dim() != 2:
            return
        rows = logits.shape[0]
        if rows % bs:
            self._recycle_skipped += 1
            return
        stride = rows // bs
        if any(len(tree.parents) >= stride for _b, tree, _r, _s in step.values()):
            self._recycle_skipped += 1  # a plain step, or rows other than the drafts'
            step = {rid: (b, DraftTree(), root, s) for rid, (b, _t, root, s) in step.items()}
        k = rec.config.k
        with torch.no_grad():
            topk = torch.topk(logits, k, dim=-1).indices.to(torch.int32)
            if topk.is_cpu:
                host, event = topk, None
            else:
                host = torch.empty(topk.shape, dtype=torch.int32, pin_memory=True)
                host.copy_(topk, non_blocking=True)
                event = torch.get_device_module(topk.device).Event()
                event.record()
        self._recycle_topk, self._recycle_event = host, event
        self._recycle_rows = {
            rid: (b * stride, tree, root, s) for rid, (b, tree, root, s) in step.items()
        }

    # -- at the next step: what was committed, the feed --------------------------------
    def _on_committed(self, rid: Hashable, scope: Hashable, before: int, new: list[int]) -> None:
        """``rid`` committed ``new`` after ``before``: queued for :meth:`_recycle_flush` (the
        rank rates learn the transitions; the rows of its last step on the target's path
        are fed to that step's scope)."""
        if self._recycler is None or not new:
            return
        self._recycle_seen.append((rid, scope, before, list(new)))
        entry = self._recycle_rows.pop(rid, None)
        if entry is None or self._recycle_topk is None:
            return
        row, tree, root, step_scope = entry
        if root != before:
            return  # not the step these tokens came from
        path = accepted_path(tree, new)
        # The root's and the accepted nodes' rows: the target's own path, what the replay
        # feeds from a trace. (Feeding the rejected nodes' rows too moved nothing measurable
        # on SmolLM2 first-time chat, 1.25 against 1.24 accept length, and would leave the
        # replay inexact.)
        rows = [row] + [row + 1 + j for j in path]
        tokens = [root] + [tree.tokens[j] for j in path]
        self._recycle_feeds.setdefault(step_scope, ([], []))
        self._recycle_feeds[step_scope][0].extend(rows)
        self._recycle_feeds[step_scope][1].extend(tokens)

    def _recycle_flush(self) -> None:
        """The step's observations, then its feeds, each batched per scope: what the
        requests committed teaches the rank rates against the table they were drafted
        from, then the table takes the rows of the target's path."""
        rec = self._recycler
        seen, self._recycle_seen = self._recycle_seen, []
        feeds, self._recycle_feeds = self._recycle_feeds, {}
        if rec is None:
            return
        if seen:
            rec.observe_many(seen)
        if not feeds or self._recycle_topk is None:
            return
        if self._recycle_event is not None:
            self._recycle_event.synchronize()  # already complete: the relay read waited
            self._recycle_event = None
        top = self._recycle_topk.numpy()
        for scope, (rows, tokens) in feeds.items():
            idx = np.asarray(rows, dtype=np.int64)
            if idx.size and int(idx.max()) < top.shape[0]:
                rec.feed(scope, np.asarray(tokens, dtype=np.int64), top[idx])

    def _recycle_forget(self, rid: Hashable) -> None:
        if self._recycler is not None:
            self._recycler.forget(rid)
            self._recycle_rows.pop(rid, None)

    def drafter_stats(self) -> dict:
        stats = super().drafter_stats()
        if hasattr(self, "_recycler"):  # HYBRID's drafting-only worker reports none
            stats.update(self.recycle_stats())
        return stats

    def recycle_stats(self) -> dict[str, object]:
        if self._recycler is None:
            return {"recycle_k": 0}
        return {**self._recycler.stats(), "recycle_steps_skipped": self._recycle_skipped}
