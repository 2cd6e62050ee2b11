"""Exact offline replay of HYBRID: per request and step, the suffix draft or a model draft.

Under greedy decoding the target's output does not depend on the drafts, and the
greedy chain a draft model proposes after a committed prefix does not either, so
trace records carrying the model's proposals at every output position
(``TraceRecord.model_drafts``, written by ``benchmarks/model_drafts.py``) replay
HYBRID exactly. The loop mirrors serving as ``replay.engine`` does: prefill commits
the first output token; then each decode step builds both candidates, the suffix
drafter's tree (at most ``width - 1`` nodes, scored by ``DraftTree.score``) and the
model's chain at the current position (truncated to ``steps`` tokens, scored by
:func:`~sglang_spec_ext.hybrid.choice.chain_score` of its probabilities); one
:class:`~sglang_spec_ext.hybrid.choice.HybridState` picks the source by its policy; the
chosen draft is accepted greedily and the accepted tokens plus the bonus are
committed (to the drafter, and to the state, which learns from both drafts).

One state and one suffix drafter serve all records of a run in order, like a
server: the suffix drafter's global tree and HYBRID's learned gain map carry over
from one request to the next. Engine-agnostic: no torch, no SGLang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_spec_ext.hybrid.candidate import MODEL, SOURCES, SUFFIX, Candidate
from sglang_spec_ext.hybrid.choice import (
    POLICIES,
    HybridState,
    SourceStats,
    chain_score,
    source_shares,
)
from sglang_spec_ext.replay.drafters import DrafterOptions, make_drafter
from sglang_spec_ext.replay.protocol import Drafter, greedy_accept
from sglang_spec_ext.replay.trace import TraceRecord
from sglang_spec_ext.suffix.draft import DraftTree

#: Not a server policy: per step, the source whose draft the target accepts more of
#: (ties: the model), known only in hindsight. An upper bound for a per-step choice.
ORACLE = "oracle"
REPLAY_POLICIES: tuple[str, ...] = (*POLICIES, ORACLE)


@dataclass
class HybridStats:
    """Counters of one set of requests; ``summary()`` derives the reported figures."""

    requests: int = 0
    steps: int = 0  # decode (verify) steps
    decode_tokens: int = 0  # tokens committed by decode steps (bonus included)
    output_tokens: int = 0  # all output tokens (prefill token included)
    accepted: int = 0  # draft tokens accepted (bonus excluded)
    model_skipped: int = 0  # steps the model did not draft (the suffix draft won before)
    by_source: dict[str, SourceStats] = field(
        default_factory=lambda: {s: SourceStats() for s in SOURCES}
    )

    def add_step(self, source: str, committed: int, accepted: int) -> None:
        self.steps += 1
        self.decode_tokens += committed
        self.accepted += accepted
        self.by_source[source].add(committed, accepted)

    def merge(self, other: HybridStats) -> None:
        for name in ("requests", "steps", "decode_tokens", "output_tokens", "accepted",
                     "model_skipped"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for source, counts in other.by_source.items():
            self.by_source.setdefault(source, SourceStats()).merge(counts)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "steps": self.steps,
            "output_tokens": self.output_tokens,
            "accept_len": self.decode_tokens / self.steps if self.steps else 1.0,
            "accepted_per_step": self.accepted / (self.steps or 1),
            "model_skipped_share": self.model_skipped / (self.steps or 1),
            "by_source": source_shares(self.by_source),
        }


@dataclass
class HybridResult:
    policy: str
    steps_k: int  # model draft length (chain tokens)
    width: int  # verify width, root included
    draft_name: str
    suffix_width: int  # a winning suffix draft's verify width (wide steps above ``width``)
    overall: HybridStats
    by_set: dict[str, HybridStats]
    state: dict[str, Any]  # HybridState.summary() at the end of the run
    estimator: dict[str, list[dict[str, float]]]  # the learned gain table at the end
    # per request: tokens committed and the verified source at each decode step
    commits: list[list[int]] = field(default_factory=list)
    sources: list[list[str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "k": self.steps_k,
            "width": self.width,
            "suffix_width": self.suffix_width,
            "draft": self.draft_name,
            "overall": self.overall.summary(),
            "by_set": {name: s.summary() for name, s in self.by_set.items()},
        }


def _pick_draft_name(records: Sequence[TraceRecord], draft_name: str | None) -> str:
    if draft_name is not None:
        return draft_name
    names = {n for rec in records for n in rec.model_drafts}
    if len(names) != 1:
        raise ValueError(
            f"records carry model drafts {sorted(names) or 'none'}: name one with draft_name"
        )
    return names.pop()


def model_candidate(rec: TraceRecord, draft_name: str, pos: int, max_tokens: int) -> Candidate:
    """The model's chain proposed after ``prompt + output[:pos]``, first ``max_tokens``
    tokens, scored by :func:`chain_score` of their probabilities."""
    drafts = rec.model_drafts[draft_name]
    tokens = drafts.tokens[pos][:max_tokens]
    probs = drafts.probs[pos][:max_tokens]
    parents = tuple(range(-1, len(tokens) - 1))
    return Candidate(MODEL, tuple(tokens), parents, chain_score(probs))


def suffix_candidate(drafter: Drafter, rid: Any, max_nodes: int) -> Candidate:
    """The suffix drafter's tree as a candidate (score and match length as it reports)."""
    return _candidate(drafter.speculate(rid, max_nodes))


def suffix_cut_and_whole(
    drafter: Drafter, rid: Any, cut: int, max_nodes: int
) -> tuple[Candidate, Candidate | None]:
    """As the server chooses with wide steps: the suffix draft of up to ``max_nodes`` nodes
    cut to its first ``cut`` (``DraftTree.first``) and, where longer, the whole one."""
    tree = drafter.speculate(rid, max_nodes)
    short = tree.first(cut) if isinstance(tree, DraftTree) else drafter.speculate(rid, cut)
    whole = _candidate(tree) if len(tree.tokens) > len(short.tokens) else None
    return _candidate(short), whole


def _candidate(tree: Any) -> Candidate:
    return Candidate(
        SUFFIX,
        tuple(tree.tokens),
        tuple(tree.parents),
        float(getattr(tree, "score", 0.0)),
        int(getattr(tree, "match_len", 0)),
    )


def replay_hybrid(
    records: Iterable[TraceRecord],
    policy: str = "learned",
    steps: int = 5,
    width: int | None = None,
    suffix_options: DrafterOptions | None = None,
    draft_name: str | None = None,
    drafter: Drafter | None = None,
    state: HybridState | None = None,
    skip_model: bool = False,
    suffix_width: int | None = None,
) -> HybridResult:
    """Replay ``records`` in order with HYBRID's choice under ``policy`` (one of
    ``hybrid.POLICIES``, or :data:`ORACLE`, the hindsight bound).

    ``steps``: model draft length K (each record's stored chains are truncated to
    it). ``width``: verify width including the root, ``K + 1`` by default (the host's
    width for a top-1 chain of K tokens); both drafts hold at most ``width - 1``
    nodes. ``suffix_options`` configures the suffix drafter (``make_drafter("suffix")``),
    unless a ``drafter`` is given. ``draft_name`` picks the records' model draft
    (default: the only one they carry). ``state`` (default: a fresh
    ``HybridState(policy)``) carries the choice across requests. ``skip_model``: as a
    server with ``SGLANG_SPEC_EXT_HYBRID_SKIP_MODEL_DRAFT`` on (at batch size 1), a step
    whose suffix draft wins whatever the model drafts (``HybridChooser.
    suffix_wins_before_model_drafts``, from the first token's probability) takes it
    without a model draft (counted in ``model_skipped``; the state then learns nothing
    of the model from that step).
    ``suffix_width``: a winning suffix draft keeps up to ``suffix_width - 1`` nodes (the
    server's wide steps, ``hybrid/wide.py``, taken whenever they add expected tokens: a
    replay has no step cost) while the model's chain stays at ``width - 1``; default
    ``width`` (the suffix draft cut to the model's width, as a server without wide steps).
    """
    records = list(records)
    if policy not in REPLAY_POLICIES:
        raise ValueError(f"policy={policy!r} is invalid: expected one of {REPLAY_POLICIES}")
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    width = steps + 1 if width is None else width
    if width < 2:
        raise ValueError(f"width={width} must be >= 2 (root plus one draft node)")
    budget = width - 1
    suffix_budget = max(width, suffix_width or width) - 1
    name = _pick_draft_name(records, draft_name)
    for i, rec in enumerate(records):
        drafts = rec.model_drafts.get(name)
        if drafts is None:
            raise ValueError(f"record {i} ({rec.set}) has no model draft {name!r}")
        if drafts.k < min(steps, budget):
            raise ValueError(
                f"record {i} ({rec.set}): model draft {name!r} holds {drafts.k} tokens per "
                f"position, fewer than the {min(steps, budget)} asked for"
            )
    if drafter is None:
        opts = suffix_options or DrafterOptions(width=suffix_budget + 1)
        drafter = make_drafter("suffix", opts)
    if state is None:
        state = HybridState("learned" if policy == ORACLE else policy)
    elif policy != ORACLE and state.chooser.policy != policy:
        raise ValueError(f"state has policy {state.chooser.policy!r}, not {policy!r}")

    overall = HybridStats()
    by_set: dict[str, HybridStats] = {}
    all_commits: list[list[int]] = []
    all_sources: list[list[str]] = []
    for i, rec in enumerate(records):
        rid = f"req-{i}"
        stats = by_set.setdefault(rec.set, HybridStats())
        commits, sources = _replay_one(
            drafter, state, rid, rec, name, steps, budget, stats, oracle=policy == ORACLE,
            skip_model=skip_model and policy != ORACLE, suffix_budget=suffix_budget,
        )  # fmt: skip
        all_commits.append(commits)
        all_sources.append(sources)
    for stats in by_set.values():
        overall.merge(stats)
    return HybridResult(
        policy=policy,
        steps_k=steps,
        width=width,
        draft_name=name,
        suffix_width=suffix_budget + 1,
        overall=overall,
        by_set=by_set,
        state=state.summary(),
        estimator=state.estimator.table(),
        commits=all_commits,
        sources=all_sources,
    )


def _replay_one(
    drafter: Drafter,
    state: HybridState,
    rid: str,
    rec: TraceRecord,
    name: str,
    steps: int,
    budget: int,
    stats: HybridStats,
    oracle: bool = False,
    skip_model: bool = False,
    suffix_budget: int | None = None,
) -> tuple[list[int], list[str]]:
    out = rec.output_ids
    n = len(out)
    commits: list[int] = []
    sources: list[str] = []
    drafter.start_request(rid, rec.prompt_ids)
    stats.requests += 1
    stats.output_tokens += n
    pos = 0
    if n:
        drafter.extend_request(rid, out[:1])  # prefill's token
        pos = 1
    while pos < n:
        # chosen on the suffix draft cut to the model's width; a winning one is verified
        # whole (up to suffix_budget nodes): every wide step taken
        suffix, whole = suffix_cut_and_whole(drafter, rid, budget, suffix_budget or budget)
        model = model_candidate(rec, name, pos, min(steps, budget))
        first = rec.model_drafts[name].probs[pos][0] if model.tokens else 0.0
        if skip_model and state.chooser.suffix_wins_before_model_drafts(
            suffix, first, min(steps, budget)
        ):
            winner = state.take_suffix(rid, pos, suffix, whole)
            stats.model_skipped += 1
        elif oracle:
            best = whole or suffix
            better = greedy_accept(best, out[pos:]) > greedy_accept(model, out[pos:])
            winner = SUFFIX if better else MODEL
        else:
            winner = state.choose(rid, pos, suffix, model, whole)
        chosen = (whole or suffix) if winner == SUFFIX else model
        accepted = greedy_accept(chosen, out[pos:])
        commit = min(accepted + 1, n - pos)
        accepted = min(accepted, commit)
        tokens = out[pos : pos + commit]
        state.verified(rid, winner, accepted, tokens)
        drafter.extend_request(rid, tokens)
        stats.add_step(winner, commit, accepted)
        commits.append(commit)
        sources.append(winner)
        pos += commit
    state.finish(rid)
    drafter.finish_request(rid)
    return commits, sources


def interleave(*groups: Sequence[TraceRecord], label: str = "mixed") -> list[TraceRecord]:
    """Records of ``groups`` taken alternately (round-robin, the rest in order once a
    group runs out), relabelled ``label``: one mixed workload."""
    out: list[TraceRecord] = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        for g in groups:
            if i < len(g):
                out.append(dataclasses.replace(g[i], set=label))
    return out
