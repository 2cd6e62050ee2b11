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
fit ``t = a + c * bs + b * T`` of the step time over the batch size and the step's
verify tokens ``T = bs * W``, learned from the server's own timed decode steps. Engine-agnostic.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

#: Steps the cost fit looks back over.
WINDOW = 256
#: Timed steps before the fit replaces the prior.
MIN_STEPS = 16
#: Verify tokens at which the prior's extra cost ``cost_prior`` is reached (one request
#: at width 16: a GPU's memory-bound region, a guess until the fit has data).
PRIOR_TOKENS = 16


@dataclass
class TokenCost:
    """Step time ``t(bs, T) = a + c * bs + b * T`` over the batch size and the step's
    verify tokens ``T`` (see the module doc): ``c`` takes what grows with the requests
    (the model's draft forwards, the scheduler), ``b`` what grows with the verified
    tokens (the target's verify, the draft extend over them). Least squares over the
    last :data:`WINDOW` timed decode steps once they are :data:`MIN_STEPS` and ``T``
    varied (``c`` too once ``bs`` varied apart from ``T``; refitted once without the
    steps three median absolute residuals off); before that ``a = 1``,
    ``c = 0`` and ``b = cost_prior / PRIOR_TOKENS`` (relative units: only ratios of step
    times are used)."""

    cost_prior: float = 0.1
    window: int = WINDOW
    _steps: deque = field(default_factory=deque, repr=False)
    _fit: tuple[float, float, float] | None = None  # (a, c, b)
    _dirty: bool = False

    def on_step(self, bs: int, tokens: int, seconds: float) -> None:
        """One decode step of ``bs`` requests that verified ``tokens`` tokens (padding
        included) took ``seconds``."""
        if bs < 1 or tokens < 1 or not (seconds > 0 and np.isfinite(seconds)):
            return
        self._steps.append((float(bs), float(tokens), float(seconds)))
        while len(self._steps) > self.window:
            self._steps.popleft()
        self._dirty = True

    def _refit(self) -> None:
        self._dirty = False
        if len(self._steps) < MIN_STEPS:
            return
        data = np.asarray(self._steps, dtype=np.float64)
        bs, tokens, t = data[:, 0], data[:, 1], data[:, 2]
        if np.ptp(tokens) <= 0:
            return  # T never varied: not identifiable, keep what we had
        full = np.stack([np.ones_like(tokens), bs, tokens], 1)
        fit = _fit(full, t)
        # one pass without the outliers (a step that waited on a compile, a prefill's
        # leftovers): three median absolute residuals off the first fit
        res = np.abs(full @ np.asarray(fit) - t)
        keep = res <= 3.0 * max(float(np.median(res)), 1e-9)
        if keep.sum() >= MIN_STEPS and not keep.all():
            fit = _fit(full[keep], t[keep])
        a, c, b = fit
        if not np.isfinite(fit).all() or a + c * bs.min() + b * tokens.min() <= 0:
            return
        self._fit = (max(a, 0.0), c, b)

    def coefficients(self) -> tuple[float, float, float]:
        """``(a, c, b)``: the fit's seconds, or the prior's relative units."""
        if self._dirty:
            self._refit()
        if self._fit is not None:
            return self._fit
        return 1.0, 0.0, self.cost_prior / PRIOR_TOKENS

    def time(self, bs: int, tokens: int) -> float:
        a, c, b = self.coefficients()
        return a + c * bs + b * tokens

    def stats(self) -> dict[str, object]:
        fit = self._fit
        return {
            "wide_cost_fit": None
            if fit is None
            else {
                "a_ms": round(fit[0] * 1e3, 3),
                "c_ms_per_request": round(fit[1] * 1e3, 4),
                "b_ms_per_token": round(fit[2] * 1e3, 5),
            },  # fmt: skip
            "wide_cost_steps": len(self._steps),
        }


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

    def as_dict(self) -> dict[str, int]:
        return {
            "wide_candidate_steps": self.steps,
            "wide_steps": self.wide_steps,
            "wide_rows": self.wide_rows,
            "wide_capped_rows": self.capped_rows,
            "wide_verify_tokens": self.verify_tokens,
        }
