"""Draft scores calibrated to expected accepted tokens, learned online.

Engine-agnostic (no SGLang, no torch): any drafter that gives each draft node a raw
probability (SUFFIX's path probabilities, a model draft's token probabilities) can be
compared with another source on one scale: the observed chance that a node with that
raw probability, from that source, is accepted. HYBRID (choosing between the suffix
draft and a model draft) and the replay reports use the same estimator.

Model: per source, raw probabilities fall into ``bins`` equal-width bins over [0, 1];
a bin's calibrated probability is ``(accepted + prior_weight * p) / (seen + prior_weight)``
(a Beta-style prior centred on the raw probability ``p`` itself, so an unseen bin
returns the raw value and evidence moves it). A node counts as accepted when the
verifier accepted it (greedy: it lies on the path of committed tokens); every drafted
node is an observation, including nodes below a rejected one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def accepted_path(
    tokens: Sequence[int], parents: Sequence[int], committed: Sequence[int]
) -> list[int]:
    """Indices of the draft nodes a greedy verifier accepts, root to leaf.

    ``tokens``/``parents`` describe the draft tree (parents precede children, -1 is
    the root); ``committed`` are the tokens the target produced after the root. At
    each depth the first child (in node order) whose token matches is followed.
    """
    path: list[int] = []
    node = -1
    for want in committed:
        nxt = -1
        for i in range(path[-1] + 1 if path else 0, len(tokens)):
            if parents[i] == node and tokens[i] == want:
                nxt = i
                break
        if nxt < 0:
            break
        path.append(nxt)
        node = nxt
    return path


@dataclass
class _Bins:
    seen: list[int]
    accepted: list[int]
    raw_sum: list[float]


@dataclass
class AcceptanceCalibrator:
    """Online map (source, raw node probability) -> observed acceptance probability."""

    bins: int = 10
    prior_weight: float = 8.0
    _by_source: dict[str, _Bins] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"bins={self.bins!r} is invalid: expected an int >= 1")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight={self.prior_weight!r} is invalid: expected > 0")

    def _bin(self, prob: float) -> int:
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"probability {prob!r} is outside [0, 1]")
        return min(int(prob * self.bins), self.bins - 1)

    def _source(self, source: str) -> _Bins:
        b = self._by_source.get(source)
        if b is None:
            n = self.bins
            b = self._by_source[source] = _Bins([0] * n, [0] * n, [0.0] * n)
        return b

    def observe(self, source: str, prob: float, accepted: bool) -> None:
        """One drafted node of ``source`` with raw probability ``prob``, and its fate."""
        i = self._bin(prob)
        b = self._source(source)
        b.seen[i] += 1
        b.accepted[i] += bool(accepted)
        b.raw_sum[i] += prob

    def observe_draft(
        self,
        source: str,
        tokens: Sequence[int],
        parents: Sequence[int],
        probs: Sequence[float],
        committed: Sequence[int],
    ) -> int:
        """Record every node of one verified draft; returns the accepted count."""
        if not len(tokens) == len(parents) == len(probs):
            raise ValueError("tokens, parents and probs must have the same length")
        path = set(accepted_path(tokens, parents, committed))
        for i, p in enumerate(probs):
            self.observe(source, p, i in path)
        return len(path)

    def calibrated(self, source: str, prob: float) -> float:
        """Estimated chance that a node of ``source`` with raw probability ``prob`` is accepted."""
        i = self._bin(prob)
        b = self._by_source.get(source)
        if b is None:
            return prob
        w = self.prior_weight
        return (b.accepted[i] + w * prob) / (b.seen[i] + w)

    def expected_accepted(self, source: str, probs: Sequence[float]) -> float:
        """Expected accepted tokens of a draft: the sum of its calibrated node probabilities."""
        return sum(self.calibrated(source, p) for p in probs)

    def table(self) -> dict[str, list[dict[str, float | int]]]:
        """Per source, per non-empty bin: range, nodes seen, mean raw and observed rate."""
        out: dict[str, list[dict[str, float | int]]] = {}
        for source, b in self._by_source.items():
            rows: list[dict[str, float | int]] = []
            for i in range(self.bins):
                if b.seen[i]:
                    rows.append(
                        {
                            "lo": i / self.bins,
                            "hi": (i + 1) / self.bins,
                            "seen": b.seen[i],
                            "mean_raw": b.raw_sum[i] / b.seen[i],
                            "accept_rate": b.accepted[i] / b.seen[i],
                        }
                    )
            out[source] = rows
        return out
