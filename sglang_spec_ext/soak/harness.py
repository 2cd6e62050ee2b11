"""One soak run: plain answers first, then the load on the speculative server, an idle
pause (the host's idle memory check runs when the scheduler is idle), greedy requests
re-sent after the aborts, and the verdict."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from sglang_spec_ext.soak.runner import (
    Outcome,
    ServerHandle,
    Verdict,
    judge,
    run_requests,
)
from sglang_spec_ext.soak.workload import SoakRequest


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the bench extra
        return None
    return tqdm(total=total, desc=desc, unit="req", leave=False)


def plain_answers(
    plain_url: str,
    reqs: Sequence[SoakRequest],
    *,
    concurrency: int,
    deadline_s: float,
    progress: bool = False,
) -> dict[int, Outcome]:
    """The plain server's outcome for every request that is compared: parity kinds and
    requests that must be refused."""
    wanted = [r for r in reqs if r.parity or r.expect == "refused"]
    bar = _bar(len(wanted), "plain server", progress)
    outs = run_requests(
        plain_url,
        wanted,
        concurrency=concurrency,
        deadline_s=deadline_s,
        progress=bar.update if bar is not None else None,
    )
    if bar is not None:
        bar.close()
    return {o.index: o for o in outs}


def soak(
    spec: ServerHandle,
    plain_url: str,
    reqs: Sequence[SoakRequest],
    *,
    concurrency: int,
    deadline_s: float = 1800.0,
    idle_s: float = 3.0,
    post_abort: int = 16,
    drafter_bound_tokens: int | None = None,
    plain: dict[int, Outcome] | None = None,
    progress: bool = False,
    seed: int = 0,
    guarded: bool = False,
) -> tuple[Verdict, dict[str, Any]]:
    """Run ``reqs`` against ``spec`` and judge it against the plain server at ``plain_url``.

    ``plain`` may carry answers computed earlier (one plain pass serves several
    speculative servers). ``guarded``: ``spec`` runs one of this package's algorithms
    (see :func:`sglang_spec_ext.soak.runner.judge`). Returns the verdict and timings.
    """
    t0 = time.monotonic()
    if plain is None:
        plain = plain_answers(plain_url, reqs, concurrency=concurrency, deadline_s=deadline_s)
    t_plain = time.monotonic() - t0
    bar = _bar(len(reqs), "speculative server", progress)
    t1 = time.monotonic()
    outs = run_requests(
        spec.url,
        reqs,
        concurrency=concurrency,
        deadline_s=deadline_s,
        progress=bar.update if bar is not None else None,
    )
    t_spec = time.monotonic() - t1
    if bar is not None:
        bar.close()
    time.sleep(idle_s)  # the host checks its KV pools whenever the scheduler is idle
    # Greedy requests again, after every abort and disconnect above.
    rng = random.Random(seed + 1)
    greedy = [r for r in reqs if r.parity and r.index in plain and plain[r.index].status == "ok"]
    again = rng.sample(greedy, min(post_abort, len(greedy)))
    redo = run_requests(spec.url, again, concurrency=min(4, concurrency), deadline_s=deadline_s)
    pairs = [(o, plain[o.index]) for o in redo]
    time.sleep(idle_s)
    verdict = judge(
        reqs, outs, plain, pairs, spec, drafter_bound_tokens=drafter_bound_tokens, guarded=guarded
    )
    timing = {"plain_s": round(t_plain, 2), "spec_s": round(t_spec, 2)}
    return verdict, timing


def format_table(rows: Sequence[tuple[str, Verdict]]) -> str:
    """Per algorithm and request kind: sent, answered, refused, disconnected, errors, mismatches."""
    cols = ("sent", "ok", "refused", "disconnected", "error", "timeout", "mismatch")
    head = f"| {'algorithm':<16} | {'kind':<11} | " + " | ".join(f"{c:>12}" for c in cols) + " |"
    lines = [head, "|" + "|".join("-" * len(p) for p in head.split("|")[1:-1]) + "|"]
    for name, v in rows:
        for kind in sorted(v.per_kind):
            row = v.per_kind[kind]
            cells = " | ".join(f"{row.get(c, 0):>12}" for c in cols)
            lines.append(f"| {name:<16} | {kind:<11} | {cells} |")
        acc = f"{v.mean_accept_length:.2f}" if v.mean_accept_length else "-"
        peak = v.drafter_peak.get("cached_tokens", "-")
        lines.append(
            f"| {name:<16} | {'VERDICT':<11} | "
            f"{'PASS' if v.ok else 'FAIL'}: alive={v.server_alive} fatal_log={len(v.fatal_log_lines)} "
            f"parity {v.parity_checked - v.parity_mismatches}/{v.parity_checked} "
            f"after-aborts {v.post_abort_checked - v.post_abort_mismatches}/{v.post_abort_checked} "
            f"accept_len {acc} drafter_peak_tokens {peak} "
            f"within_bound {v.drafter_within_bound} |"
        )
    return "\n".join(lines)
