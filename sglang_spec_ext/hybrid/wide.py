"""HYBRID's wide steps: suffix drafts at their own length beside the model's chains.

The host verifies a model draft of ``K`` steps at width ``W_m = K + 1`` (a topk-1 chain)
or ``--speculative-num-draft-tokens`` (a tree). A suffix draft that wins the choice was
cut to ``W_m - 1`` nodes, so on repetitive text HYBRID accepted less than SUFFIX alone
at width 16. A *wide step* verifies the batch at ``W_s`` (up to the suffix width, the
setting ``hybrid_suffix_width``): the suffix rows at their own length, the model rows
padded. On a GPU a verify's cost is nearly flat in its tokens until the step leaves
the memory-bound region; on a CPU it grows at once. So a step goes wide only where it
pays (:func:`wide_pays`): the expected extra accepted tokens of the longer suffix drafts
against the step's extra verify tokens, priced by :class:`TokenCost`, a least-squares
fit of the step time over the step's verify tokens ``T = bs * W`` per batch-size tier,
learned from the server's own timed decode steps, every batch size's narrow and wide
steps kept timed by a little exploration (:class:`Explorer`). Engine-agnostic.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Timed steps the cost fit looks back over, per batch-size tier and in all.
TIER_WINDOW = 64
WINDOW = 256
#: Timed steps of a tier before its own fit prices it (and in all, before the global fit).
TIER_MIN = 8
MIN_STEPS = 16
#: The first timed decode steps of a server, never fitted (warm-up: allocations, compiles).
WARMUP = 4
#: Batch-size tiers: ceil(log2 bs), the last open.
MAX_TIER = 8
#: Verify tokens at which the prior's extra cost ``cost_prior`` is reached (one request
#: at width 16: a GPU's memory-bound region, a guess until the fit has data).
PRIOR_TOKENS = 16
#: One wide-step candidate in this many per tier takes the other choice than the cost
#: model's, so both are timed at every batch size (the fit needs narrow and wide steps
#: at the same batch size to tell a per-token cost from a per-request one).
EXPLORE_EVERY = 8


def tier(bs: int) -> int:
    return min(max(0, int(np.ceil(np.log2(max(bs, 1))))), MAX_TIER)


@dataclass
class TokenCost:
    """Step time ``t(bs, T)`` over the batch size and the step's verify tokens ``T``
    (see the module doc). Per batch-size tier (:func:`tier`), once the tier holds
    :data:`TIER_MIN` timed steps with different ``T``: ``t = a + c * bs + b * T``, least
    squares over its last :data:`TIER_WINDOW` steps (``c = 0`` where ``bs`` moved with
    ``T`` only); otherwise the same over the last :data:`WINDOW` steps of all tiers (one
    line for every batch size: a GPU's step is not linear across them); before :data:`MIN_STEPS`, a prior: ``a = 1``,
    ``c = 0``, ``b = cost_prior / PRIOR_TOKENS`` (relative units: only ratios of step
    times are used). Slopes below 0 are read as flat. The first :data:`WARMUP` steps are
    not fitted."""

    cost_prior: float = 0.1
    window: int = WINDOW
    _steps: deque = field(default_factory=deque, repr=False)
    _tiers: dict[int, deque] = field(default_factory=dict, repr=False)
    _skipped: int = 0
    _fit: tuple[float, float, float] | None = None  # global (a, c, b)
    _tier_fits: dict[int, tuple[float, float, float]] = field(default_factory=dict, repr=False)
    _dirty: bool = False

    def on_step(self, bs: int, tokens: int, seconds: float) -> None:
        """One decode step of ``bs`` requests that verified ``tokens`` tokens (padding
        included) took ``seconds``."""
        if bs < 1 or tokens < 1 or not (seconds > 0 and np.isfinite(seconds)):
            return
        if self._skipped < WARMUP:
            self._skipped += 1
            return
        row = (float(bs), float(tokens), float(seconds))
        self._steps.append(row)
        while len(self._steps) > self.window:
            self._steps.popleft()
        mine = self._tiers.setdefault(tier(bs), deque(maxlen=TIER_WINDOW))
        mine.append(row)
        self._dirty = True

    def _refit(self) -> None:
        self._dirty = False
        self._tier_fits = {}
        for k, rows in self._tiers.items():
            data = np.asarray(rows, dtype=np.float64)
            if len(data) >= TIER_MIN and np.ptp(data[:, 1]) > 0:
                fit = _fit(np.stack([np.ones(len(data)), data[:, 0], data[:, 1]], 1), data[:, 2])
                if np.isfinite(fit).all() and min(_at(fit, data[:, 0], data[:, 1])) > 0:
                    self._tier_fits[k] = fit
        if len(self._steps) < MIN_STEPS:
            return
        data = np.asarray(self._steps, dtype=np.float64)
        bs, tokens, t = data[:, 0], data[:, 1], data[:, 2]
        if np.ptp(tokens) <= 0:
            return  # T never varied: not identifiable, keep what we had
        fit = _fit(np.stack([np.ones_like(tokens), bs, tokens], 1), t)
        a, c, b = fit
        if np.isfinite(fit).all() and a + c * bs.min() + b * tokens.min() > 0:
            self._fit = (max(a, 0.0), c, b)

    def coefficients(self) -> tuple[float, float, float]:
        """``(a, c, b)`` of the global fit (seconds), or the prior's relative units."""
        if self._dirty:
            self._refit()
        if self._fit is not None:
            return self._fit
        return 1.0, 0.0, self.cost_prior / PRIOR_TOKENS

    def time(self, bs: int, tokens: int) -> float:
        a, c, b = self.coefficients()  # refits where needed
        mine = self._tier_fits.get(tier(bs))
        if mine is not None:
            return float(_at(mine, bs, tokens))
        return a + c * bs + b * tokens

    def stats(self) -> dict[str, object]:
        self.coefficients()
        fit = self._fit
        return {
            "wide_cost_fit": None
            if fit is None
            else {
                "a_ms": round(fit[0] * 1e3, 3),
                "c_ms_per_request": round(fit[1] * 1e3, 4),
                "b_ms_per_token": round(fit[2] * 1e3, 5),
            },  # fmt: skip
            "wide_cost_tiers": {
                f"bs<={2**k}": {
                    "a_ms": round(a * 1e3, 2),
                    "c_ms_per_request": round(c * 1e3, 4),
                    "b_ms_per_token": round(b * 1e3, 4),
                }
                for k, (a, c, b) in sorted(self._tier_fits.items())
            },  # fmt: skip
            "wide_cost_steps": len(self._steps),
        }


@dataclass
class Explorer:
    """Every :data:`EXPLORE_EVERY`-th wide-step candidate of a batch-size tier takes the
    other choice (see :data:`EXPLORE_EVERY`)."""

    every: int = EXPLORE_EVERY
    _counts: dict[int, int] = field(default_factory=dict)
    flips: int = 0

    def choose(self, bs: int, pays: bool) -> bool:
        k = tier(bs)
        n = self._counts[k] = self._counts.get(k, 0) + 1
        if self.every > 0 and n % self.every == 0:
            self.flips += 1
            return not pays
        return pays


def _fit(full: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """Least squares ``(a, c, b)`` of ``t`` on the columns ``(1, bs, T)``; ``c = 0`` where
    ``bs`` moved with ``T`` only (one width) or came out negative; ``b`` at least 0 (a
    negative slope is noise: flat in T, as measured)."""
    if np.linalg.matrix_rank(full) == 3:
        a, c, b = np.linalg.lstsq(full, t, rcond=None)[0]
        if c >= 0:
            return float(a), float(c), max(float(b), 0.0)
    a, b = np.linalg.lstsq(full[:, [0, 2]], t, rcond=None)[0]
    return float(a), 0.0, max(float(b), 0.0)


def _at(fit: tuple[float, float, float], bs: Any, tokens: Any) -> Any:
    a, c, b = fit
    return a + c * np.asarray(bs, dtype=np.float64) + b * np.asarray(tokens, dtype=np.float64)


def wide_pays(
    cost: TokenCost,
    bs: int,
    narrow_width: int,
    wide_width: int,
    committed: float,
    gain: float,
) -> bool:
    """Whether a wide step beats the narrow one in expected tokens per second:
    ``(committed + gain) / t(bs, bs * wide_width) > committed / t(bs, bs * narrow_width)``.

    ``committed``: the narrow step's expected committed tokens (``bs`` bonus tokens plus
    the chosen drafts' expected accepted tokens); ``gain``: the expected extra accepted
    tokens of the suffix drafts at their own length over the same drafts cut to
    ``narrow_width - 1`` nodes."""
    if wide_width <= narrow_width or gain <= 0 or bs < 1:
        return False
    narrow = cost.time(bs, bs * narrow_width)
    wide = cost.time(bs, bs * wide_width)
    return (committed + gain) * narrow > committed * wide


@dataclass
class WideStats:
    """What the HYBRID stats line reports of wide steps."""

    steps: int = 0  # decode steps with a suffix draft longer than the model's width
    wide_steps: int = 0  # of which verified wide
    capped_rows: int = 0  # suffix rows cut to the model's width (the step stayed narrow)
    wide_rows: int = 0  # suffix rows verified beyond the model's width
    verify_tokens: int = 0  # tokens through the target in those steps (padding included)
    explored: int = 0  # candidate steps that took the other choice (Explorer)

    def as_dict(self) -> dict[str, int]:
        return {
            "wide_explored": self.explored,
            "wide_candidate_steps": self.steps,
            "wide_steps": self.wide_steps,
            "wide_rows": self.wide_rows,
            "wide_capped_rows": self.capped_rows,
            "wide_verify_tokens": self.verify_tokens,
        }
