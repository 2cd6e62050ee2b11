"""Greedy parity: the same prompts at temperature 0 through both endpoints must give
the same output tokens (speculation may change speed, never the greedy output)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang_spec_ext.bench.metrics import RequestResult


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), else ``None``."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(baseline: Sequence[RequestResult], spec: Sequence[RequestResult]) -> dict[str, Any]:
    """Per-prompt comparison; ``ok`` only if every prompt matched on both sides."""
    cases: list[dict[str, Any]] = []
    for i, (b, s) in enumerate(zip(baseline, spec, strict=True)):
        case: dict[str, Any] = {"prompt": i, "match": False}
        if not b.ok or not s.ok or b.output_ids is None or s.output_ids is None:
            case["error"] = b.error or s.error or "no output_ids"
        else:
            pos = first_difference(b.output_ids, s.output_ids)
            case.update(match=pos is None, tokens=len(b.output_ids))
            if pos is not None:
                case.update(
                    first_diff=pos,
                    baseline_tokens=b.output_ids[pos : pos + 8],
                    spec_tokens=s.output_ids[pos : pos + 8],
                    baseline_len=len(b.output_ids),
                    spec_len=len(s.output_ids),
                )
        cases.append(case)
    mismatched = [c for c in cases if not c["match"]]
    return {
        "ok": bool(cases) and not mismatched,
        "prompts": len(cases),
        "mismatches": len(mismatched),
        "cases": cases,
    }


def describe(result: dict[str, Any]) -> str:
    """Lines for the terminal: a verdict, then each mismatch."""
    n, bad = result["prompts"], result["mismatches"]
    if result["ok"]:
        return f"parity: OK, {n} greedy prompts identical token for token"
    lines = [f"parity: FAILED, {bad} of {n} greedy prompts differ"]
    for c in result["cases"]:
        if c["match"]:
            continue
        if "error" in c:
            lines.append(f"  prompt {c['prompt']}: request failed: {c['error']}")
        else:
            lines.append(
                f"  prompt {c['prompt']}: first difference at output token {c['first_diff']}"
                f" (baseline {c['baseline_tokens']} vs speculative {c['spec_tokens']};"
                f" lengths {c['baseline_len']}/{c['spec_len']})"
            )
    return "\n".join(lines)
