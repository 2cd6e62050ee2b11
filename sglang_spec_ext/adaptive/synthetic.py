"""Synthetic acceptance tables for replay benchmarks and tests.

The table format is the one of ``sglang_spec_ext.replay.acceptance_table`` (one JSON
object per request)::

    {"set": str, "ks": [k1, k2, ...], "accepted": [[a(p, k1), a(p, k2), ...], ...]}

where ``a(p, k)`` is the number of draft tokens accepted (bonus excluded) when
speculating with at most ``k`` draft nodes at output position ``p``.

Generative model (a stand-in until real tables exist, not a measurement):

* For every output position the target's token has a *rank* among the drafter's
  candidates (1 = the drafter's top guess, up to ``len(rank_probs)``, or a miss),
  drawn from the ``rank_probs`` of a hidden regime; regimes (e.g. "copying" and
  "novel text") follow a per-request Markov chain, so acceptance is bursty.
* The drafter grows its tree best-first by its own scores (products of
  ``draft_scores`` along the path), so the tree with budget ``k`` is the first ``k``
  nodes of one fixed order and trees of growing budget are nested; small budgets give
  chains, larger budgets add alternatives at shallow depths.
* ``a(p, k)`` is the number of leading prefixes of the true rank path starting at
  ``p`` that are among the first ``k`` nodes (truncated at the end of the request).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Regime:
    rank_probs: tuple[float, ...]  # P(target token has rank r), r = 1..R; rest = miss
    stay: float  # probability of staying in this regime at the next position


@dataclass(frozen=True)
class Profile:
    name: str
    regimes: tuple[Regime, ...]
    draft_scores: tuple[float, ...]  # the drafter's belief in ranks 1..R
    mean_len: float = 400.0


PROFILES: dict[str, Profile] = {
    # agentic / code-editing: mostly copying, occasional novel stretches
    "repetitive": Profile(
        "repetitive",
        (Regime((0.93, 0.03, 0.01), 0.97), Regime((0.45, 0.12, 0.05), 0.9)),
        (0.75, 0.1, 0.04),
    ),
    # open chat: low acceptance, wide shallow trees pay a little
    "chat": Profile(
        "chat",
        (Regime((0.5, 0.14, 0.07), 0.92), Regime((0.25, 0.1, 0.05), 0.92)),
        (0.45, 0.14, 0.07),
    ),
    # EAGLE-shaped chain drafts (topk 1): one candidate per depth, per-depth acceptance
    # around 0.75 with easy and hard stretches (in the range EAGLE-3 papers report for
    # chat; a stand-in, not a measurement)
    "eagle-chain": Profile(
        "eagle-chain",
        (Regime((0.86,), 0.95), Regime((0.55,), 0.9)),
        (0.8,),
        mean_len=300.0,
    ),
}
MIXED = ("repetitive", "chat")


def best_first_order(scores: tuple[float, ...], max_nodes: int) -> dict[tuple[int, ...], int]:
    """Node (rank path) -> position in the drafter's best-first expansion order."""
    order: dict[tuple[int, ...], int] = {}
    heap: list[tuple[float, tuple[int, ...]]] = [(-s, (r + 1,)) for r, s in enumerate(scores)]
    heapq.heapify(heap)
    while heap and len(order) < max_nodes:
        neg, path = heapq.heappop(heap)
        order[path] = len(order)
        for r, s in enumerate(scores):
            heapq.heappush(heap, (neg * s, path + (r + 1,)))
    return order


def _ranks(profile: Profile, length: int, rng: np.random.Generator) -> np.ndarray:
    """Per-position rank of the target token (0 = miss), regime-switching."""
    n_reg = len(profile.regimes)
    state = int(rng.integers(n_reg))
    u_switch = rng.random(length)
    u_rank = rng.random(length)
    out = np.zeros(length, dtype=np.int64)
    cdfs = [np.cumsum(r.rank_probs) for r in profile.regimes]
    for p in range(length):
        reg = profile.regimes[state]
        cdf = cdfs[state]
        r = int(np.searchsorted(cdf, u_rank[p], side="right"))
        out[p] = r + 1 if r < len(cdf) else 0
        if u_switch[p] > reg.stay and n_reg > 1:
            state = (state + 1 + int(rng.integers(n_reg - 1))) % n_reg
    return out


def accepted_table(
    ranks: np.ndarray, order: dict[tuple[int, ...], int], ks: np.ndarray
) -> np.ndarray:
    """``(len(ranks), len(ks))`` accepted draft tokens per position and budget."""
    length = len(ranks)
    out = np.zeros((length, len(ks)), dtype=np.int16)
    for p in range(length):
        idx: list[int] = []
        path: tuple[int, ...] = ()
        q = p
        while q < length - 1:  # the last position has nothing left to draft
            r = int(ranks[q])
            if r == 0:
                break
            path = path + (r,)
            node = order.get(path)
            if node is None:
                break
            idx.append(node)
            q += 1
        if idx:
            out[p] = np.minimum(np.searchsorted(np.array(idx), ks, side="left"), length - 1 - p)
    return out


def generate(
    set_name: str,
    n_requests: int,
    *,
    ks: Iterable[int] = range(1, 33),
    seed: int = 0,
    mean_len: float | None = None,
) -> list[dict]:
    """Synthetic requests for ``set_name`` in ``PROFILES`` or ``"mixed"``."""
    if set_name != "mixed" and set_name not in PROFILES:
        raise ValueError(f"set_name={set_name!r}: expected one of {[*PROFILES, 'mixed']}")
    ks_arr = np.array(sorted(set(ks)), dtype=np.int64)
    rng = np.random.default_rng(seed)
    orders = {n: best_first_order(p.draft_scores, int(ks_arr[-1])) for n, p in PROFILES.items()}
    rows = []
    for i in range(n_requests):
        name = set_name if set_name != "mixed" else MIXED[i % len(MIXED)]
        prof = PROFILES[name]
        mean = mean_len or prof.mean_len
        length = int(np.clip(rng.lognormal(np.log(mean), 0.5), 16, 8 * mean))
        table = accepted_table(_ranks(prof, length, rng), orders[name], ks_arr)
        rows.append({"set": set_name, "ks": ks_arr.tolist(), "accepted": table.tolist()})
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
