"""Rate-limited WARNING lines for suffix-drafter faults (``suffix_sessions.py``).

A drafter fault never stops serving (the request plain-decodes that step and its
session restarts), but a fault that repeats must not flood the server log: each
request id is logged once (the last :data:`FAULT_LOG_MEMORY` ids remembered), at most
:data:`FAULT_LOG_BURST` lines per :data:`FAULT_LOG_WINDOW_S` seconds, the lines left out
counted in the next one, the first fault with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

logger = logging.getLogger("sglang_spec_ext")

#: Request ids remembered as "fault already logged" (oldest forgotten first).
FAULT_LOG_MEMORY = 4096
#: At most this many drafter-fault WARNING lines per FAULT_LOG_WINDOW_S seconds.
FAULT_LOG_BURST = 10
FAULT_LOG_WINDOW_S = 60.0


class FaultLog:
    """The fault lines of one drafter (one per SUFFIX worker)."""

    def __init__(self) -> None:
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._window = (0.0, 0)  # (window start, lines logged in it)
        self._suppressed = 0

    def log(self, stage: str, rid: str | None, exc: BaseException, total: int) -> None:
        """A WARNING line for a fault in ``stage`` for ``rid`` unless this request's
        fault was already logged or the burst limit is reached (``total``: faults so far)."""
        key = f"{stage}:{rid}" if rid is None else rid
        if key in self._logged:
            return  # once per request id
        self._logged[key] = None
        if len(self._logged) > FAULT_LOG_MEMORY:
            self._logged.popitem(last=False)
        now = time.monotonic()
        start, lines = self._window
        if now - start > FAULT_LOG_WINDOW_S:
            start, lines = now, 0
        if lines >= FAULT_LOG_BURST:
            self._suppressed += 1
            self._window = (start, lines)
            return
        suppressed, self._suppressed = self._suppressed, 0
        self._window = (start, lines + 1)
        logger.warning(
            "SUFFIX drafter fault in %s for request %s (%s: %s): plain decoding for it this "
            "step, its drafter session restarts; %d faults so far%s",
            stage,
            rid,
            type(exc).__name__,
            exc,
            total,
            f" ({suppressed} fault lines suppressed)" if suppressed else "",
            exc_info=total == 1,  # the first one with its traceback
        )
