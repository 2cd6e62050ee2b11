"""What the draft-KV repair has to rebuild: the marks on requests, the counters, the plan.

A skipped zero-step draft extend, or a prefill extend deferred at zero steps, leaves
draft-KV positions unwritten (the hooks that skip them are in ``kv_repair.py``). Each
request carries the first of its unwritten positions on the host's ``Req``
(:data:`STALE_ATTR`); :data:`STATS` counts the repairs and gauges what the next one would
rebuild (:attr:`RepairStats.unwritten_tokens`, what the goodput controller prices:
``step_policy.py``); :func:`plan_rows` says which positions one bounded repair forward
(``kv_repair_forward.py``) recomputes of each request. Requests are read by their fields
only (the committed tokens the scheduler knows).

The other modules read the counters as ``kv_repair_marks.STATS`` (through this module,
so that a test can swap in fresh ones).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sglang_spec_ext.sglang.serving import metrics as spec_metrics

logger = logging.getLogger("sglang_spec_ext")

#: Attribute on a host ``Req``: first draft-KV position a skipped step left unwritten.
STALE_ATTR = "_spec_ext_draft_kv_stale_from"
#: Log line prefix of the repair counters (JSON-free: ``key=value`` pairs).
STATS_LOG_MARK = "sglang-spec-ext draft-KV repair: "


class RepairStats:
    """Counters of this process's repairs (read by tests and the stats log line)."""

    def __init__(self) -> None:
        self.marked_steps = 0
        self.deferred_prefills = 0  # prefill draft extends skipped at zero steps
        self.repairs = 0
        self.requests = 0
        self.tokens = 0
        self.deferred = 0
        self.truncated = 0
        self.failures = 0
        # gauge: draft KV the next repair would rebuild (tokens, capped at max_tokens;
        # requests), as of the last skipped step; what the controller prices
        self.unwritten_tokens = 0
        self.unwritten_requests = 0
        self.enabled = True
        self.max_tokens = 8192
        self.log_interval_s = 30.0
        self._last_log: float | None = None

    def maybe_log(self) -> None:
        """An INFO line with the counters: the first repair, then at most one per interval."""
        now = time.monotonic()
        if self._last_log is None or now - self._last_log >= self.log_interval_s:
            self._last_log = now
            logger.info("%s", self.line())
            spec_metrics.publish_repairs(self)

    def line(self) -> str:
        return STATS_LOG_MARK + " ".join(
            f"{k}={getattr(self, k)}"
            for k in (
                "repairs",
                "requests",
                "tokens",
                "deferred",
                "truncated",
                "failures",
                "deferred_prefills",
            )  # fmt: skip
        )


STATS = RepairStats()


def known_len(req: Any) -> int:
    """How many committed tokens the scheduler knows of the request (prompt + output)."""
    return len(req.origin_input_ids) + len(req.output_ids)


def token_slice(req: Any, lo: int, hi: int) -> list[int]:
    """Committed tokens ``lo..hi-1`` of the request (positions), without copying the rest."""
    prompt, output = req.origin_input_ids, req.output_ids
    n = len(prompt)
    head = list(prompt[lo:hi]) if lo < n else []
    return head + list(output[max(lo - n, 0) : max(hi - n, 0)])


def plan_rows(
    stale_from: list[int | None],
    seq_lens: list[int],
    known_lens: list[int],
    budget: int,
) -> tuple[list[int], list[int], list[bool]]:
    """Per request: first recomputed position, row count, and whether its mark clears.

    A marked request recomputes ``[stale_from, seq_len)`` (the last ``share`` positions
    of it where the budget, split evenly over marked requests, is smaller); an unmarked
    one its last position only. A request whose committed tokens up to ``seq_len - 1``
    are not known yet (overlap) gets its last position only and keeps its mark.
    """
    marked = [s is not None for s in stale_from]
    n_marked = sum(marked)
    share = max(1, budget // max(1, n_marked))
    starts, counts, clears = [], [], []
    for s, length, known in zip(stale_from, seq_lens, known_lens, strict=True):
        first = length - 1
        clear = False
        if s is not None and known >= length:
            first = max(min(s, length - 1), length - share, 0)
            clear = True
        starts.append(first)
        counts.append(length - first)
        clears.append(clear)
    return starts, counts, clears
