"""Exact offline replay of greedy token traces through a model-free drafter.

Under greedy decoding the target's output does not depend on the drafts, so the
tokens a verifier would accept at each step follow from the recorded output alone.
Replay mirrors serving: the prompt goes in with ``start_request``; prefill commits
the first output token (no draft); then each decode step drafts a tree of at most
``width - 1`` nodes, accepts greedily along it, and commits the accepted tokens
plus one bonus token with ``extend_request``; ``finish_request`` ends the request.
Requests run one after another in trace order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sglang_spec_ext.replay.protocol import Drafter, greedy_accept, node_depths, validate_draft
from sglang_spec_ext.replay.trace import TraceRecord


@dataclass
class ReplayStats:
    """Counters of one set of requests; ``summary()`` derives the reported figures."""

    requests: int = 0
    steps: int = 0  # decode (verify) steps
    decode_tokens: int = 0  # tokens committed by decode steps (bonus included)
    output_tokens: int = 0  # all output tokens (prefill token included)
    drafted: int = 0  # draft nodes proposed
    accepted: int = 0  # draft tokens accepted (bonus excluded)
    speculate_ns: int = 0
    update_ns: int = 0  # extend_request time (prefill token and decode commits)
    start_ns: int = 0  # start_request (prompt ingest)
    finish_ns: int = 0
    depth_drafted: list[int] = field(
        default_factory=list
    )  # [d-1]: steps whose draft reached depth d
    depth_accepted: list[int] = field(default_factory=list)  # [d-1]: steps accepting >= d tokens

    def merge(self, other: ReplayStats) -> None:
        for name in (
            "requests",
            "steps",
            "decode_tokens",
            "output_tokens",
            "drafted",
            "accepted",
            "speculate_ns",
            "update_ns",
            "start_ns",
            "finish_ns",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        _add_into(self.depth_drafted, other.depth_drafted)
        _add_into(self.depth_accepted, other.depth_accepted)

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        tokens = max(self.output_tokens, 1)
        acc = self.depth_accepted + [0] * (len(self.depth_drafted) - len(self.depth_accepted))
        rates = [(a / d if d else 0.0) for a, d in zip(acc, self.depth_drafted, strict=False)]
        return {
            "requests": self.requests,
            "steps": self.steps,
            "output_tokens": self.output_tokens,
            "accept_len": self.decode_tokens / steps if self.steps else 1.0,
            "drafted_per_step": self.drafted / steps,
            "accepted_per_step": self.accepted / steps,
            "draft_efficiency": self.accepted / self.drafted if self.drafted else 0.0,
            "accept_rate_by_depth": rates,
            "us_per_token": (self.speculate_ns + self.update_ns) / tokens / 1e3,
            "speculate_us_per_step": self.speculate_ns / steps / 1e3,
            "update_us_per_token": self.update_ns / tokens / 1e3,
            "start_us_per_request": self.start_ns / max(self.requests, 1) / 1e3,
        }


def _add_into(acc: list[int], other: Sequence[int]) -> None:
    if len(acc) < len(other):
        acc.extend([0] * (len(other) - len(acc)))
    for i, v in enumerate(other):
        acc[i] += v


@dataclass
class ReplayResult:
    overall: ReplayStats
    by_set: dict[str, ReplayStats]
    # per request, the committed tokens of each decode step (for inspection/tests)
    steps: list[list[int]] = field(default_factory=list)


def replay_request(
    drafter: Drafter,
    req_id: object,
    rec: TraceRecord,
    width: int,
    stats: ReplayStats,
    check: bool = False,
) -> list[int]:
    """Replay one request; adds to ``stats`` and returns tokens committed per decode step."""
    if width < 1:
        raise ValueError(f"width must be >= 1 (root included), got {width}")
    budget = width - 1
    out = rec.output_ids
    n = len(out)
    clock = time.perf_counter_ns
    commits: list[int] = []

    prepare = getattr(drafter, "prepare", None)  # e.g. the grammar wrapper (replay/grammar.py)
    if prepare is not None:
        prepare(req_id, rec)
    t0 = clock()
    drafter.start_request(req_id, rec.prompt_ids)
    stats.start_ns += clock() - t0
    stats.requests += 1
    stats.output_tokens += n
    pos = 0
    if n:
        t0 = clock()
        drafter.extend_request(req_id, out[:1])  # prefill's token
        stats.update_ns += clock() - t0
        pos = 1
    while pos < n:
        t0 = clock()
        draft = drafter.speculate(req_id, budget)
        t1 = clock()
        stats.speculate_ns += t1 - t0
        if check:
            validate_draft(draft, budget)
        accepted = greedy_accept(draft, out[pos:])
        commit = min(accepted + 1, n - pos)
        t2 = clock()
        drafter.extend_request(req_id, out[pos : pos + commit])
        stats.update_ns += clock() - t2

        n_nodes = len(draft.tokens)
        stats.steps += 1
        stats.decode_tokens += commit
        stats.drafted += n_nodes
        stats.accepted += min(accepted, commit)
        if n_nodes:
            max_depth = max(node_depths(draft.parents))
            _add_into(stats.depth_drafted, [1] * max_depth)
        if accepted:
            _add_into(stats.depth_accepted, [1] * accepted)
        commits.append(commit)
        pos += commit
    t0 = clock()
    drafter.finish_request(req_id)
    stats.finish_ns += clock() - t0
    return commits


def replay(
    records: Iterable[TraceRecord],
    drafter: Drafter | Callable[[], Drafter],
    width: int,
    check: bool = False,
    progress: Callable[[Iterable[TraceRecord]], Iterable[TraceRecord]] | None = None,
) -> ReplayResult:
    """Replay ``records`` in order through one drafter (state carries across requests).

    ``drafter`` is a drafter or a zero-argument factory. ``check`` validates every
    draft (tree shape and budget). ``progress`` wraps the record iterator (e.g. tqdm).
    """
    if callable(drafter) and not hasattr(drafter, "speculate"):
        drafter = drafter()
    overall = ReplayStats()
    by_set: dict[str, ReplayStats] = {}
    all_steps: list[list[int]] = []
    it = progress(records) if progress else records
    for i, rec in enumerate(it):
        stats = ReplayStats()
        all_steps.append(replay_request(drafter, f"req-{i}", rec, width, stats, check))
        overall.merge(stats)
        by_set.setdefault(rec.set, ReplayStats()).merge(stats)
    return ReplayResult(overall=overall, by_set=by_set, steps=all_steps)
