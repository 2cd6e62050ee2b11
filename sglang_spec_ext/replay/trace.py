"""Token trace files: JSONL, one request per line, replayed in file order.

Each line: ``{"prompt_ids": [int, ...], "output_ids": [int, ...], "set": "label"}``
(``set`` optional). ``output_ids`` is the target's greedy output for the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SET = "default"


class TraceError(ValueError):
    """A malformed trace file; the message names the file and line."""


@dataclass(frozen=True)
class TraceRecord:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    set: str = DEFAULT_SET

    def to_json(self) -> dict:
        return {
            "set": self.set,
            "prompt_ids": list(self.prompt_ids),
            "output_ids": list(self.output_ids),
        }


def _token_list(value: object, key: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ValueError(f'"{key}" must be a list of token ids, got {type(value).__name__}')
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ValueError(f'"{key}"[{i}] = {tok!r} is not a non-negative integer token id')
    return tuple(value)


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
    return TraceRecord(
        prompt_ids=_token_list(obj["prompt_ids"], "prompt_ids"),
        output_ids=_token_list(obj["output_ids"], "output_ids"),
        set=label,
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
