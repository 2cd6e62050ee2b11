"""Step-cost model ``t(bs, k)``: the analytic prior of :mod:`.prior`, calibrated
online on the running server's measured step times.

Online calibration
------------------
:class:`StepCostModel` keeps a bounded window of measured ``(bs, k, seconds)`` samples
and refits multipliers ``x_j`` on the nine prior coefficients. First one global time
scale (the recency-weighted median of measured over prior time): a device far from the
prior's, such as a CPU against the H100 preset, is slower at everything. Then the
multipliers, relative to that scaled prior, by least squares on relative residuals,
re-assigning the active roofline branch of each sample from the current fit a few times.
Outliers (GC pauses, preemptions) get Huber weights from their deviation to the median
of their own ``(bs, k)`` cell (scale: the median absolute deviation), so a rarely probed
width whose time differs from the fit counts fully; samples lose weight exponentially
with age; a ridge term pulls every ``x_j`` towards 1 (the scaled prior) with
``prior_weight`` pseudo-samples, each worth the coefficient's mean share of the measured
times, so directions the data cannot identify (e.g. the split of a constant between
"fixed" and "weights" when only one batch size is seen) scale with the prior, while a
coefficient the data does identify may move by orders of magnitude (within 1e-3..1e4 of
the scaled prior): on a CPU running a 135M model every step is compute-bound and the
per-token cost is ~10^4 x what the H100 roofline says. Because the max hides a too-steep
compute slope next to memory-bound samples, the compute multiplier is also capped so
that no well-sampled cell's median time is exceeded by its predicted compute time. Each
refit also computes, per observed ``(bs, k)`` cell, the recency-weighted mean of
``log(measured / fitted)`` (outliers clipped) shrunk towards 0 by ``cell_strength``
pseudo-samples, i.e. blended with the fit by observation count, to absorb what the
functional form misses.
"""

from __future__ import annotations

import math

import numpy as np

from .prior import COEFF_NAMES, N_COMMON, StepCostParams, analytic_step_time, features

#: Bounds of a refit's multipliers, relative to the prior times the global time scale.
_X_MIN, _X_MAX = 1e-3, 1e4
#: Smallest ridge per coefficient (a coefficient no sample's time depends on).
_RIDGE_FLOOR = 1e-6


class StepCostModel:
    """Analytic prior plus robust online calibration (see the module docstring)."""

    def __init__(
        self,
        prior: StepCostParams | None = None,
        *,
        calibrate: bool = True,
        window: int = 2048,
        decay: float = 0.999,
        refit_every: int = 16,
        prior_weight: float = 16.0,
        huber: float = 2.5,
        cell_strength: float = 4.0,
        verify_widths: tuple[int, ...] | None = None,
    ) -> None:
        self.prior = prior or StepCostParams()
        self.prior_coeffs = self.prior.coefficients()
        self.zero_step_draft = self.prior.zero_step_draft
        self.verify_widths = None if verify_widths is None else np.asarray(verify_widths)
        self.multipliers = np.ones(len(COEFF_NAMES))
        self.time_scale = 1.0  # global measured / prior scale of the last refit
        self.calibrate = calibrate
        self.decay = decay
        self.refit_every = max(1, refit_every)
        self.prior_weight = prior_weight
        self.huber = huber
        self.cell_strength = cell_strength
        self._bs = np.zeros(window)
        self._k = np.zeros(window)
        self._t = np.zeros(window)
        self._stamp = np.zeros(window)
        self._n = 0  # samples ever observed
        self._scale = 0.05  # robust relative residual scale, refreshed by each refit
        # (bs, k) -> log correction on top of the fit, recomputed by each refit
        self._cells: dict[tuple[int, int], float] = {}

    @property
    def coefficients(self) -> np.ndarray:
        return self.prior_coeffs * self.multipliers

    @property
    def num_samples(self) -> int:
        return self._n

    def predict_fit(self, bs: int | np.ndarray, k: int | np.ndarray) -> np.ndarray:
        """Fitted roofline only (no per-cell correction)."""
        return analytic_step_time(
            self.coefficients, bs, k, self.zero_step_draft, self.verify_widths
        )

    def predict(self, bs: int, ks: np.ndarray | list[int] | int) -> np.ndarray:
        """Predicted seconds per step at batch size ``bs`` for each ``k`` in ``ks``."""
        ks_arr = np.atleast_1d(np.asarray(ks))
        out = self.predict_fit(np.full(ks_arr.shape, bs), ks_arr)
        if self._cells:
            for i, k in enumerate(ks_arr.tolist()):
                corr = self._cells.get((int(bs), int(k)))
                if corr is not None:
                    out[i] *= math.exp(corr)
        return out

    def observe(self, bs: int, k: int, seconds: float) -> None:
        """Record one measured step; refits every ``refit_every`` samples."""
        if not self.calibrate or not (math.isfinite(seconds) and seconds > 0) or bs <= 0:
            return
        i = self._n % len(self._t)
        self._bs[i], self._k[i], self._t[i], self._stamp[i] = bs, k, seconds, self._n
        self._n += 1
        if self._n % self.refit_every == 0:
            self.refit()

    def refit(self, iterations: int = 4) -> None:
        """Re-estimate the coefficient multipliers from the sample window."""
        m = min(self._n, len(self._t))
        if m == 0:
            return
        bs, k, t = self._bs[:m], self._k[:m], self._t[:m]
        recency = self.decay ** (self._n - 1 - self._stamp[:m])
        # outliers are judged against their own (bs, k) cell, so a rarely visited
        # width whose time differs from the current fit is information, not noise
        keys = bs.astype(np.int64) * 4096 + k.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        log_t = np.log(t)
        cell_med = _group_median(log_t, inv, len(uniq))
        dev = log_t - cell_med[inv]
        self._scale = max(1.4826 * float(np.median(np.abs(dev))), 1e-3)
        lim = self.huber * self._scale
        robust = np.minimum(1.0, lim / np.maximum(np.abs(dev), 1e-12))
        w = recency * robust
        f_mem, f_comp = features(bs, k, self.zero_step_draft, self.verify_widths)
        f_mem, f_comp = f_mem * self.prior_coeffs, f_comp * self.prior_coeffs
        # one time scale first (the recency-weighted median of measured / prior): a
        # device far from the prior's (a CPU against an H100 preset) moves every
        # coefficient together, and the multipliers below are relative to it
        prior_t = np.maximum(f_mem.sum(axis=1), f_comp.sum(axis=1))
        scale = math.exp(_weighted_median(log_t - np.log(prior_t), w))
        f_mem, f_comp = f_mem * scale, f_comp * scale
        x = self.multipliers / scale  # warm start from the last fit
        for _ in range(iterations):
            mem_active = (f_mem @ x) >= (f_comp @ x)
            design = np.where(mem_active[:, None], f_mem, f_comp) / t[:, None]
            # relative least squares (target 1 = measured / measured), ridge towards
            # the scaled prior worth ``prior_weight`` samples of each coefficient's own
            # typical share, so a coefficient the data identifies can move far (a
            # compute-bound CPU's per-token cost is ~10^4 x an H100's) while one it
            # cannot identify stays with the prior
            gram = design.T @ (design * w[:, None])
            ridge = self.prior_weight * np.maximum(np.diag(gram) / w.sum(), _RIDGE_FLOOR)
            lhs = gram + np.diag(ridge)
            rhs = design.T @ w + ridge
            x = np.clip(np.linalg.solve(lhs, rhs), _X_MIN, _X_MAX)
            x[-1] = min(x[-1], self._compute_cap(x * scale, uniq, inv, cell_med, lim) / scale)
        pred = np.maximum(f_mem @ x, f_comp @ x)
        self.time_scale = scale
        self.multipliers = x * scale
        res = log_t - dev + np.clip(dev, -lim, lim) - np.log(pred)  # outliers clipped
        # per-cell correction: the recency-weighted mean residual, shrunk by the cell's
        # sample count (not its recency weight: a rarely visited width, probed now and
        # then, would otherwise never get past the shrinkage)
        wsum = np.bincount(inv, weights=recency, minlength=len(uniq))
        rsum = np.bincount(inv, weights=recency * res, minlength=len(uniq))
        counts = np.bincount(inv, minlength=len(uniq))
        corr = rsum / np.maximum(wsum, 1e-12) * counts / (counts + self.cell_strength)
        self._cells = {
            (int(key // 4096), int(key % 4096)): float(c)
            for key, c in zip(uniq.tolist(), corr.tolist(), strict=True)
        }

    def _compute_cap(
        self, x: np.ndarray, uniq: np.ndarray, inv: np.ndarray, cell_med: np.ndarray, lim: float
    ) -> float:
        """Largest compute multiplier that no well-sampled cell contradicts.

        A cell's median time bounds its compute time from above; without this the
        branch re-assignment lets a too-steep prior compute slope survive next to
        memory-bound samples (the max hides it).
        """
        counts = np.bincount(inv, minlength=len(uniq))
        ok = counts >= 3
        if not ok.any():
            return np.inf
        bs_c = (uniq // 4096).astype(np.float64)[ok]
        k_c = (uniq % 4096).astype(np.float64)[ok]
        f_mem, f_comp = features(bs_c, k_c, self.zero_step_draft, self.verify_widths)
        common = (f_mem[:, :N_COMMON] * self.prior_coeffs[:N_COMMON]) @ x[:N_COMMON]
        tokens = f_comp[:, -1] * self.prior_coeffs[-1]  # verified tokens x flop coefficient
        u = (np.exp(cell_med[ok] + lim) - common) / tokens
        return float(max(u.min(), 0.02))

    def snapshot(self) -> dict[str, object]:
        return {
            "samples": self._n,
            "coefficients_s": dict(zip(COEFF_NAMES, self.coefficients.tolist(), strict=True)),
            "multipliers": dict(zip(COEFF_NAMES, self.multipliers.round(4).tolist(), strict=True)),
            "time_scale": round(self.time_scale, 4),
            "residual_scale": round(self._scale, 5),
            "cells": len(self._cells),
        }


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][int(np.searchsorted(cum, 0.5 * cum[-1]))])


def _group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of ``values`` per group id in ``0..n_groups-1``."""
    order = np.lexsort((values, groups))
    v = values[order]
    counts = np.bincount(groups, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return 0.5 * (v[starts + (counts - 1) // 2] + v[starts + counts // 2])
