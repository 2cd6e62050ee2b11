"""Online acceptance estimation per draft depth and draft budget.

Observation: after a verify step at budget ``k`` (``k`` draft nodes per request), a
request accepted ``a`` draft tokens (bonus excluded, ``0 <= a <= k``): its accepted
path reached depths ``1..a`` and, if ``a < k``, stopped before depth ``a + 1``.

Model
-----
Per budget bucket ``b`` (the positive candidate ``k``; a step at a ``k`` between
buckets counts for the largest bucket ``<= k``) and depth ``d`` we estimate the
conditional probability ``p_b(d) = P(path reaches d | reached d - 1)`` from decayed
success/failure counts with a Beta prior. The chance that the accepted path reaches
depth ``d`` at budget ``b`` is ``q_b(d) = prod_{j<=d} p_b(j)`` and the expected accept
length, bonus included, is ``E(b) = 1 + sum_{d=1..b} q_b(d)``. Depths a bucket has not
seen use the pooled estimate over all buckets, and depths nobody has seen inherit the
pooled estimate of the depth above (acceptance persists).

How budgets relate (trees): a budget of ``k`` nodes may go to depth (a chain) or to
width (alternatives at shallow depths), so ``q_b(d)`` depends on ``b``: a tree with 3
nodes may have no depth-3 node at all, and a depth-3 "failure" there says nothing about
budget 4. We assume the drafter grows its tree best-first, so the tree at budget ``k``
is a subtree of the tree at every ``k' > k`` ("nested trees": true for chains, greedy
suffix trees and EAGLE-2 style trees). Then ``A(k) = E(k) - 1`` is non-decreasing in
``k`` and, if the drafter's ranking is sensible, concave (each added node is less
likely to be accepted than the ones before it). Budgets are therefore combined in the
space of ``A``, not of per-depth probabilities:

* buckets with at least ``support_min`` observations are *supports*;
* a bucket's structural guess between supports takes the concave shape of the pooled
  chain model ``C(k) = sum_{d<=k} prod_{j<=d} p(j)`` (per-depth conditionals pooled over
  all buckets) times the ratio ``A / C`` interpolated linearly in ``k`` between the
  nearest supports below and above (below the lowest support: that support's ratio);
  above the highest support ``T`` it adds a geometric tail ``m * sum_{j=1..k-T} r^j``
  to ``A(T)``, with ``m`` the secant slope into ``T``
  (an upper bound of the marginal gain at ``T``: optimism that drives exploration
  upwards) and ``r`` the per-node decay of the marginal gain, measured from the
  secant slopes between the three highest supports (or, with fewer supports, the
  pooled per-depth continuation probability, which is the exact ratio for chains);
* each bucket's estimate blends its own ``A`` with the structural guess by inverse
  variance: the own mean's variance is the (level-normalised) sample variance of its
  accepted counts over its observation count, the structural guess has a relative
  standard deviation of ``structure_sd``; accepted counts are heavy-tailed (0 or a
  long run), so a width seen in a few probes leans on its neighbours. The result is
  made non-decreasing in ``k`` and capped at ``k``;
* ``E(k)`` for a ``k`` between buckets interpolates linearly.

If the drafter can tell, per request, how many tokens the nested subtree of a smaller
budget ``k' < k`` would have accepted (from the best-first rank of the accepted nodes,
see :func:`accepted_within_budgets`), :meth:`AcceptanceEstimator.observe` takes those
counts too and every smaller bucket learns from every step.

Every count decays by ``decay`` per verify step (exponential forgetting), so estimates
follow drift.

Levels: acceptance varies between requests and over time far more than the effect of
the budget, and buckets used at different times see different requests, so comparing
raw bucket means compares moments, not budgets. We therefore model ``A_r(k) =
level_r * shape(k)``: every observation carries the current level of its request
(:class:`LevelTracker`, the request's accepted drafts over the shape's prediction, with
``request_strength`` pseudo-steps pulling it to 1), each bucket divides its ``A`` by
the mean level of its observations, and predictions multiply the shape by the level of
the requests in the batch (or, without request ids, by one fast server-wide level).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def accepted_within_budgets(accepted_node_ranks: Sequence[int], ks: Sequence[int]) -> list[int]:
    """Accepted drafts at each budget in ``ks`` for one request of a nested tree.

    ``accepted_node_ranks`` are the best-first ranks (0-based insertion order, root
    excluded) of the accepted path's nodes, shallowest first; the subtree of budget
    ``k`` holds ranks ``< k``, and a path prefix survives while its ranks stay below.
    """
    out = []
    for k in ks:
        a = 0
        for rank in accepted_node_ranks:
            if rank >= k:
                break
            a += 1
        out.append(a)
    return out


def _depth_counts(accepted: np.ndarray, k: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Successes and failures per depth (index d = depth d, index 0 unused)."""
    a = np.clip(accepted, 0, k)
    hist = np.bincount(a, minlength=k + 1).astype(np.float64)  # hist[j] = #(a == j)
    reached = hist[::-1].cumsum()[::-1]  # reached[d] = #(a >= d)
    succ = np.zeros(max_depth + 1)
    fail = np.zeros(max_depth + 1)
    succ[1 : k + 1] = reached[1 : k + 1]
    fail[1 : k + 1] = hist[:k]
    return succ, fail


class AcceptanceEstimator:
    """Global per-(bucket, depth) acceptance with forgetting (see the module doc)."""

    def __init__(
        self,
        buckets: Sequence[int],
        *,
        prior_mean: float = 0.6,
        prior_strength: float = 2.0,
        decay: float = 0.998,
        structure_sd: float = 0.1,
        support_min: float = 4.0,
    ) -> None:
        positive = sorted({int(b) for b in buckets if int(b) > 0})
        if not positive:
            raise ValueError(f"buckets={list(buckets)!r}: need at least one k > 0")
        self.buckets = np.array(positive)
        self._bucket_set = set(positive)
        self.max_depth = int(self.buckets[-1])
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.decay = decay
        self.structure_sd = structure_sd
        self.support_min = support_min
        shape = (len(positive), self.max_depth + 1)
        self._succ = np.zeros(shape)
        self._fail = np.zeros(shape)
        self._level = np.zeros(len(positive))  # decayed sum of observation levels
        self._x1 = np.zeros(len(positive))  # decayed sum of level-normalised accepts
        self._x2 = np.zeros(len(positive))  # ... and of their squares
        self._cache: tuple[np.ndarray, np.ndarray, float] | None = None

    def bucket_index(self, k: int) -> int:
        """Index of the largest bucket ``<= k`` (the smallest bucket if none)."""
        return max(0, int(np.searchsorted(self.buckets, k, side="right")) - 1)

    def observe(
        self,
        k: int,
        accepted: Sequence[int] | np.ndarray,
        within: Mapping[int, Sequence[int] | np.ndarray] | None = None,
        levels: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """One verify step at budget ``k``; decays all counts first.

        ``within`` optionally maps smaller budgets ``k' < k`` to the accepted counts
        their nested subtrees would have had (counterfactual, exact for nested trees).
        ``levels``: per request, its acceptance level relative to the shape (default 1).
        """
        self._succ *= self.decay
        self._fail *= self.decay
        self._level *= self.decay
        self._x1 *= self.decay
        self._x2 *= self.decay
        self._cache = None
        if k <= 0:
            return
        k = min(int(k), self.max_depth)
        items = [(k, accepted)]
        # counterfactual counts only for budgets that are buckets (and below k's bucket)
        items += [(int(b), a) for b, a in (within or {}).items() if int(b) in self._bucket_set]
        seen: set[int] = set()
        for kk, acc in items:
            i = self.bucket_index(kk)
            arr = np.asarray(acc, dtype=np.int64)
            if kk > k or i in seen or arr.size == 0 or self.buckets[i] > kk:
                continue
            seen.add(i)
            succ, fail = _depth_counts(arr, kk, self.max_depth)
            self._succ[i] += succ
            self._fail[i] += fail
            lv = np.ones(arr.size) if levels is None else np.asarray(levels, dtype=np.float64)
            x = np.minimum(arr, kk) / np.maximum(lv, 1e-3)
            self._level[i] += float(lv.sum())
            self._x1[i] += float(x.sum())
            self._x2[i] += float((x * x).sum())

    def evidence(self) -> np.ndarray:
        """Decayed number of observations per bucket."""
        return self._succ[:, 1] + self._fail[:, 1]

    def _pooled(self) -> np.ndarray:
        tot_s, tot_n = self._succ.sum(axis=0), (self._succ + self._fail).sum(axis=0)
        pooled = np.ones(self.max_depth + 1)
        mean = self.prior_mean
        for d in range(1, self.max_depth + 1):
            mean = (tot_s[d] + self.prior_strength * mean) / (tot_n[d] + self.prior_strength)
            pooled[d] = mean
        return pooled

    def conditionals(self) -> np.ndarray:
        """``p[i, d]``: each bucket's own conditional acceptance at depth ``d``."""
        n = self._succ + self._fail
        cond = (self._succ + self.prior_strength * self._pooled()) / (n + self.prior_strength)
        cond[:, 0] = 1.0
        return cond

    def tail_ratio(self) -> float:
        """Pooled continuation probability at depths >= 2 (the extrapolation ratio)."""
        s = float(self._succ[:, 2:].sum())
        n = s + float(self._fail[:, 2:].sum())
        r = (s + self.prior_strength * self.prior_mean) / (n + self.prior_strength)
        return min(max(r, 0.0), 0.98)

    def bucket_accepts(self) -> np.ndarray:
        """Estimated shape ``A(b) = E(b) - 1`` per bucket (at level 1)."""
        return self._state()[0]

    def _state(self) -> tuple[np.ndarray, np.ndarray, float]:
        if self._cache is None:
            reach = np.cumprod(self.conditionals()[:, 1:], axis=1)
            depth_ok = np.arange(1, self.max_depth + 1)[None, :] <= self.buckets[:, None]
            n = self.evidence()
            mean_level = (self._level + self.prior_strength) / (n + self.prior_strength)
            own = (reach * depth_ok).sum(axis=1) / mean_level
            support = n >= self.support_min
            r = self._slope_ratio(own, support)
            if r is None:
                r = self.tail_ratio()
            struct = self._structural(own, support, r)
            # inverse-variance blend of the bucket's own mean and the structural guess
            mean_x = self._x1 / np.maximum(n, 1e-9)
            var_x = np.maximum(self._x2 / np.maximum(n, 1e-9) - mean_x**2, 0.0) + 0.05
            w_own = n / var_x
            w_struct = 1.0 / ((self.structure_sd * np.maximum(struct, 0.1)) ** 2)
            est = (w_own * own + w_struct * struct) / (w_own + w_struct)
            est = np.minimum(np.maximum.accumulate(est), self.buckets)
            self._cache = (est, n, r)
        return self._cache

    def _slope_ratio(self, own: np.ndarray, support: np.ndarray) -> float | None:
        """Per-node decay of the marginal gain from the three highest supports."""
        sup = np.flatnonzero(support)
        if sup.size < 3:
            return None
        b = self.buckets[sup[-3:]].astype(np.float64)
        y = own[sup[-3:]]
        s1 = (y[1] - y[0]) / (b[1] - b[0])
        s2 = (y[2] - y[1]) / (b[2] - b[1])
        if s1 <= 1e-9:
            return None
        gap = 0.5 * (b[2] - b[0])  # distance between the two secants' midpoints
        return min(max(s2 / s1, 1e-6) ** (1.0 / gap), 0.98)

    def _structural(self, own: np.ndarray, support: np.ndarray, r: float) -> np.ndarray:
        b = self.buckets.astype(np.float64)
        chain = np.cumsum(np.cumprod(self._pooled()[1:]))[self.buckets - 1]
        sup = np.flatnonzero(support)
        if sup.size == 0:
            return chain
        chain = np.maximum(chain, 1e-6)
        ratio = own / chain
        out = np.empty(len(b))
        for i in range(len(b)):
            lower = sup[sup < i]
            upper = sup[sup > i]
            if lower.size and upper.size:
                lo, hi = lower[-1], upper[0]
                frac = (b[i] - b[lo]) / (b[hi] - b[lo])
                out[i] = chain[i] * (ratio[lo] + (ratio[hi] - ratio[lo]) * frac)
            elif upper.size:
                out[i] = chain[i] * ratio[upper[0]]
            elif not lower.size:  # the only support is this bucket
                out[i] = own[i]
            else:
                lo = lower[-1]
                x0, y0 = (b[lower[-2]], own[lower[-2]]) if lower.size > 1 else (0.0, 0.0)
                out[i] = own[lo] + _tail(max(own[lo] - y0, 0.0) / (b[lo] - x0), r, b[i] - b[lo])
        return out

    def expected_accept_lengths(self, ks: Sequence[int] | np.ndarray) -> np.ndarray:
        """``E(k)`` (bonus included) for each ``k``; ``E(0) = 1``; non-decreasing in k."""
        return 1.0 + self.accepts(np.asarray(ks, dtype=np.float64))

    def accepts(self, ks: np.ndarray) -> np.ndarray:
        """``A(k)`` for each ``k``: linear between buckets, geometric tail above."""
        est, _, r = self._state()
        b = self.buckets.astype(np.float64)
        xs = np.concatenate([[0.0], b])
        ys = np.concatenate([[0.0], est])
        out = np.interp(np.minimum(ks, b[-1]), xs, ys)
        above = ks > b[-1]
        if above.any():
            x0, y0 = xs[-2], ys[-2]
            slope = max(ys[-1] - y0, 0.0) / (xs[-1] - x0)
            out[above] = ys[-1] + _tail(slope, r, ks[above] - b[-1])
        return np.minimum(np.maximum(out, 0.0), np.maximum(ks, 0.0))


def _tail(slope: float, r: float, extra: float | np.ndarray) -> float | np.ndarray:
    """``slope * sum_{j=1..extra} r^j`` (continuous in ``extra``)."""
    if r <= 0.0:
        return slope * 0.0 * extra
    return slope * r * (1.0 - r**extra) / (1.0 - r)


class LevelTracker:
    """Acceptance level per key (request id, or one key for the whole server).

    ``level = (sum accepted + s * m) / (sum predicted + s * m)``: decayed sums over the
    key's steps of its accepted drafts and of the shape ``A(k)`` at the ``k`` used,
    ``s = strength`` pseudo-steps of mean prediction ``m``; unknown keys have level 1.
    Bounded: the least recently updated keys are dropped beyond ``max_keys``.
    """

    def __init__(
        self,
        estimator: AcceptanceEstimator,
        *,
        strength: float = 16.0,
        decay: float = 0.998,
        max_keys: int = 4096,
    ) -> None:
        self.est = estimator
        self.strength = strength
        self.decay = decay
        self.max_keys = max_keys
        # key -> [decayed sum accepted, decayed sum predicted, decayed steps]
        self._keys: OrderedDict[Hashable, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def observe(self, k: int, keys: Sequence[Hashable], accepted: Sequence[float]) -> None:
        """Record one step at budget ``k``."""
        if k <= 0:
            return
        pred = float(self.est.accepts(np.array([float(k)]))[0])
        d = self.decay
        for key, a in zip(keys, accepted, strict=True):
            entry = self._keys.pop(key, None) or [0.0, 0.0, 0.0]
            entry[0] = entry[0] * d + min(max(float(a), 0.0), float(k))
            entry[1] = entry[1] * d + pred
            entry[2] = entry[2] * d + 1.0
            self._keys[key] = entry
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def forget(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            self._keys.pop(key, None)

    def levels(self, keys: Sequence[Hashable]) -> np.ndarray:
        out = np.ones(len(keys))
        for i, key in enumerate(keys):
            e = self._keys.get(key)
            if e is not None and e[2] > 0:
                prior = self.strength * e[1] / e[2]
                if e[1] + prior > 0:
                    out[i] = (e[0] + prior) / (e[1] + prior)
        return out

    def expected_accept_lengths(
        self, keys: Sequence[Hashable], ks: Sequence[int] | np.ndarray
    ) -> np.ndarray:
        """``(len(keys), len(ks))``: ``1 + min(level * A(k), k)`` per key."""
        ks_arr = np.asarray(ks, dtype=np.float64)
        shape = self.est.accepts(ks_arr)
        scaled = self.levels(keys)[:, None] * shape[None, :]
        return 1.0 + np.minimum(scaled, ks_arr[None, :])
