"""Replay of acceptance tables at a fixed batch size under a width policy.

``B`` requests decode concurrently from output position 1 (a finished request is
replaced by the next one from the pool, cycling; requests get fresh ids each time); every step the policy picks ``k`` for the batch, each request
at output position ``p`` advances by ``a(p, k) + 1`` (``a`` from the nearest table
column ``<= k``; ``a(p, 0) = 0``) and the step is charged ``true_cost(B, k)``. The
policy observes the accepted counts and the charged time times log-normal noise with
occasional outliers (a measured step time, not the truth).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

# Decoding starts at output position 1: prefill produces output[0] (the table format of
# ``sglang_spec_ext.replay.table``); a request of n output tokens takes its decode steps
# from position 1 until position n.
FIRST_POS = 1


class WidthPolicy(Protocol):
    name: str

    def choose(self, batch_size: int, req_ids: Sequence[Hashable]) -> int: ...

    def observe(
        self,
        batch_size: int,
        k: int,
        accepted: np.ndarray,
        step_time_s: float | None,
        req_ids: Sequence[Hashable],
        finished: Sequence[Hashable],
        within: Mapping[int, np.ndarray] | None = None,
    ) -> None: ...


@dataclass
class AcceptanceTable:
    """All requests of one set, concatenated: ``data[offsets[r] + p, j] = a(p, ks[j])``."""

    set_name: str
    ks: np.ndarray
    data: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[dict], set_name: str | None = None) -> AcceptanceTable:
        if not rows:
            raise ValueError("no acceptance rows")
        ks = [int(k) for k in rows[0]["ks"]]
        if any([int(k) for k in r["ks"]] != ks for r in rows):
            raise ValueError("rows of one set must share the same ks")
        if ks != sorted(set(ks)) or ks[0] < 0 or ks[-1] <= 0:
            raise ValueError(f"ks={ks!r}: expected increasing non-negative integers")
        keep = [j for j, k in enumerate(ks) if k > 0]  # a(p, 0) = 0 is implied
        mats = [np.asarray(r["accepted"], dtype=np.int32).reshape(-1, len(ks)) for r in rows]
        mats = [m[:, keep] for m in mats if len(m) > FIRST_POS]
        ks = [ks[j] for j in keep]
        lengths = np.array([len(m) for m in mats], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        data = np.concatenate(mats) if mats else np.zeros((0, len(ks)), dtype=np.int32)
        data = np.maximum(data, 0)
        # a zero-budget column so k = 0 (and k below the first column) reads 0
        data = np.concatenate([np.zeros((len(data), 1), dtype=np.int32), data], axis=1)
        name = set_name or str(rows[0].get("set", "default"))
        return cls(name, np.array([0, *ks]), data, offsets, lengths)

    def column(self, k: int) -> int:
        """Index of the nearest column with budget ``<= k``."""
        return max(0, int(np.searchsorted(self.ks, k, side="right")) - 1)

    def mean_accept_length(self, k: int) -> float:
        return 1.0 + float(self.data[:, self.column(k)].mean())


def load_tables(paths: Iterable[str | Path]) -> dict[str, AcceptanceTable]:
    """Read JSONL acceptance tables, grouped by their ``set`` field."""
    groups: dict[str, list[dict]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    groups.setdefault(str(row.get("set", Path(path).stem)), []).append(row)
    return {name: AcceptanceTable.from_rows(rows, name) for name, rows in groups.items()}


@dataclass
class ReplayResult:
    policy: str
    batch_size: int
    steps: int
    tokens: int
    seconds: float
    k_hist: dict[int, int] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_k(self) -> float:
        total = sum(self.k_hist.values())
        return sum(k * n for k, n in self.k_hist.items()) / total if total else 0.0


def replay(
    table: AcceptanceTable,
    batch_size: int,
    policy: WidthPolicy,
    true_cost: Callable[[int, int], float],
    *,
    steps: int,
    seed: int = 0,
    noise: float = 0.05,
    outlier_rate: float = 0.01,
    outlier_factor: float = 3.0,
    repair_cost: Callable[[int, int], float] | None = None,
) -> ReplayResult:
    """Run ``steps`` steps at constant batch size ``batch_size`` (see module doc).

    ``repair_cost(tokens, requests)``: zero steps leave the draft KV of the tokens they
    commit unwritten, and the first step with ``k > 0`` after them is charged this much
    more for rebuilding it (the draft-KV repair); a new request starts with none missing.
    The policy gets no plain step time for a step with a repair (it is not the cost of
    ``k`` alone) but the whole step's, with the repair's size, through
    ``observe_repair_step`` where it has one, as the server's controller does.
    """
    n_req = len(table.lengths)
    if n_req == 0:
        raise ValueError(f"set {table.set_name!r} has no requests")
    rng = np.random.default_rng(seed)
    pool = rng.permutation(n_req)  # same order for every policy at a given seed
    admitted = 0
    rows = np.empty(batch_size, dtype=np.int64)
    ids: list[int] = []
    for slot in range(batch_size):
        rows[slot] = pool[admitted % n_req]
        ids.append(admitted)
        admitted += 1
    pos = np.full(batch_size, FIRST_POS, dtype=np.int64)
    stale = np.zeros(batch_size, dtype=np.int64)  # tokens without draft KV, per slot
    cost_cache: dict[int, float] = {}
    tokens, seconds = 0, 0.0
    k_hist: dict[int, int] = {}
    tell_unwritten = hasattr(policy, "note_unwritten")
    n_stale = n_reqs = 0
    for _ in range(steps):
        if repair_cost is not None:
            n_stale, n_reqs = int(stale.sum()), int(np.count_nonzero(stale))
            if tell_unwritten:  # as the server's repair gauge does
                policy.note_unwritten(n_stale, n_reqs)  # type: ignore[attr-defined]
        k = int(policy.choose(batch_size, ids))
        k_hist[k] = k_hist.get(k, 0) + 1
        lens = table.lengths[rows]
        acc = table.data[table.offsets[rows] + pos, table.column(k)].astype(np.int64)
        adv = np.minimum(acc + 1, lens - pos)
        tokens += int(adv.sum())
        pos += adv
        t = cost_cache.get(k)
        if t is None:
            t = cost_cache[k] = float(true_cost(batch_size, k))
        measured: float | None = t * math.exp(rng.normal(0.0, noise))
        if rng.random() < outlier_rate:
            measured *= outlier_factor
        if repair_cost is not None:
            if k == 0:
                stale += adv
            elif n_stale:
                repair_t = float(repair_cost(n_stale, n_reqs))
                t += repair_t
                stale[:] = 0
                measured = None
                if hasattr(policy, "observe_repair_step"):
                    total = t * math.exp(rng.normal(0.0, noise))
                    policy.observe_repair_step(batch_size, k, total, n_stale, n_reqs)
        seconds += t
        done = np.flatnonzero(pos >= lens)
        finished = [ids[s] for s in done.tolist()]
        within = None
        if getattr(policy, "wants_within", False) and k > 0:
            base = table.offsets[rows] + pos - adv  # positions this step started from
            within = {int(table.ks[c]): table.data[base, c] for c in range(1, table.column(k))}
        policy.observe(
            batch_size, k, np.minimum(acc, adv - 1), measured, list(ids), finished, within
        )
        for s in done.tolist():
            rows[s] = pool[admitted % n_req]
            ids[s] = admitted
            pos[s] = FIRST_POS
            stale[s] = 0
            admitted += 1
    return ReplayResult(policy.name, batch_size, steps, tokens, seconds, k_hist)


class FixedPolicy:
    """Always the same ``k``."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"fixed k={k}"

    def choose(self, batch_size: int, req_ids: Sequence[Hashable]) -> int:
        return self.k

    def observe(self, *args: object) -> None:
        return None


class ControllerPolicy:
    """Adapter of :class:`AdaptiveController` to :class:`WidthPolicy`.

    ``counterfactual=True`` also hands the controller the accepted counts of every
    smaller table budget at the same positions, which is what a drafter with nested
    best-first trees can report exactly (``accepted_within_budgets``).
    """

    def __init__(
        self, controller: object, name: str = "controller", counterfactual: bool = False
    ) -> None:
        self.ctl = controller
        self.name = name
        self.wants_within = counterfactual

    def choose(self, batch_size: int, req_ids: Sequence[Hashable]) -> int:
        return self.ctl.choose_k(batch_size, req_ids)  # type: ignore[attr-defined]

    def note_unwritten(self, tokens: int, requests: int) -> None:
        self.ctl.note_unwritten(tokens, requests)  # type: ignore[attr-defined]

    def observe_repair_step(
        self, batch_size: int, k: int, seconds: float, tokens: int, requests: int
    ) -> None:
        self.ctl.observe_repair_step(batch_size, k, seconds, tokens, requests)  # type: ignore[attr-defined]

    def observe(
        self,
        batch_size: int,
        k: int,
        accepted: np.ndarray,
        step_time_s: float | None,
        req_ids: Sequence[Hashable],
        finished: Sequence[Hashable],
        within: Mapping[int, np.ndarray] | None = None,
    ) -> None:
        self.ctl.on_verify(batch_size, k, accepted, step_time_s, req_ids, within)  # type: ignore[attr-defined]
        if finished:
            self.ctl.forget_requests(finished)  # type: ignore[attr-defined]
