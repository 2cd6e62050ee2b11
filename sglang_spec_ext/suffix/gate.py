"""The draft gate: a SUFFIX step verifies only where its drafts pay for the wider verify.

Engine-agnostic (no SGLang, no torch). A fixed-width SUFFIX step verifies ``W`` tokens
per request as soon as one request of the batch has a draft, so a batch of weak drafts
(short matches on text the trees have never seen: random tokens, sampled chat) pays the
wide verify for almost nothing. The gate decides per step, before verifying:

    verify  iff  sum_i E_i  >  bs * r

``E_i``: request ``i``'s expected accepted draft tokens, its draft's raw score
calibrated online per (match length, raw score) cell, each cell's prior the raw score
scaled by what its match-length bucket accepted per unit of raw score (so one bucket's
evidence calibrates its cells before they have their own); ``r``: the verify step's
extra cost over a plain decode step at this batch size, ``t_verify / t_plain - 1``,
from measured step times (the nearest batch-size tier's where this one has too few,
a prior until any tier has both kinds of step). That is the goodput
rule: a verify step commits ``bs + sum E`` tokens in ``t_verify``, a plain step ``bs``
in ``t_plain``. A step the gate closes runs as a plain decode step where the host
path allows one (``sglang/workers/plain_step.py``); where it does not (a CUDA graph of the
verify width runs the step anyway), the measured ``r`` falls towards 0 and the gate
opens by itself.

Acceptance is learned from every draft, verified or not: a verified draft's accepted
count is the tokens its request committed at that step minus the bonus token; a gated
draft is walked against the tokens its request commits over the next steps (exact for
greedy decoding, the same observation a verify would have made with sampling). One
walk per request at a time, so the cost stays one dictionary step per committed token.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from sglang_spec_ext.adaptive.prior import StepCostParams

from .draft import DraftTree
from .lengths import (
    RealisedRatio,
    VerifyCost,
    match_bucket,
    trim_trees,
)
from .node_calibration import NodeCalibration

#: Raw-score bins: width in expected tokens, and the number of bins (the last is open).
SCORE_BIN = 0.5
SCORE_BINS = 16
#: Batch-size tiers of the step-time estimates: bs in (2**(i-1), 2**i].
MAX_TIER = 12


#: Ragged verify before the step-cost fit: one step in this many prices draft nodes at
#: EXPLORE_DISCOUNT of the prior's cost, so that the fit sees verify steps of varied size
#: even where the prior is pessimistic (the served model's roofline on a CPU charges a
#: node most of a decode token: a bs-64 step would never verify, and never learn). The
#: same while the fit is starved of verify steps (``VerifyCost.starved``): a fit that
#: closed the gate would otherwise never see another verify step.
EXPLORE_EVERY = 4
EXPLORE_DISCOUNT = 0.25
#: Padded verify (:meth:`DraftGate.decide`): after this many steps in a row that the gate
#: closed at a batch-size tier although requests had drafts, one verifies, so the tier's
#: verify time stays measured (a first verify timed slow would otherwise close the tier
#: for good: its average moves only with verify steps).
GATED_EXPLORE_EVERY = 32


def score_bin(score: float) -> int:
    return min(int(max(score, 0.0) / SCORE_BIN), SCORE_BINS - 1)


def bs_tier(bs: int) -> int:
    return min(max(0, math.ceil(math.log2(max(bs, 1)))), MAX_TIER)


@dataclass(frozen=True)
class GateConfig:
    """cost_prior: the verify step's extra cost over a plain step (``r``) assumed at a
        batch size until both kinds of step were timed there.
    prior_weight: pseudo-observations of the drafter's own score in each cell.
    min_timings: steps of each kind timed at a batch size before its measured ``r``
        replaces the prior.
    ema: weight of a new step time in the per-tier averages.
    """

    cost_prior: float = 0.1
    prior_weight: float = 4.0
    min_timings: int = 4
    ema: float = 0.1
    #: ragged verify: weigh node probabilities by what verified drafts realised of what
    #: was expected of them (``lengths.RealisedRatio``); False: as calibrated
    realised_scale: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.cost_prior <= 100.0:
            raise ValueError(f"cost_prior={self.cost_prior!r} is invalid: expected [0, 100]")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight={self.prior_weight!r} is invalid: expected > 0")
        if not (isinstance(self.min_timings, int) and self.min_timings >= 1):
            raise ValueError(f"min_timings={self.min_timings!r} is invalid: expected int >= 1")
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"ema={self.ema!r} is invalid: expected (0, 1]")


@dataclass
class _Walk:
    """A gated draft walked against the tokens its request commits next."""

    cell: tuple[int, int]
    raw: float
    children: dict[tuple[int, int], int]  # (parent node, token) -> node
    leaves: frozenset[int]
    node: int = -1
    depth: int = 0


@dataclass
class _Timing:
    n: int = 0
    mean: float = 0.0

    def add(self, seconds: float, ema: float) -> None:
        self.n += 1
        self.mean = seconds if self.n == 1 else (1 - ema) * self.mean + ema * seconds


@dataclass
class DraftGate:
    """Per-step verify-or-plain decision for fixed-width SUFFIX (see the module doc)."""

    config: GateConfig = field(default_factory=GateConfig)
    _acc: dict[tuple[int, int], list[float]] = field(default_factory=dict, repr=False)
    _bucket: dict[int, list[float]] = field(default_factory=dict, repr=False)
    # rid -> (cell, verified nodes, their raw score, whether the whole draft was verified,
    # the calibrated expected accepted tokens of a ragged draft: None for a padded one)
    _verified: dict[Hashable, tuple[tuple[int, int], int, float, bool, float | None]] = field(
        default_factory=dict
    )
    _walks: dict[Hashable, _Walk] = field(default_factory=dict, repr=False)
    _times: dict[tuple[int, bool], _Timing] = field(default_factory=dict, repr=False)
    #: per batch-size tier: drafted steps the gate closed in a row (GATED_EXPLORE_EVERY)
    _gated_run: dict[int, int] = field(default_factory=dict, repr=False)
    steps_verified: int = 0
    steps_gated: int = 0
    #: padded steps verified although the gate was closed (GATED_EXPLORE_EVERY)
    steps_explored: int = 0
    #: Ragged verify (:meth:`trim`): the step-cost fit, and draft nodes drafted / verified.
    cost: VerifyCost | None = None
    #: the served model's analytic step cost (``VerifyCost.roofline``; None: ``cost_prior``)
    roofline: StepCostParams | None = None
    _nodes: NodeCalibration = field(default_factory=NodeCalibration)
    #: (draft, committed tokens) pairs not yet labelled in :attr:`nodes` (one batch a step)
    _labelled: list[tuple[DraftTree, Sequence[int]]] = field(default_factory=list, repr=False)
    _drafts: dict[Hashable, DraftTree] = field(default_factory=dict, repr=False)
    nodes_drafted: int = 0
    nodes_verified: int = 0
    #: ragged steps with a draft priced by the prior or a starved fit (every
    #: EXPLORE_EVERY-th explored)
    explore_trims: int = 0
    #: ragged verify: accepted against expected tokens of the verified drafts
    realised: RealisedRatio = field(default_factory=RealisedRatio)

    @property
    def nodes(self) -> NodeCalibration:
        """Ragged verify's node acceptance, every committed draft labelled in it (the
        step's drafts are labelled together, at the next read)."""
        if self._labelled:
            labelled, self._labelled = self._labelled, []
            self._nodes.observe_many(labelled)
        return self._nodes

    @property
    def explored(self) -> int:
        """Ragged steps priced by the prior or a starved fit that were explored
        (:data:`EXPLORE_EVERY`)."""
        return self.explore_trims // EXPLORE_EVERY

    # -- acceptance -----------------------------------------------------------
    def expected(self, tree: DraftTree) -> float:
        """Calibrated expected accepted tokens of ``tree`` (0 for an empty draft)."""
        if not len(tree):
            return 0.0
        cell = (match_bucket(tree.match_len), score_bin(tree.score))
        w = self.config.prior_weight
        raw = _raw(tree)
        bucket = self._bucket.get(cell[0])
        if bucket is not None:  # accepted per unit of raw score in this bucket
            raw *= (bucket[1] + w) / (bucket[0] + w)
        seen = self._acc.get(cell)
        if seen is None:
            return min(raw, float(len(tree)))
        return min((seen[1] + w * raw) / (seen[0] + w), float(len(tree)))

    def _observe(
        self, cell: tuple[int, int], raw: float, accepted: int, whole: bool = True
    ) -> None:
        if whole:  # the cell's mean is per whole draft; a cut draft informs the bucket only
            seen = self._acc.setdefault(cell, [0.0, 0.0])
            seen[0] += 1.0
            seen[1] += accepted
        bucket = self._bucket.setdefault(cell[0], [0.0, 0.0])
        bucket[0] += raw
        bucket[1] += accepted

    def on_committed(self, rid: Hashable, tokens: Sequence[int]) -> None:
        """Tokens ``rid`` committed since its last draft (a step's accepted tokens and
        bonus; the prefix of several steps' for a gated draft's walk)."""
        if not tokens:
            return
        draft = self._drafts.pop(rid, None)
        if draft is not None:  # ragged verify: label the whole draft's nodes (batched)
            self._labelled.append((draft, list(tokens)))
        verified = self._verified.pop(rid, None)
        if verified is not None:
            cell, size, raw, whole, expected = verified
            accepted = max(0, min(len(tokens) - 1, size))
            self._observe(cell, raw, accepted, whole)
            if expected is not None:
                self.realised.observe(expected, accepted)
        walk = self._walks.get(rid)
        if walk is None:
            return
        for token in tokens:
            nxt = walk.children.get((walk.node, int(token)))
            if nxt is None:
                break
            walk.node, walk.depth = nxt, walk.depth + 1
            if nxt in walk.leaves:
                break
        else:
            return  # still on a draft path: more tokens decide
        del self._walks[rid]
        self._observe(walk.cell, walk.raw, walk.depth)

    def forget(self, rid: Hashable) -> None:
        self._verified.pop(rid, None)
        self._drafts.pop(rid, None)
        self._walks.pop(rid, None)

    # -- the decision -----------------------------------------------------------
    def extra_cost(self, bs: int) -> float:
        """``r`` at ``bs``: measured at its tier, else at the nearest tier where both kinds
        of step were timed (the smaller one on a tie), else the prior."""
        tier = bs_tier(bs)
        measured = [t for t in range(MAX_TIER + 1) if self._measured(t) is not None]
        if not measured:
            return self.config.cost_prior
        nearest = min(measured, key=lambda t: (abs(t - tier), t))
        return self._measured(nearest)

    def _measured(self, tier: int) -> float | None:
        plain, verify = self._times.get((tier, False)), self._times.get((tier, True))
        need = self.config.min_timings
        if plain is None or verify is None or plain.n < need or verify.n < need:
            return None
        if plain.mean <= 0:
            return None
        return max(0.0, verify.mean / plain.mean - 1.0)

    def decide(self, rids: Sequence[Hashable], trees: Sequence[DraftTree]) -> bool:
        """Whether this step verifies ``trees`` (True) or runs plain (False); records
        every draft for the acceptance tables either way."""
        expected = [self.expected(t) for t in trees]
        total = sum(expected)
        verify = total > 0 and total > len(trees) * self.extra_cost(len(trees))
        if total > 0:
            tier = bs_tier(len(trees))
            run = 0 if verify else self._gated_run.get(tier, 0) + 1
            if run >= GATED_EXPLORE_EVERY:
                verify, run = True, 0
                self.steps_explored += 1
            self._gated_run[tier] = run
        for rid, tree in zip(rids, trees, strict=True):
            self._verified.pop(rid, None)
            if not len(tree):
                continue
            cell = (match_bucket(tree.match_len), score_bin(tree.score))
            if verify:
                self._verified[rid] = (cell, len(tree), _raw(tree), True, None)
            elif rid not in self._walks:
                self._walks[rid] = _walk(cell, tree)
        if total > 0:
            if verify:
                self.steps_verified += 1
            else:
                self.steps_gated += 1
        return verify

    def trim(
        self, rids: Sequence[Hashable], trees: Sequence[DraftTree], width: int
    ) -> list[DraftTree]:
        """Ragged verify: each draft cut to the nodes worth their verify cost at this
        step (``suffix/lengths.py``: the batch's most probable nodes, acceptance
        calibrated per node by :attr:`nodes` as a product of chances given the parent,
        against the fitted step cost); empty drafts
        everywhere make a plain step. Records every draft for the acceptance tables, as
        :meth:`decide` does, and keeps it whole to label its nodes with what the request
        commits next."""
        if self.cost is None:
            self.cost = VerifyCost(self.config.cost_prior, roofline=self.roofline)
        t0, fixed, per_draft = self.cost.step_costs(len(trees), width)
        if (not self.cost.fitted or self.cost.starved) and any(len(t) for t in trees):
            self.explore_trims += 1
            if self.explore_trims % EXPLORE_EVERY == 0:
                fixed, per_draft = fixed * EXPLORE_DISCOUNT, per_draft * EXPLORE_DISCOUNT
        scale = self.realised.scale if self.config.realised_scale else 1.0
        cut, expected = trim_trees(trees, self.nodes.calibrate_many, t0, per_draft, fixed, scale)
        drafted = verified = 0
        for rid, full, mine, exp in zip(rids, trees, cut, expected, strict=True):
            self._verified.pop(rid, None)
            self._drafts.pop(rid, None)
            if not len(full):
                continue
            self._drafts[rid] = full
            drafted += len(full)
            verified += len(mine)
            cell = (match_bucket(full.match_len), score_bin(full.score))
            if len(mine):
                whole = len(mine) == len(full)
                self._verified[rid] = (cell, len(mine), _raw(mine), whole, exp)
            elif rid not in self._walks:
                self._walks[rid] = _walk(cell, full)
        self.nodes_drafted += drafted
        self.nodes_verified += verified
        if drafted:
            if verified:
                self.steps_verified += 1
            else:
                self.steps_gated += 1
        return cut

    def on_step_time(
        self, bs: int, verified: bool, seconds: float, drafts: int | None = None
    ) -> None:
        """Wall time of one decode step of ``bs`` requests, verified or plain (and, under
        ragged verify, the draft nodes it verified: the step-cost fit's input)."""
        if drafts is not None and self.cost is not None:
            self.cost.on_step(bs, drafts, seconds)
        if seconds > 0 and math.isfinite(seconds):
            key = (bs_tier(bs), bool(verified))
            self._times.setdefault(key, _Timing()).add(seconds, self.config.ema)

    def stats(self) -> dict[str, object]:
        """Counters and the per-tier extra cost in force (for the stats line)."""
        tiers = sorted({t for t, _ in self._times})
        return {
            "gate_steps_verified": self.steps_verified,
            "gate_steps_plain": self.steps_gated,
            "gate_steps_explored": self.steps_explored,
            "gate_extra_cost": {f"bs<={2**t}": round(self.extra_cost(2**t), 3) for t in tiers},
            "gate_walks": len(self._walks),
            **(
                {}
                if self.cost is None
                else {
                    "lengths_nodes_drafted": self.nodes_drafted,
                    "lengths_nodes_verified": self.nodes_verified,
                    "lengths_explored_steps": self.explored,
                    **self.cost.stats(),
                    **self.nodes.stats(),
                    **self.realised.stats(),
                }
            ),
        }


def _raw(tree: DraftTree) -> float:
    """The drafter's own expected accepted tokens (its path probabilities' sum)."""
    return min(max(float(tree.score), 0.0), float(len(tree)))


def _walk(cell: tuple[int, int], tree: DraftTree) -> _Walk:
    children: dict[tuple[int, int], int] = {}
    has_child = set()
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        children.setdefault((parent, int(token)), i)  # the first such child, as a verifier
        has_child.add(parent)
    leaves = frozenset(i for i in range(len(tree)) if i not in has_child)
    return _Walk(cell=cell, raw=_raw(tree), children=children, leaves=leaves)
