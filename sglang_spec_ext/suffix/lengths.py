"""Per-request verify lengths chosen for goodput (ragged verify). Engine-agnostic.

With ragged verify each request puts its own draft through the target, so the question
a step answers is no longer "verify at which width" but "which draft nodes are worth
their verify cost". A step that verifies ``D`` draft nodes for ``bs`` requests takes

    t(bs, D) = t0(bs) + e + b * D    (D > 0; t0: the plain decode step at this batch
                                      size, e: what any verify step costs on top)

and commits ``bs + sum p`` tokens, ``p`` the calibrated acceptance probability of each
verified node. Tokens per second is maximised by the ``k`` most probable nodes for the
``k`` that maximises ``(bs + S_k) / (t0 + e + b k)`` against ``bs / t0`` for a plain step
(equal costs per node: the best set is always a top-``k`` prefix). Path probabilities never grow along a path, so a top-``k``
set keeps every chosen node's parent (ties go to the lower index, the parent); a node
whose parent was not chosen is dropped all the same. ``k = 0`` is a plain step.

:class:`~.node_calibration.NodeCalibration` turns the drafter's probabilities into acceptance probabilities
from the tokens requests commit, as a chance given the parent (the drafter's own are far
too confident on text it has seen once: a single continuation reads as 1).

:class:`VerifyCost` learns ``t0``, ``e`` and ``b`` from timed steps: least squares of step
time on ``(1, bs, [D > 0], D)`` over a bounded window of recent steps; until the window holds both
plain and verify steps with different ``D`` (or when the fit is degenerate) a prior
stands in: the analytic roofline of the served model on its device where the engine gives
one (``adaptive/prior.py: ragged_step_costs``: on a CPU a verified node costs most of a
decode token, on a GPU's memory-bound decode next to nothing), else a verify of every
request at the full width costing ``1 + r`` plain steps (``r``: the draft gate's
``cost_prior``). A prior that calls verify cheap where it is not makes the first steps of
a cold server slower than plain decoding (measured on the CPU engine: a bs-64 step
verifying 200-330 nodes took 3-4 plain steps' time, the ``1 + r`` prior priced it 1.1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_spec_ext.adaptive.prior import StepCostParams, ragged_step_costs

from .draft import DraftTree

#: Steps the cost fit looks back over.
WINDOW = 256
#: Timed steps before the fit replaces the prior.
MIN_STEPS = 16
#: Verify steps the window holds below which the fit counts as starved (:attr:`VerifyCost.
#: starved`): a fit whose verify steps aged out is kept as it was, however stale.
MIN_VERIFY_STEPS = 8
#: Match-length buckets' upper bounds (the last bucket is open), shared with the gate.
MATCH_EDGES = (1, 2, 3, 5, 8, 12, 16, 24, 32)
MATCH_BUCKETS = len(MATCH_EDGES) + 1


def match_bucket(match_len: int) -> int:
    for i, edge in enumerate(MATCH_EDGES):
        if match_len <= edge:
            return i
    return len(MATCH_EDGES)


@dataclass
class VerifyCost:
    """``t(bs, D) = a + c * bs + e * [D > 0] + b * D`` from timed steps (the module doc)."""

    cost_prior: float = 0.1
    window: int = WINDOW
    #: the analytic prior's constants for the served model and device (None: ``cost_prior``)
    roofline: StepCostParams | None = None
    _steps: deque = field(default_factory=deque, repr=False)
    _fit: tuple[float, float, float, float] | None = None  # (a, c, e, b): the last good fit
    _dirty: bool = False
    #: steps priced by the prior (before the fit): the cold start's length
    prior_steps: int = 0
    #: steps in the window that verified draft nodes
    verify_steps: int = 0

    def on_step(self, bs: int, drafts: int, seconds: float) -> None:
        """One decode step of ``bs`` requests that verified ``drafts`` draft nodes (0: a
        plain step) took ``seconds``."""
        if not (seconds > 0 and np.isfinite(seconds)) or bs < 1:
            return
        self._steps.append((float(bs), float(drafts), float(seconds)))
        self.verify_steps += drafts > 0
        while len(self._steps) > self.window:
            self.verify_steps -= self._steps.popleft()[1] > 0
        self._dirty = True

    @property
    def starved(self) -> bool:
        """Whether a fit prices the steps on fewer than :data:`MIN_VERIFY_STEPS` verify
        steps in its window. A fit that calls verify too dear (one slow step early on
        can) closes the gate, the window then fills with plain steps, and a window
        without verify steps cannot refit: the stale fit would price every step after
        it. The gate explores while the fit is starved, as before the fit."""
        return self.fitted and self.verify_steps < MIN_VERIFY_STEPS

    def _refit(self) -> None:
        self._dirty = False
        if len(self._steps) < MIN_STEPS:
            return
        data = np.asarray(self._steps, dtype=np.float64)
        bs, drafts, t = data[:, 0], data[:, 1], data[:, 2]
        verify = (drafts > 0).astype(np.float64)
        if np.ptp(verify) <= 0 or np.ptp(drafts[drafts > 0]) <= 0:
            return  # no plain steps, or D never varied: not identifiable, keep what we had
        cols = [np.ones_like(bs), verify, drafts] + ([bs] if np.ptp(bs) > 0 else [])
        coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), t, rcond=None)
        if coef[2] < 0:  # flat in D, the slope noise (a CPU at bs 1: one GEMM block):
            del cols[2]  # b = 0, the rest fitted without it
            coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), t, rcond=None)
            coef = np.insert(coef, 2, 0.0)
        a, e, b = float(coef[0]), float(coef[1]), float(coef[2])
        c = float(coef[3]) if len(coef) > 3 else 0.0
        if not np.isfinite(coef).all() or a + c * bs.min() <= 0:
            return
        self._fit = (a, c, max(e, 0.0), b)

    @property
    def fitted(self) -> bool:
        """Whether step costs come from the fit (not the prior)."""
        if self._dirty:
            self._refit()
        return self._fit is not None

    def step_costs(self, bs: int, width: int) -> tuple[float, float, float]:
        """``(t0(bs), e, b)``: the plain step's time, a verify step's extra fixed cost and
        one verified draft node's, in the fit's seconds, else the roofline prior's
        seconds, else from ``cost_prior`` in units of the plain step (``t0 = 1``,
        ``e = 0``)."""
        if self._dirty:
            self._refit()
        if self._fit is not None:
            a, c, e, b = self._fit
            t0 = a + c * bs
            if t0 > 0:
                return t0, e, b
        self.prior_steps += 1
        if self.roofline is not None:
            return ragged_step_costs(self.roofline, bs, width)
        return 1.0, 0.0, self.cost_prior / max(bs * max(width - 1, 1), 1)

    def stats(self) -> dict[str, object]:
        fit = self._fit
        return {
            "lengths_cost_fit": None
            if fit is None
            else {
                "a_ms": round(fit[0] * 1e3, 3),
                "c_ms": round(fit[1] * 1e3, 4),
                "e_ms": round(fit[2] * 1e3, 4),
                "b_ms": round(fit[3] * 1e3, 4),
            },  # fmt: skip
            "lengths_cost_steps": len(self._steps),
            "lengths_prior_steps": self.prior_steps,
            "lengths_cost_verify_steps": self.verify_steps,
        }


@dataclass
class RealisedRatio:
    """Accepted tokens of verified drafts against what the calibration expected of them.

    :class:`~.node_calibration.NodeCalibration` is calibrated over every labelled node, but a step verifies
    the batch's *most* probable ones, and a top-``k`` choice over noisy estimates picks
    those whose estimate erred high (the winner's curse): where nodes are near the cost
    line (a large batch on a CPU, a cold server's thin cells) the verified nodes then
    accept less than the step was priced for, and the step is slower than plain decoding.
    The ratio, decayed over recent drafts, scales the probabilities the next choices
    weigh (:func:`trim_trees`), clipped to ``[low, high]``; ``prior`` expected
    tokens of agreement (ratio 1) stand in before evidence."""

    decay: float = 0.995
    prior: float = 16.0
    low: float = 0.25
    high: float = 1.5
    expected: float = 0.0
    realised: float = 0.0
    drafts: int = 0

    def observe(self, expected: float, realised: int) -> None:
        """One verified draft: its expected and its accepted draft tokens."""
        if not (expected >= 0 and np.isfinite(expected)):
            return
        self.expected = self.expected * self.decay + expected
        self.realised = self.realised * self.decay + max(int(realised), 0)
        self.drafts += 1

    @property
    def ratio(self) -> float:
        return (self.realised + self.prior) / (self.expected + self.prior)

    @property
    def scale(self) -> float:
        return float(min(max(self.ratio, self.low), self.high))

    def stats(self) -> dict[str, object]:
        return {"lengths_realised_over_expected": round(self.ratio, 3),
                "lengths_realised_drafts": self.drafts}  # fmt: skip


def best_count(probs: np.ndarray, bs: int, t0: float, b: float, e: float = 0.0) -> int:
    """How many of ``probs`` (sorted descending) maximise ``(bs + S_k) / (t0 + e + b k)``
    (``bs / t0`` for none)."""
    if probs.size == 0:
        return 0
    k = np.arange(probs.size + 1, dtype=np.float64)
    gain = bs + np.concatenate(([0.0], np.cumsum(probs)))
    cost = t0 + b * k + np.where(k > 0, e, 0.0)
    return int(np.argmax(gain / cost))  # the first maximum: fewest nodes on a tie


def trim_trees(
    trees: Sequence[DraftTree],
    calibrate: Callable[[Sequence[DraftTree]], Sequence[np.ndarray]],
    t0: float,
    b: float,
    e: float = 0.0,
    scale: float = 1.0,
) -> tuple[list[DraftTree], list[float]]:
    """Each tree cut to its nodes among the batch's best ``k`` (see the module doc), and
    each cut tree's expected accepted tokens (the calibrated probabilities of its kept
    nodes, summed). ``calibrate(trees)`` gives each node's acceptance probability per
    tree, never above its parent's (e.g. :meth:`~.node_calibration.NodeCalibration.
    calibrate_many`); trees without probabilities are left whole. ``scale`` multiplies the probabilities the choice weighs
    (capped at 1; the expected sums stay unscaled): what requests realised against what
    was expected of the nodes chosen before (:class:`RealisedRatio`)."""
    bs = len(trees)
    sizes = [len(t) for t in trees]
    total = sum(sizes)
    if total == 0:
        return list(trees), [0.0] * bs
    probs = np.empty(total, dtype=np.float64)
    owner = np.repeat(np.arange(bs), sizes)
    probable = [
        i for i, (t, n) in enumerate(zip(trees, sizes, strict=True)) if 0 < n <= len(t.probs)
    ]
    calibrated = dict(zip(probable, calibrate([trees[i] for i in probable]), strict=True))
    start = 0
    for i, (tree, n) in enumerate(zip(trees, sizes, strict=True)):
        if i in calibrated:
            probs[start : start + n] = np.clip(calibrated[i][:n], 0.0, 1.0)
        else:  # no probabilities: the draft's score spread evenly
            probs[start : start + n] = min(float(tree.score) / max(n, 1), 1.0)
        start += n
    index = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    order = np.lexsort((index, owner, -probs))  # most probable first; parents first on ties
    weighed = probs[order] if scale == 1.0 else np.minimum(probs[order] * scale, 1.0)
    k = best_count(weighed, bs, t0, b, e)
    chosen = np.zeros(total, dtype=bool)
    chosen[order[:k]] = True
    expected = np.bincount(owner, weights=np.where(chosen, probs, 0.0), minlength=bs)
    out: list[DraftTree] = []
    start = 0
    for tree, n in zip(trees, sizes, strict=True):
        keep = chosen[start : start + n]
        start += n
        out.append(tree if keep.all() else _subtree(tree, keep))
    return out, [float(x) for x in expected]


def _subtree(tree: DraftTree, keep: np.ndarray) -> DraftTree:
    """``tree`` restricted to the nodes in ``keep`` whose ancestors are all kept."""
    new_index: dict[int, int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    origins: list[int] = []
    for i, parent in enumerate(tree.parents):
        if not keep[i] or (parent >= 0 and parent not in new_index):
            continue
        new_index[i] = len(tokens)
        tokens.append(tree.tokens[i])
        parents.append(-1 if parent < 0 else new_index[parent])
        if i < len(tree.probs):
            probs.append(tree.probs[i])
        if tree.origins:
            origins.append(tree.origins[i])
    score = float(sum(probs)) if probs else 0.0
    return DraftTree(tokens=tokens, parents=parents, probs=probs, score=score,
                     match_len=tree.match_len if tokens else 0, origins=origins)  # fmt: skip
