"""Acceptance per draft depth for chain drafts (model drafts with topk 1).

A chain of ``k`` draft steps proposes one token per depth ``1..k``; a step that
accepted ``a`` drafts reached depth ``d`` for every ``d <= min(a + 1, k)`` and was
accepted there for ``d <= a``. So each verify gives exact trials and successes of
the conditional acceptance ``alpha_d = P(accept depth d | accepted depth d - 1)``
for every depth it drafted, and the expected accept length (bonus included) of any
step count follows::

    E(k) = 1 + sum_{j=1..k} prod_{d=1..j} alpha_d

The counts decay by ``decay`` per verify step (acceptance drifts with the traffic).
``alpha_d`` is a Beta posterior mean whose prior is the posterior of the depth
above it (depth 1: ``prior_mean``), so depths the server has not drafted lately
borrow from the deepest one it has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ChainAcceptance:
    def __init__(
        self,
        max_depth: int,
        *,
        prior_mean: float = 0.6,
        prior_strength: float = 2.0,
        decay: float = 0.998,
    ) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth={max_depth!r}: expected an integer >= 1")
        self.max_depth = int(max_depth)
        self.prior_mean = float(prior_mean)
        self.prior_strength = float(prior_strength)
        self.decay = float(decay)
        self.trials = np.zeros(self.max_depth)
        self.successes = np.zeros(self.max_depth)

    def observe(self, k: int, accepted: Sequence[int] | np.ndarray) -> None:
        """One verify step of chains of ``k`` steps: accepted drafts per request."""
        self.trials *= self.decay
        self.successes *= self.decay
        depth = min(int(k), self.max_depth)
        acc = np.asarray(accepted, dtype=np.int64)
        if depth <= 0 or acc.size == 0:
            return
        acc = np.clip(acc, 0, depth)
        d = np.arange(1, depth + 1)
        # reached depth d: a >= d - 1; accepted there: a >= d
        self.trials[:depth] += (acc[:, None] >= d[None, :] - 1).sum(axis=0)
        self.successes[:depth] += (acc[:, None] >= d[None, :]).sum(axis=0)

    def conditionals(self) -> np.ndarray:
        """Posterior mean of ``alpha_d`` for ``d = 1..max_depth``."""
        out = np.empty(self.max_depth)
        prior = self.prior_mean
        for i in range(self.max_depth):
            prior = out[i] = (self.successes[i] + self.prior_strength * prior) / (
                self.trials[i] + self.prior_strength
            )
        return out

    def expected_accept_lengths(self, ks: Sequence[int] | np.ndarray) -> np.ndarray:
        """``E(k)`` (bonus included) for each ``k``; ``k`` beyond ``max_depth`` is capped."""
        reach = np.concatenate([[0.0], np.cumsum(np.cumprod(self.conditionals()))])
        idx = np.clip(np.asarray(ks, dtype=np.int64), 0, self.max_depth)
        return 1.0 + reach[idx]

    def evidence(self, k: int) -> float:
        """Decayed number of trials at depth ``k`` (infinite for ``k = 0``)."""
        if k <= 0:
            return float("inf")
        return float(self.trials[min(k, self.max_depth) - 1])
