"""HYBRID's choice between a suffix draft and a model draft (engine-agnostic).

Per request and decode step both sources propose a draft with a raw *score*:

* the suffix draft: :attr:`DraftTree.score`, the sum of its nodes' path
  probabilities (its own estimate of accepted tokens, 2-5x over-confident);
* the model draft: :func:`chain_score` of the draft model's per-step top
  probabilities (or, for a tree, the sum of the host's path scores).

Raw scores of different sources are not comparable. :class:`GainEstimator` maps
each (source, score bucket) to the mean number of draft tokens actually accepted,
learned online from the server's own verify results, and :class:`HybridChooser`
takes the draft with the larger expected accepted tokens.

Both drafts are scored every step, not only the winner: :class:`~sglang_spec_ext.hybrid.ledger.ShadowLedger`
keeps each request's recent drafts and resolves a draft once the tokens the target
committed after it decide its greedy acceptance (the winner at once, the losing
draft a step or a few later). So each source's statistics come from every step,
and no exploration is needed. Resolution against committed tokens is exact for
greedy requests; for sampled ones it measures agreement with the sampled output,
which is what the verifier accepts for a deterministic draft.

Baselines for the replay comparison: :func:`arctic_rule` (ArcticInference: the
suffix draft when its score >= the speculator's draft length) and
:func:`match_rule` (Baseten: the suffix draft when its match is >= 4 tokens).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_spec_ext.hybrid.candidate import MODEL, SOURCES, SUFFIX, Candidate
from sglang_spec_ext.hybrid.ledger import ShadowLedger

#: Bucket edges of raw scores (expected accepted tokens by the source's own account).
DEFAULT_EDGES: tuple[float, ...] = (
    0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0,
)  # fmt: skip

POLICIES: tuple[str, ...] = ("learned", "arctic", "match", SUFFIX, MODEL)
#: Resolved drafts in a score bucket before a whole (uncut) suffix draft of that score
#: may win the choice on its own expectation (``HybridState.choose``).
WHOLE_EVIDENCE = 8.0


def chain_score(step_probs: Sequence[float]) -> float:
    """Expected accepted tokens of a chain whose i-th token the draft gives ``step_probs[i]``.

    The chance that tokens 1..j are all accepted is the product of their
    probabilities (taken as calibrated); the sum over j is the expectation.
    """
    total, run = 0.0, 1.0
    for p in step_probs:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"step probability {p!r} is outside [0, 1]")
        run *= p
        total += run
    return total


@dataclass
class _Bucket:
    seen: float = 0.0
    accepted: float = 0.0
    raw: float = 0.0


@dataclass
class GainEstimator:
    """Online map (source, raw score) -> mean accepted draft tokens.

    A bucket's estimate is ``(accepted + prior_weight * prior) / (seen + prior_weight)``
    with ``prior = prior_scale * score``: before evidence a raw score counts at
    ``prior_scale`` of its face value. ``memory`` bounds the evidence per bucket
    (older observations fade out once a bucket holds more), so the estimate follows
    a workload that changes.
    """

    edges: tuple[float, ...] = DEFAULT_EDGES
    prior_weight: float = 4.0
    prior_scale: float = 0.5
    memory: float = 2000.0
    _buckets: dict[str, list[_Bucket]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if list(self.edges) != sorted(self.edges) or len(set(self.edges)) != len(self.edges):
            raise ValueError(f"edges={self.edges!r} must be strictly increasing")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight={self.prior_weight!r} is invalid: expected > 0")
        if not 0 <= self.prior_scale <= 1:
            raise ValueError(f"prior_scale={self.prior_scale!r} is invalid: expected [0, 1]")
        if not self.memory >= 1:
            raise ValueError(f"memory={self.memory!r} is invalid: expected >= 1")

    def bucket(self, score: float) -> int:
        if not score >= 0:
            raise ValueError(f"score {score!r} is invalid: expected >= 0")
        return bisect.bisect_right(self.edges, score)

    def _source(self, source: str) -> list[_Bucket]:
        b = self._buckets.get(source)
        if b is None:
            b = self._buckets[source] = [_Bucket() for _ in range(len(self.edges) + 1)]
        return b

    def observe(self, source: str, score: float, accepted: int) -> None:
        """One resolved draft of ``source``: its raw score and the tokens it got accepted."""
        if accepted < 0:
            raise ValueError(f"accepted={accepted!r} is invalid: expected >= 0")
        b = self._source(source)[self.bucket(score)]
        if b.seen >= self.memory:  # fade the old evidence, keep the mean
            keep = (self.memory - 1) / b.seen
            b.seen, b.accepted, b.raw = b.seen * keep, b.accepted * keep, b.raw * keep
        b.seen += 1
        b.accepted += accepted
        b.raw += score

    def expected(self, source: str, score: float) -> float:
        """Expected accepted draft tokens for a draft of ``source`` with raw ``score``."""
        prior = self.prior_scale * score
        bucket = self._buckets.get(source)
        if bucket is None:
            return prior
        b = bucket[self.bucket(score)]
        w = self.prior_weight
        return (b.accepted + w * prior) / (b.seen + w)

    def evidence(self, source: str, score: float) -> float:
        """Resolved drafts (faded) in the bucket of ``score``: what :meth:`expected` there
        rests on beside its prior."""
        bucket = self._buckets.get(source)
        return 0.0 if bucket is None else bucket[self.bucket(score)].seen

    def max_expected(self, source: str, up_to: float) -> float:
        """The largest :meth:`expected` of any raw score in ``[0, up_to]`` (within a
        bucket it grows with the score, so each bucket is evaluated at its top)."""
        highs = (*self.edges, float("inf"))
        best = self.expected(source, up_to)
        for i in range(self.bucket(up_to)):
            best = max(best, self.expected(source, min(highs[i], up_to) * (1 - 1e-12)))
        return best

    def table(self) -> dict[str, list[dict[str, float]]]:
        """Per source, per bucket with evidence: score range, drafts seen, mean raw
        score and mean accepted tokens."""
        out: dict[str, list[dict[str, float]]] = {}
        lows = (0.0, *self.edges)
        highs = (*self.edges, float("inf"))
        for source, buckets in self._buckets.items():
            out[source] = [
                {
                    "lo": lo,
                    "hi": hi,
                    "seen": round(b.seen, 1),
                    "mean_raw": b.raw / b.seen,
                    "mean_accepted": b.accepted / b.seen,
                }
                for lo, hi, b in zip(lows, highs, buckets, strict=True)
                if b.seen
            ]
        return out


def arctic_rule(suffix_score: float, model_draft_len: int) -> str:
    """ArcticInference's hybrid: the suffix draft when its score >= the speculator's length."""
    return SUFFIX if suffix_score >= model_draft_len else MODEL


def match_rule(match_len: int, min_match: int = 4) -> str:
    """Baseten's suffix automaton + MTP: the suffix draft when its match is >= 4 tokens."""
    return SUFFIX if match_len >= min_match else MODEL


@dataclass
class HybridChooser:
    """Picks a source per request and step; ``policy`` is one of :data:`POLICIES`.

    ``learned`` (the default): the larger :meth:`GainEstimator.expected`; a tie or
    an empty suffix draft goes to the model draft. ``suffix`` and ``model`` are the
    single sources alone: they keep their source even when its draft is empty.
    """

    policy: str = "learned"
    estimator: GainEstimator = field(default_factory=GainEstimator)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is invalid: expected one of {POLICIES}")

    def choose(self, suffix: Candidate, model: Candidate) -> str:
        if self.policy in SOURCES:  # one source alone (an empty draft: plain decoding)
            return self.policy
        if not suffix.tokens:
            return MODEL
        if not model.tokens:
            return SUFFIX
        if self.policy == "learned":
            gain_s = self.estimator.expected(SUFFIX, suffix.score)
            gain_m = self.estimator.expected(MODEL, model.score)
            return SUFFIX if gain_s > gain_m else MODEL
        if self.policy == "arctic":
            return arctic_rule(suffix.score, max_depth(model.parents))
        if self.policy == "match":
            return match_rule(suffix.match_len)
        raise AssertionError(self.policy)  # unreachable: checked in __post_init__

    def suffix_wins_before_model_drafts(
        self, suffix: Candidate, first_prob: float, model_steps: int
    ) -> bool:
        """Whether :meth:`choose` picks ``suffix`` whatever the model drafts, knowing of
        the model's draft only its first token's probability and its depth: the model's
        score is at most :func:`chain_score` of ``first_prob`` followed by certainties.
        Then the model need not draft at all."""
        if self.policy in SOURCES:
            return self.policy == SUFFIX
        if not suffix.tokens:
            return False
        if self.policy == "learned":
            bound = chain_score([first_prob] + [1.0] * max(model_steps - 1, 0))
            gain_s = self.estimator.expected(SUFFIX, suffix.score)
            return gain_s > self.estimator.max_expected(MODEL, bound)
        if self.policy == "arctic":
            return suffix.score >= model_steps
        if self.policy == "match":
            return match_rule(suffix.match_len) == SUFFIX
        raise AssertionError(self.policy)  # unreachable: checked in __post_init__


def max_depth(parents: Sequence[int]) -> int:
    """Depth of the deepest node (a chain of n tokens: n)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth, default=0)


@dataclass
class SourceStats:
    steps: int = 0  # steps this source's draft was verified
    committed: int = 0  # tokens committed on those steps (bonus included)
    accepted: int = 0  # draft tokens accepted on those steps

    def add(self, committed: int, accepted: int) -> None:
        """One verify of this source's draft."""
        self.steps += 1
        self.committed += committed
        self.accepted += accepted

    def merge(self, other: SourceStats) -> None:
        self.steps += other.steps
        self.committed += other.committed
        self.accepted += other.accepted


def source_shares(by_source: dict[str, SourceStats]) -> dict[str, dict[str, float]]:
    """Per source: steps, share of steps, committed tokens, share of them, accept length."""
    steps = sum(s.steps for s in by_source.values()) or 1
    committed = sum(s.committed for s in by_source.values()) or 1
    return {
        name: {
            "steps": s.steps,
            "step_share": s.steps / steps,
            "committed_tokens": s.committed,
            "token_share": s.committed / committed,
            "accept_len": (s.committed / s.steps) if s.steps else 0.0,
        }
        for name, s in by_source.items()
    }


class HybridState:
    """Chooser, estimator, shadow ledger and per-source figures for one server/replay."""

    def __init__(self, policy: str = "learned", max_pending: int = 16) -> None:
        self.chooser = HybridChooser(policy)
        self.ledger = ShadowLedger(self._resolved, max_pending=max_pending)
        self.by_source: dict[str, SourceStats] = {s: SourceStats() for s in SOURCES}

    @property
    def estimator(self) -> GainEstimator:
        return self.chooser.estimator

    def _resolved(self, source: str, score: float, accepted: int, won: bool) -> None:
        self.estimator.observe(source, score, accepted)

    def choose(
        self,
        rid: Any,
        committed_len: int,
        suffix: Candidate,
        model: Candidate,
        suffix_whole: Candidate | None = None,
    ) -> str:
        """The winning source for ``rid``'s next verify; both drafts go to the ledger.
        ``suffix_whole``: the suffix draft before it was cut to the model's width (a wide
        step may verify it, ``hybrid/wide.py``). The choice is made on the cut one, or on
        the whole one where the learned table has :data:`WHOLE_EVIDENCE` resolved drafts of
        its score (a long draft's raw score alone is far too confident); the whole one goes
        to the ledger too, so the table learns what longer drafts accept."""
        winner = self.chooser.choose(suffix, model)
        if (
            winner == MODEL
            and suffix_whole is not None
            and self.chooser.policy == "learned"
            and self.estimator.evidence(SUFFIX, suffix_whole.score) >= WHOLE_EVIDENCE
        ):
            winner = self.chooser.choose(suffix_whole, model)
        for cand in (suffix, model):
            if cand.tokens:
                self.ledger.add(rid, committed_len, cand, cand.source == winner)
        self._add_whole(rid, committed_len, suffix, suffix_whole, winner == SUFFIX)
        return winner

    def take_suffix(
        self,
        rid: Any,
        committed_len: int,
        suffix: Candidate,
        suffix_whole: Candidate | None = None,
    ) -> str:
        """The suffix draft wins before the model drafts (no model draft to ledger)."""
        self.ledger.add(rid, committed_len, suffix, True)
        self._add_whole(rid, committed_len, suffix, suffix_whole, True)
        return SUFFIX

    def _add_whole(
        self, rid: Any, at: int, cut: Candidate, whole: Candidate | None, won: bool
    ) -> None:
        if whole is not None and len(whole.tokens) > len(cut.tokens):
            self.ledger.add(rid, at, whole, won)

    def record(self, source: str, committed: int) -> None:
        """One verify of ``source``'s draft that committed ``committed`` tokens (bonus included)."""
        self.by_source[source].add(committed, max(committed - 1, 0))

    def verified(self, rid: Any, source: str, accepted: int, tokens: Sequence[int]) -> None:
        """``rid``'s verify with ``source``'s draft committed ``tokens`` (``accepted`` drafts):
        :meth:`record` plus the ledger's commit."""
        self.by_source[source].add(len(tokens), accepted)
        self.ledger.commit(rid, tokens)

    def finish(self, rid: Any) -> None:
        self.ledger.finish(rid)

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.chooser.policy,
            "by_source": source_shares(self.by_source),
            "pending_requests": len(self.ledger),
            "shadow_dropped": self.ledger.dropped,
        }
