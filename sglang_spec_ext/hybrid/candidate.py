"""One source's draft for one request and step, as HYBRID compares them (engine-agnostic)."""

from __future__ import annotations

from dataclasses import dataclass

SUFFIX = "suffix"
MODEL = "model"
SOURCES: tuple[str, ...] = (SUFFIX, MODEL)


@dataclass(frozen=True)
class Candidate:
    """One source's draft for one request and step."""

    source: str
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    score: float
    match_len: int = 0
