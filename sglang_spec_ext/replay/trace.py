"""Token trace files: JSONL, one request per line, replayed in file order.

Each line: ``{"prompt_ids": [int, ...], "output_ids": [int, ...], "set": "label"}``
(``set`` optional). ``output_ids`` is the target's greedy output for the prompt.

Optional ``model_drafts`` (for HYBRID replay, ``sglang_spec_ext.replay.hybrid``):
``{draft_name: {"k": K, "tokens": [[t1, ..., tK], ...], "probs": [[p1, ..., pK], ...]}}``
with one entry per output position ``p`` (``len(output_ids)`` entries): the draft
model's greedy chain proposed after the target committed ``prompt_ids + output_ids[:p]``
(so it predicts ``output_ids[p], output_ids[p + 1], ...``) and the draft's probability
of each chosen token (its top probability).

Optional ``constraint`` (grammar-aware replay, ``sglang_spec_ext.replay.grammar``): the
request's structured-output constraint as the host's sampling parameters spell it, one of
``{"json_schema": "..."}``, ``{"regex": "..."}``, ``{"ebnf": "..."}``; ``output_ids`` is then
the target's greedy *constrained* output.

Optional ``target_topk`` (token recycling, ``sglang_spec_ext.replay.recycle``):
``[[t1, ..., tk], ...]`` with one row per output position ``p`` (``len(output_ids)`` rows,
all of the same ``k``): the target's ``k`` most likely next tokens, best first, at the
position of output token ``p`` (its logits after ``prompt_ids + output_ids[:p + 1]``, so
they predict ``output_ids[p + 1]``; under greedy decoding ``t1`` is that token).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SET = "default"
#: The constraint kinds a record may carry (the host's sampling-parameter names).
CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf")


class TraceError(ValueError):
    """A malformed trace file; the message names the file and line."""


@dataclass(frozen=True)
class ModelDrafts:
    """One draft model's greedy proposals at every output position of a request.

    ``tokens[p]`` / ``probs[p]``: the chain of ``k`` tokens proposed after
    ``prompt_ids + output_ids[:p]`` and the draft's probability of each of them.
    """

    k: int
    tokens: tuple[tuple[int, ...], ...]
    probs: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f'"k" = {self.k!r} is not an integer >= 1')
        if len(self.tokens) != len(self.probs):
            raise ValueError(
                f'"tokens" has {len(self.tokens)} entries but "probs" has {len(self.probs)}'
            )
        for p, (toks, probs) in enumerate(zip(self.tokens, self.probs, strict=True)):
            if len(toks) != self.k or len(probs) != self.k:
                raise ValueError(
                    f"position {p}: expected {self.k} tokens and probs, "
                    f"got {len(toks)} and {len(probs)}"
                )

    def to_json(self) -> dict:
        return {"k": self.k, "tokens": [list(t) for t in self.tokens],
                "probs": [list(p) for p in self.probs]}  # fmt: skip


@dataclass(frozen=True)
class TraceRecord:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    set: str = DEFAULT_SET
    # draft name -> proposals at every output position (optional; see the module doc)
    model_drafts: Mapping[str, ModelDrafts] = field(default_factory=dict, hash=False)
    # the request's structured-output constraint (optional; see the module doc)
    constraint: Mapping[str, str] | None = field(default=None, hash=False)
    # the target's top-k next tokens at every output position (optional; see the module doc)
    target_topk: tuple[tuple[int, ...], ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        for name, drafts in self.model_drafts.items():
            if len(drafts.tokens) != len(self.output_ids):
                raise ValueError(
                    f'model_drafts["{name}"] has {len(drafts.tokens)} positions, '
                    f"expected one per output token ({len(self.output_ids)})"
                )
        if self.target_topk:
            check_topk(self.target_topk, len(self.output_ids))
            rows = tuple(tuple(row) for row in self.target_topk)
            object.__setattr__(self, "target_topk", rows)

    @property
    def topk_k(self) -> int:
        """``k`` of ``target_topk`` (0 when the record has none)."""
        return len(self.target_topk[0]) if self.target_topk else 0

    def to_json(self) -> dict:
        out: dict = {
            "set": self.set,
            "prompt_ids": list(self.prompt_ids),
            "output_ids": list(self.output_ids),
        }
        if self.model_drafts:
            out["model_drafts"] = {name: d.to_json() for name, d in self.model_drafts.items()}
        if self.constraint:
            out["constraint"] = dict(self.constraint)
        if self.target_topk:
            check_topk(self.target_topk, len(self.output_ids))
            out["target_topk"] = [list(row) for row in self.target_topk]
        return out


def check_topk(rows: object, n_positions: int) -> None:
    """Raise ``ValueError`` unless ``rows`` is one row of token ids per output position,
    every row of the same length ``k >= 1``."""
    if not isinstance(rows, list | tuple):
        raise ValueError(f'"target_topk" must be a list of rows, got {type(rows).__name__}')
    if len(rows) != n_positions:
        raise ValueError(
            f'"target_topk" has {len(rows)} rows, expected one per output token ({n_positions})'
        )
    k = None
    for p, row in enumerate(rows):
        if not isinstance(row, list | tuple):
            raise ValueError(f'"target_topk"[{p}] must be a list, got {type(row).__name__}')
        if k is None:
            k = len(row)
            if k < 1:
                raise ValueError('"target_topk" rows must hold at least one token')
        elif len(row) != k:
            raise ValueError(f'"target_topk"[{p}] has {len(row)} tokens, expected k = {k}')
        for tok in row:
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(
                    f'"target_topk"[{p}] holds {tok!r}, not a non-negative integer token id'
                )


def parse_topk(obj: object, n_positions: int) -> tuple[tuple[int, ...], ...]:
    """Validate a decoded ``target_topk`` value (``ValueError`` with the reason if bad)."""
    check_topk(obj, n_positions)
    return tuple(tuple(row) for row in obj)  # type: ignore[union-attr]


def _token_list(value: object, key: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ValueError(f'"{key}" must be a list of token ids, got {type(value).__name__}')
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ValueError(f'"{key}"[{i}] = {tok!r} is not a non-negative integer token id')
    return tuple(value)


def _prob_list(value: object, key: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise ValueError(f'"{key}" must be a list of probabilities, got {type(value).__name__}')
    for i, p in enumerate(value):
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f'"{key}"[{i}] = {p!r} is not a probability in [0, 1]')
    return tuple(float(p) for p in value)


def parse_model_drafts(obj: object, n_positions: int) -> dict[str, ModelDrafts]:
    """Validate a decoded ``model_drafts`` value (``ValueError`` with the reason if bad)."""
    if not isinstance(obj, dict):
        raise ValueError(f'"model_drafts" must be an object, got {type(obj).__name__}')
    out: dict[str, ModelDrafts] = {}
    for name, entry in obj.items():
        where = f"model_drafts[{name!r}]"
        if not name:
            raise ValueError('"model_drafts" has an empty draft name')
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object, got {type(entry).__name__}")
        for key in ("k", "tokens", "probs"):
            if key not in entry:
                raise ValueError(f'{where}: missing "{key}"')
        tokens, probs = entry["tokens"], entry["probs"]
        for key, value in (("tokens", tokens), ("probs", probs)):
            if not isinstance(value, list):
                raise ValueError(f'{where}["{key}"] must be a list, got {type(value).__name__}')
            if len(value) != n_positions:
                raise ValueError(
                    f'{where}["{key}"] has {len(value)} entries, expected one per output '
                    f"token ({n_positions})"
                )
        out[name] = ModelDrafts(
            k=entry["k"],
            tokens=tuple(_token_list(t, f"{where}.tokens[{p}]") for p, t in enumerate(tokens)),
            probs=tuple(_prob_list(q, f"{where}.probs[{p}]") for p, q in enumerate(probs)),
        )
    return out


def parse_constraint(obj: object) -> dict[str, str]:
    """Validate a decoded ``constraint`` value (``ValueError`` with the reason if bad)."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError(
            f'"constraint" must be an object with one of {list(CONSTRAINT_KINDS)}, got {obj!r}'
        )
    kind, text = next(iter(obj.items()))
    if kind not in CONSTRAINT_KINDS:
        raise ValueError(
            f'"constraint": unknown kind {kind!r}; use one of {list(CONSTRAINT_KINDS)}'
        )
    if not isinstance(text, str) or not text:
        raise ValueError(f'"constraint"["{kind}"] must be a non-empty string')
    return {kind: text}


def parse_record(obj: object) -> TraceRecord:
    """Validate one decoded JSON line (``ValueError`` with the reason if bad)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("prompt_ids", "output_ids"):
        if key not in obj:
            raise ValueError(f'missing "{key}"')
    label = obj.get("set", DEFAULT_SET)
    if not isinstance(label, str) or not label:
        raise ValueError(f'"set" must be a non-empty string, got {label!r}')
    output_ids = _token_list(obj["output_ids"], "output_ids")
    drafts = obj.get("model_drafts")
    constraint = obj.get("constraint")
    topk = obj.get("target_topk")
    return TraceRecord(
        prompt_ids=_token_list(obj["prompt_ids"], "prompt_ids"),
        output_ids=output_ids,
        set=label,
        model_drafts=parse_model_drafts(drafts, len(output_ids)) if drafts is not None else {},
        constraint=parse_constraint(constraint) if constraint is not None else None,
        target_topk=parse_topk(topk, len(output_ids)) if topk is not None else (),
    )


def read_trace(path: Path | str, limit: int | None = None) -> list[TraceRecord]:
    """Records of a trace file in order; blank lines are skipped.

    Raises ``TraceError`` naming the file and 1-based line number of the first bad line.
    """
    path = Path(path)
    records: list[TraceRecord] = []
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace: {exc.strerror or exc}") from exc
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from exc
            try:
                records.append(parse_record(obj))
            except ValueError as exc:
                raise TraceError(f"{path}:{lineno}: {exc}") from exc
            if limit is not None and len(records) >= limit:
                break
    if not records:
        raise TraceError(f"{path}: trace holds no records")
    return records


def write_trace(path: Path | str, records: Iterable[TraceRecord]) -> int:
    """Write records as JSONL; returns how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")
            n += 1
    return n
