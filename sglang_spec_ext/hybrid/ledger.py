"""HYBRID's shadow ledger: every draft of both sources resolved against the tokens the
target commits after it, so the learned gain map (``hybrid/choice.py``, ``GainEstimator``) sees the
losing source's drafts too. Engine-agnostic."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_spec_ext.hybrid.calibration import accepted_path
from sglang_spec_ext.hybrid.candidate import Candidate


@dataclass
class _Pending:
    at: int  # committed tokens of the request when the draft was made
    cand: Candidate
    won: bool


@dataclass
class _Request:
    base: int = 0  # committed tokens before tail[0]
    tail: list[int] = field(default_factory=list)  # committed tokens since the oldest pending
    pending: deque[_Pending] = field(default_factory=deque)


class ShadowLedger:
    """Recent drafts of each request, resolved against the tokens committed after them.

    ``on_resolved(source, score, accepted, won)`` is called once per resolved draft.
    At most ``max_pending`` drafts wait per request (the oldest is dropped beyond:
    counted in ``dropped``); a finished request drops what is still pending.
    """

    def __init__(
        self,
        on_resolved: Callable[[str, float, int, bool], Any],
        max_pending: int = 16,
        max_requests: int = 65536,
    ) -> None:
        if max_pending < 1 or max_requests < 1:
            raise ValueError("max_pending and max_requests must be >= 1")
        self._on_resolved = on_resolved
        self.max_pending = max_pending
        self.max_requests = max_requests
        self._reqs: dict[Any, _Request] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._reqs)

    def add(self, rid: Any, committed_len: int, cand: Candidate, won: bool) -> None:
        """A draft made when ``rid`` had ``committed_len`` committed tokens."""
        r = self._reqs.get(rid)
        if r is None:
            if len(self._reqs) >= self.max_requests:  # bound: forget the oldest request
                oldest = next(iter(self._reqs))
                self.dropped += len(self._reqs.pop(oldest).pending)
            r = self._reqs[rid] = _Request(base=committed_len)
        if not r.pending:
            r.base, r.tail = committed_len, []
        if committed_len < r.base or committed_len > r.base + len(r.tail):
            raise ValueError(
                f"request {rid!r}: draft at {committed_len} outside the known tokens "
                f"[{r.base}, {r.base + len(r.tail)}]"
            )
        if len(r.pending) >= self.max_pending:
            r.pending.popleft()
            self.dropped += 1
        r.pending.append(_Pending(committed_len, cand, won))

    def commit(self, rid: Any, tokens: Sequence[int]) -> None:
        """Tokens ``rid`` committed (in order, after every draft added so far)."""
        r = self._reqs.get(rid)
        if r is None or not r.pending:
            return
        r.tail.extend(tokens)
        while r.pending:
            p = r.pending[0]
            known = r.tail[p.at - r.base :]
            path = accepted_path(p.cand.tokens, p.cand.parents, known)
            last = path[-1] if path else -1
            leaf = not any(par == last for par in p.cand.parents[last + 1 :])
            if len(path) >= len(known) and not leaf:
                break  # undecided: the next committed token may extend the path
            r.pending.popleft()
            self._on_resolved(p.cand.source, p.cand.score, len(path), p.won)
        if r.pending:
            cut = r.pending[0].at - r.base
            if cut:
                del r.tail[:cut]
                r.base += cut
        else:
            r.base, r.tail = r.base + len(r.tail), []

    def finish(self, rid: Any) -> None:
        r = self._reqs.pop(rid, None)
        if r is not None:
            self.dropped += len(r.pending)
