"""Acceptance tables: for every output position and draft budget, how many draft
tokens a greedy verifier would accept. They feed the adaptive-controller benchmark,
which picks a budget per step and needs the outcome of every choice.

``a(p, k)``: the drafter has committed ``output[:p]`` (after the prompt) and
speculates with at most ``k`` draft nodes; ``a`` is the number of draft tokens
accepted against ``output[p:]`` (bonus excluded, so ``0 <= a <= min(k, n - p)``).
A step at position ``p`` choosing budget ``k`` commits ``min(a(p, k) + 1, n - p)``
tokens. Serving drafts first at ``p = 1`` (prefill produces ``output[0]``); the row
for ``p = 0`` is there for completeness.

The drafter is advanced one token at a time, so the table is exact for drafters
whose state depends only on the committed tokens (suffix, prompt-lookup, arctic);
for the host NGRAM corpus, whose inserts depend on step boundaries, it is an
approximation.

File format (JSONL), one line per request:
``{"set": str, "ks": [k1, ...], "accepted": [[a(p, k1), a(p, k2), ...] for p in 0..n-1]}``
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_spec_ext.replay.protocol import Draft, Drafter, greedy_accept
from sglang_spec_ext.replay.trace import TraceRecord


@dataclass(frozen=True)
class AcceptanceRow:
    set: str
    ks: tuple[int, ...]
    accepted: tuple[tuple[int, ...], ...]  # [position][index of k]

    def to_json(self) -> dict:
        return {"set": self.set, "ks": list(self.ks), "accepted": [list(r) for r in self.accepted]}

    def column(self, k: int) -> list[int]:
        j = self.ks.index(k)
        return [r[j] for r in self.accepted]


def acceptance_table(
    records: Iterable[TraceRecord],
    drafter_factory: Callable[[], Drafter],
    ks: Sequence[int],
    progress: Callable[[Iterable[TraceRecord]], Iterable[TraceRecord]] | None = None,
) -> list[AcceptanceRow]:
    """One ``AcceptanceRow`` per record, requests in order through one drafter."""
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 0:
        raise ValueError(f"ks must be non-empty and non-negative, got {ks}")
    drafter = drafter_factory()
    rows: list[AcceptanceRow] = []
    it = progress(records) if progress else records
    for i, rec in enumerate(it):
        req_id = f"req-{i}"
        out = rec.output_ids
        drafter.start_request(req_id, rec.prompt_ids)
        table: list[tuple[int, ...]] = []
        for p in range(len(out)):
            cont = out[p:]
            table.append(tuple(greedy_accept(drafter.speculate(req_id, k), cont) for k in ks))
            drafter.extend_request(req_id, out[p : p + 1])
        drafter.finish_request(req_id)
        rows.append(AcceptanceRow(set=rec.set, ks=ks, accepted=tuple(table)))
    return rows


def model_draft_table(records: Iterable[TraceRecord], draft: str) -> list[AcceptanceRow]:
    """Acceptance of a model draft's greedy chains (the trace's ``model_drafts[draft]``).

    A chain of ``k`` steps verifies the first ``k`` proposed tokens, so ``a(p, k)`` is
    the number of leading proposals at ``p`` that match ``output[p:]``, capped at ``k``;
    ``ks`` are ``1..K`` for the trace's chain length ``K``. Exact for chain (topk 1)
    drafting: the draft's proposal depends only on the committed tokens.
    """
    rows: list[AcceptanceRow] = []
    for rec in records:
        drafts = rec.model_drafts.get(draft)
        if drafts is None:
            raise ValueError(f"trace record of set {rec.set!r} has no model draft {draft!r}")
        ks = tuple(range(1, drafts.k + 1))
        out = rec.output_ids
        table = []
        for p, chain in enumerate(drafts.tokens):
            full = greedy_accept(Draft.chain(chain), out[p:])
            table.append(tuple(min(full, k) for k in ks))
        rows.append(AcceptanceRow(set=rec.set, ks=ks, accepted=tuple(table)))
    return rows


def simulate_fixed_budget(row: AcceptanceRow, k: int, first_pos: int = 1) -> list[int]:
    """Tokens committed per decode step when every step drafts with budget ``k``."""
    col = row.column(k)
    n = len(col)
    pos, commits = min(first_pos, n), []
    while pos < n:
        c = min(col[pos] + 1, n - pos)
        commits.append(c)
        pos += c
    return commits


def write_acceptance_table(path: Path | str, rows: Iterable[AcceptanceRow]) -> int:
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row.to_json(), separators=(",", ":")) + "\n")
            n += 1
    return n


def read_acceptance_table(path: Path | str) -> list[AcceptanceRow]:
    """Rows of a table file; ``ValueError`` naming the line of the first bad one."""
    rows: list[AcceptanceRow] = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ks = tuple(int(k) for k in obj["ks"])
                acc = tuple(tuple(int(a) for a in r) for r in obj["accepted"])
                if any(len(r) != len(ks) for r in acc):
                    raise ValueError("every 'accepted' entry needs one value per k")
                rows.append(AcceptanceRow(set=str(obj.get("set", "default")), ks=ks, accepted=acc))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: bad acceptance row: {exc}") from exc
    return rows
