"""Per-request results and the figures of one benchmark cell.

Every timestamp is ``time.perf_counter()`` seconds. A request records when it was
sent, when each streamed chunk carrying new tokens arrived (and how many tokens it
carried: a speculative step commits several at once), and when it ended.

- TTFT: first chunk - send time.
- ITL (inter-token latency): the gap between consecutive chunks, spread evenly over
  the tokens of the later chunk (a chunk of 3 tokens after 30 ms gives three 10 ms
  samples), so speculative and plain runs are compared per token.
- TPOT: (last chunk - first chunk) / (output tokens - 1), per request.
- Accept length: the host's per-request ``spec_accept_length`` (tokens per verify
  step, bonus included), averaged weighted by the request's output tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    ok: bool
    start: float = 0.0
    end: float = 0.0
    input_len: int = 0
    output_len: int = 0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    accept_length: float | None = None
    verify_ct: int | None = None
    output_ids: list[int] | None = None
    error: str | None = None

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        if len(self.chunk_times) < 2 or self.output_len < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_len - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear interpolation between order statistics."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def itl_samples(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies from chunk arrival times (see module doc)."""
    out: list[float] = []
    for i in range(1, len(chunk_times)):
        n = max(int(chunk_tokens[i]), 1) if i < len(chunk_tokens) else 1
        gap = chunk_times[i] - chunk_times[i - 1]
        out.extend([gap / n] * n)
    return out


def stats(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """mean / median / p99 (times ``scale``, e.g. 1000 for milliseconds)."""
    if not values:
        return {"mean": None, "median": None, "p99": None}
    med, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "mean": sum(values) / len(values) * scale,
        "median": None if med is None else med * scale,
        "p99": None if p99 is None else p99 * scale,
    }


def weighted_accept_length(results: Sequence[RequestResult]) -> float | None:
    pairs = [(r.accept_length, r.output_len) for r in results if r.accept_length is not None]
    total = sum(n for _, n in pairs)
    if not pairs or total <= 0:
        return None
    return sum(a * n for a, n in pairs) / total


def summarize(
    results: Sequence[RequestResult], t_start: float, t_end: float | None = None
) -> dict[str, Any]:
    """The figures of one cell. ``t_start``: when the cell began sending; the duration
    runs to the end of the last request (or ``t_end``)."""
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    end = t_end if t_end is not None else max((r.end for r in done), default=t_start)
    duration = max(end - t_start, 1e-9)
    out_tok = sum(r.output_len for r in done)
    in_tok = sum(r.input_len for r in done)
    itl: list[float] = []
    for r in done:
        itl.extend(itl_samples(r.chunk_times, r.chunk_tokens))
    verify = [r.verify_ct for r in done if r.verify_ct is not None]
    return {
        "completed": len(done),
        "failed": len(failed),
        "errors": sorted({r.error or "?" for r in failed})[:5],
        "duration_s": duration if done else 0.0,
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "request_throughput": len(done) / duration if done else 0.0,
        "output_throughput": out_tok / duration if done else 0.0,
        "total_throughput": (in_tok + out_tok) / duration if done else 0.0,
        "mean_input_len": in_tok / len(done) if done else None,
        "mean_output_len": out_tok / len(done) if done else None,
        "e2e_latency_s": stats([r.latency for r in done]),
        "ttft_ms": stats([t for r in done if (t := r.ttft) is not None], 1000.0),
        "itl_ms": stats(itl, 1000.0),
        "tpot_ms": stats([t for r in done if (t := r.tpot) is not None], 1000.0),
        "accept_length": weighted_accept_length(done),
        "verify_steps": sum(verify) if verify else None,
    }


def speedup(baseline: dict[str, Any] | None, spec: dict[str, Any] | None) -> float | None:
    """Output-throughput ratio speculative / baseline of one cell."""
    if not baseline or not spec:
        return None
    b, s = baseline.get("output_throughput") or 0.0, spec.get("output_throughput") or 0.0
    return s / b if b > 0 and s > 0 else None
