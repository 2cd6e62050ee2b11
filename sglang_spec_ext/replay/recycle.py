"""Token recycling in the offline replay: drafters ``suffix-recycle`` and ``recycle-only``.

:class:`RecycleDrafter` wraps the suffix drafter and a :class:`~sglang_spec_ext.suffix.
recycler.Recycler` (the target's own top-k next tokens, kept as a table ``token -> top-k
successors``) and drives them as the serving worker does, from the trace's
``target_topk`` (``replay/trace.py``):

* ``prepare(req_id, rec)`` (before ``start_request``) keeps the record's top-k rows;
* every ``extend_request(tokens)``, for output positions ``[pos, pos + n)``, first calls
  ``observe`` with what the request committed after the token before them (the root of
  the step's draft; for the prefill's token, the prompt's last), as the worker's sync does;
* the first one (the prefill's token) feeds nothing: prefill is not a verify step;
* every later one then calls ``feed`` with the rows of the positions that verify step
  computed logits for and that were committed: output positions ``pos - 1`` (the step's
  root) to ``pos + n - 2`` (its last accepted draft). The newest token (the bonus) has no
  row until the next step;
* ``speculate(req_id, budget)`` takes the suffix draft of ``budget`` nodes (none for
  ``recycle-only``) and returns it merged with the recycled draft below the same root
  (``Recycler.draft``);
* ``finish_request`` ends the request in both (``Recycler.forget``).

Serving feeds the same rows (the root's and the accepted nodes', ``sglang/workers/
suffix_sources.py``), not those of the draft nodes the verify step rejected, which a trace
does not hold. A record without
``target_topk`` feeds nothing (with no other record fed, the drafter is the suffix
drafter). The table and the learned rates persist across requests: one drafter is one
server. Every request uses the default scope ``""``.

Drafting changes the recycler's state (it keeps each request's last suffix draft to
calibrate the suffix nodes by what was committed), as serving's one draft per step does:
replay calls ``speculate`` once per step. The acceptance table (``replay/table.py``), which
speculates several budgets per position and extends one token at a time, is therefore only
an approximation for these drafters.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sglang_spec_ext.replay.trace import TraceRecord
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.recycler import RecycleConfig, Recycler

if TYPE_CHECKING:
    from sglang_spec_ext.suffix.drafter import SuffixDrafter

#: The one tenant scope of the replay (a server's default).
SCOPE = ""


@dataclass
class _Request:
    """A request in flight: its top-k rows and the output tokens it committed."""

    prompt_last: int
    topk: np.ndarray | None  # [len(output_ids), k], or None: the record has none
    output: list[int] = field(default_factory=list)


class RecycleDrafter:
    """The suffix draft merged with the target's recycled top-k (see the module doc).

    ``suffix``: the suffix drafter (``None``: an empty suffix draft, ``recycle-only``);
    ``recycler``: the recycled source (a fresh one of ``config`` when ``None``).
    """

    def __init__(
        self,
        suffix: SuffixDrafter | None,
        config: RecycleConfig | None = None,
        recycler: Recycler | None = None,
    ) -> None:
        self.suffix = suffix
        self.recycler = recycler if recycler is not None else Recycler(config)
        self._topk: dict[Hashable, np.ndarray] = {}  # prepared, not started yet
        self._reqs: dict[Hashable, _Request] = {}
        self.rows_fed = 0

    # -- what the replay engine calls ---------------------------------------------------
    def prepare(self, req_id: Hashable, rec: TraceRecord) -> None:
        """Before ``start_request``: the record's ``target_topk`` rows, if any."""
        if rec.target_topk:
            self._topk[req_id] = np.asarray(rec.target_topk, dtype=np.int64)
        else:
            self._topk.pop(req_id, None)

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        if req_id in self._reqs:
            raise ValueError(f"request id {req_id!r} is already active")
        if self.suffix is not None:
            self.suffix.start_request(req_id, prompt_ids)
        last = int(prompt_ids[-1]) if len(prompt_ids) else -1
        self._reqs[req_id] = _Request(prompt_last=last, topk=self._topk.pop(req_id, None))

    def extend_request(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        req = self._request(req_id)
        if self.suffix is not None:
            self.suffix.extend_request(req_id, token_ids)
        tokens = [int(t) for t in token_ids]
        if not tokens:
            return
        pos = len(req.output)
        before = req.output[pos - 1] if pos else req.prompt_last
        req.output.extend(tokens)
        self.recycler.observe(req_id, SCOPE, before, tokens)
        if pos == 0 or req.topk is None:
            return  # the prefill's token: no verify step computed its rows
        # rows of the step's root (pos - 1) and accepted drafts, not of its newest token
        lo, hi = pos - 1, pos + len(tokens) - 1
        if hi > req.topk.shape[0]:
            raise ValueError(
                f"request {req_id!r}: output position {hi - 1} has no target_topk row "
                f"(the record has {req.topk.shape[0]})"
            )
        self.recycler.feed(SCOPE, np.asarray(req.output[lo:hi]), req.topk[lo:hi])
        self.rows_fed += hi - lo

    def speculate(self, req_id: Hashable, max_nodes: int) -> DraftTree:
        req = self._request(req_id)
        root = req.output[-1] if req.output else req.prompt_last
        if self.suffix is not None:
            suffix_tree = self.suffix.speculate(req_id, max_nodes)
        else:
            suffix_tree = DraftTree()
        if root < 0:
            return suffix_tree.first(max_nodes)
        return self.recycler.draft([req_id], [SCOPE], [root], [suffix_tree], max_nodes)[0]

    def finish_request(self, req_id: Hashable) -> None:
        self._request(req_id)
        if self.suffix is not None:
            self.suffix.finish_request(req_id)
        self.recycler.forget(req_id)
        del self._reqs[req_id]

    # -- helpers ------------------------------------------------------------------------
    def _request(self, req_id: Hashable) -> _Request:
        try:
            return self._reqs[req_id]
        except KeyError:
            raise KeyError(f"unknown request id {req_id!r}: not started, or finished") from None

    def stats(self) -> dict[str, object]:
        """The recycler's figures (``Recycler.stats``) and the rows the replay fed."""
        return {**self.recycler.stats(), "replay_rows_fed": self.rows_fed}
