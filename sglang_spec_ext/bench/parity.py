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


#: Server fields that decide whether greedy outputs can be bit-identical (``/server_info``).
PARITY_FIELDS = ("device", "dtype", "kv_cache_dtype", "enable_deterministic_inference")


def bit_identity_caveats(role: str, fields: dict[str, Any] | None) -> list[str]:
    """Why greedy outputs of this server may differ from another's without a bug.

    Speculation is exact in exact arithmetic; a verify of W tokens through tree
    attention does not run the same floating-point reductions as a one-token decode,
    so with 16-bit weights or KV (or batch-size-dependent GPU kernels) near-ties can
    flip. Identical output is expected in fp32 on the CPU engine, or on GPU with the
    host's ``--enable-deterministic-inference`` and fp32; ``fields`` are the server's
    :data:`PARITY_FIELDS` (``None``: unknown, which is a caveat of its own)."""
    if fields is None:
        return [f"{role}: server settings unknown (no /server_info); bit-identity unchecked"]
    out = []
    dtype = str(fields.get("dtype") or "auto")
    device = str(fields.get("device") or "cuda")
    kv = str(fields.get("kv_cache_dtype") or "auto")
    deterministic = bool(fields.get("enable_deterministic_inference"))
    if dtype not in ("float32", "float"):
        out.append(
            f"{role}: --dtype {dtype} (16-bit on most models): a multi-token verify and a "
            "one-token decode round differently, so greedy near-ties can flip"
        )
    if kv not in ("auto", "float32") and not (kv == "auto" and dtype == "float32"):
        out.append(f"{role}: --kv-cache-dtype {kv}: quantized KV, near-ties can flip")
    if device != "cpu" and not deterministic:
        out.append(
            f"{role}: {device} without --enable-deterministic-inference: kernels whose "
            "reductions depend on the batch shape can flip near-ties"
        )
    return out


def describe(result: dict[str, Any]) -> str:
    """Lines for the terminal: a verdict, then each mismatch."""
    n, bad = result["prompts"], result["mismatches"]
    caveats = result.get("caveats") or []
    notes = [f"  warning: {c}" for c in caveats]
    if caveats:
        notes.insert(0, "  these runs cannot be expected to be bit-identical:")
    if result["ok"]:
        return "\n".join([f"parity: OK, {n} greedy prompts identical token for token", *notes])
    lines = [f"parity: FAILED, {bad} of {n} greedy prompts differ", *notes]
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
