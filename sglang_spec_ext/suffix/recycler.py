"""The recycled draft source beside the suffix trees, for a worker or the replay.

Per step and batch (engine-agnostic; the serving worker and ``replay`` call the same three
methods in the same order):

1. :meth:`Recycler.observe`: what each request committed since its last draft. Each
   committed transition ``x -> y`` teaches the rank rates (was ``y`` the table's rank-r
   successor of ``x``?), and the request's last suffix draft is labelled for the suffix
   nodes' calibration.
2. :meth:`Recycler.feed`: the target's top-k at the rows of the step's verify (or, in
   replay, at the committed positions of the trace): the table's refresh.
3. :meth:`Recycler.draft`: each request's suffix draft merged with a recycled draft below
   the same root, nodes chosen by calibrated acceptance (``recycling.merge_trees``).

The suffix nodes' estimates are the suffix trees' probabilities calibrated online against
what the target committed (``node_calibration.NodeCalibration``, the draft gate's), so a
short, uncertain suffix match does not crowd out the recycled nodes and a long repeated
match keeps its nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .draft import RECYCLED_NODE, DraftTree
from .node_calibration import NodeCalibration
from .recycling import RankRates, RecyclingTable, fill_template, merge_trees, rank_template


@dataclass(frozen=True)
class RecycleConfig:
    """``k``: successors kept per token (0 turns the source off); ``max_scopes``: tables
    kept (one per tenant scope, least recently used evicted); ``min_prob``: recycled
    nodes below this estimated path acceptance are not drafted; ``max_depth``: deepest
    recycled node; ``vocab_size``: the served model's, the largest table a scope gets."""

    k: int = 8
    max_scopes: int = 16
    min_prob: float = 0.02
    max_depth: int = 12
    vocab_size: int = 0  # the served model's (0: unknown; tables grow to 2^20 ids at most)

    @property
    def enabled(self) -> bool:
        return self.k > 0


class Recycler:
    """The table, the rank rates, the suffix nodes' calibration (see the module doc)."""

    def __init__(
        self, config: RecycleConfig | None = None, calibration: NodeCalibration | None = None
    ) -> None:
        """``calibration``: the suffix nodes' calibration to read, learned by its owner
        (the draft gate's, which labels every draft it sees); None: one of its own,
        labelled here with each request's last suffix draft."""
        self.config = config or RecycleConfig()
        k = max(1, self.config.k)
        vocab = self.config.vocab_size
        self.table = RecyclingTable(k, self.config.max_scopes, vocab if vocab > 0 else 1 << 20)
        self.rates = RankRates(k)
        self._learns_calibration = calibration is None
        self.suffix_calibration = calibration if calibration is not None else NodeCalibration()
        self._last: dict[Hashable, DraftTree] = {}  # rid -> its last suffix draft
        self._pending: list[tuple[DraftTree, Sequence[int]]] = []
        self._template_key: tuple | None = None
        self._template: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.steps = 0
        self.nodes_drafted = 0
        self.recycled_nodes_drafted = 0

    # -- 1. what was committed ---------------------------------------------------------
    def observe(
        self, rid: Hashable, scope: Hashable, before: int, committed: Sequence[int]
    ) -> None:
        """``committed``: the tokens ``rid`` committed since its last draft, ``before`` the
        token preceding them (its last draft's root)."""
        self.observe_many([(rid, scope, before, committed)])

    def observe_many(self, items: Sequence[tuple[Hashable, Hashable, int, Sequence[int]]]) -> None:
        """:meth:`observe` of a step's ``(rid, scope, before, committed)``, one table
        lookup per scope."""
        by_scope: dict[Hashable, list[np.ndarray]] = {}
        for rid, scope, before, committed in items:
            if not committed:
                continue
            seq = np.fromiter((before, *committed), dtype=np.int64, count=len(committed) + 1)
            by_scope.setdefault(scope, []).append(seq)
            last = self._last.pop(rid, None)
            if last is not None and len(last) and self._learns_calibration:
                self._pending.append((last, list(committed)))
        for scope, seqs in by_scope.items():
            prev = np.concatenate([q[:-1] for q in seqs])
            nxt = np.concatenate([q[1:] for q in seqs])
            self.rates.observe(self.table.rows(scope, prev), nxt)

    def forget(self, rid: Hashable) -> None:
        """``rid`` left (finished, aborted): its last draft is no longer labelled."""
        self._last.pop(rid, None)

    # -- 2. the target's top-k ---------------------------------------------------------
    def feed(self, scope: Hashable, tokens: np.ndarray, topk: np.ndarray) -> None:
        self.table.feed(scope, tokens, topk)

    # -- 3. the merged drafts ----------------------------------------------------------
    def template(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rates = self.rates.rates()
        key = (budget, tuple(np.round(rates, 2)))
        if key != self._template_key:
            self._template_key = key
            self._template = rank_template(rates, budget, self.config.max_depth)
        return self._template

    def draft(
        self,
        rids: Sequence[Hashable],
        scopes: Sequence[Hashable],
        roots: Sequence[int],
        suffix_trees: Sequence[DraftTree],
        budget: int,
    ) -> list[DraftTree]:
        """Each request's draft of at most ``budget`` nodes: its suffix draft merged with
        the recycled one (the suffix draft alone where the source is off or the table
        knows nothing below the root)."""
        if self._pending:
            self.suffix_calibration.observe_many(self._pending)
            self._pending = []
        if self._learns_calibration:
            for rid, tree in zip(rids, suffix_trees, strict=True):
                self._last[rid] = tree
        if not self.config.enabled or budget <= 0:
            return [t.first(budget) for t in suffix_trees]
        recycled = fill_template(
            self.table, scopes, roots, self.template(budget), self.config.min_prob
        )
        calibrated = self.suffix_calibration.calibrate_many(list(suffix_trees))
        out = [
            merge_trees(s, c if len(s) else None, r, budget)
            for s, c, r in zip(suffix_trees, calibrated, recycled, strict=True)
        ]
        self.steps += 1
        for tree in out:
            self.nodes_drafted += len(tree)
            self.recycled_nodes_drafted += sum(1 for o in tree.origins if o == RECYCLED_NODE)
        return out

    def stats(self) -> dict[str, object]:
        return {
            "recycle_k": self.config.k,
            "recycle_scopes": self.table.scopes(),
            "recycle_table_bytes": self.table.nbytes(),
            "recycle_rows_fed": self.table.rows_fed,
            "recycle_rank_rates": [round(float(r), 3) for r in self.rates.rates()],
            "recycle_transitions_seen": int(self.rates.seen),
            "recycle_nodes_drafted": self.nodes_drafted,
            "recycle_recycled_nodes_drafted": self.recycled_nodes_drafted,
        }
