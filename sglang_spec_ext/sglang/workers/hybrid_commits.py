"""What each HYBRID request committed, from the worker's own outputs, read once per step.

HYBRID's suffix drafter needs, at each decode step, every token each request has
committed so far. ``req.output_ids`` is not that under overlap scheduling (the host's
default for its V2 model-draft workers): the scheduler launches step N+1 before it
processes step N's results, so the list lags by the tokens of the request's last
step, and the host relays only the last (bonus) token to EAGLE-family drafts. The
worker therefore keeps its own record, :class:`CommitLog`:

* at a prefill and at each verify, the tokens it committed stay on the device, in
  the step's own output tensors (no host read then: the device may still be running
  that step), with each request's position, the committed-token count before the
  step (known on the host from the previous read; at a prefill, ``len(output_ids)``,
  complete for a request being prefilled);
* at the next decode step's choice, everything not yet read crosses to the host in
  one copy together with that step's own reads (the model draft's rows and
  confidence): :func:`read_packed`;
* per request the log keeps the last committed tokens and their end position; the
  committed sequence is ``output_ids`` followed by the recorded tokens beyond its
  length. Where ``output_ids`` has caught up, its last token is checked against the
  record; a mismatch, or a gap (a path the log did not see), makes ``output_ids`` the
  truth again and the caller restarts that request's suffix session (counted in
  :attr:`CommitLog.resyncs`).

The same code runs with overlap off, where the lag is zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: Unread steps kept at most (a run of prefills with no decode step in between); the
#: oldest is dropped beyond it and its requests fall back to ``output_ids``.
MAX_UNREAD = 32


def read_packed(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Host copies of ``tensors`` (integer or floating point, any shapes, one device)
    made with a single device-to-host copy: integers as int64, floats as float32."""
    if not tensors:
        return []
    parts, kinds = [], []
    for t in tensors:
        flat = t.reshape(-1)
        if flat.is_floating_point():  # the float32 bits ride in int64 slots, exactly
            parts.append(flat.float().view(torch.int32).to(torch.int64))
        else:
            parts.append(flat.to(torch.int64))
        kinds.append((flat.is_floating_point(), tuple(t.shape)))
    host = torch.cat(parts).cpu().numpy()
    out, pos = [], 0
    for is_float, shape in kinds:
        n = math.prod(shape)
        chunk = host[pos : pos + n]
        pos += n
        if is_float:
            chunk = chunk.astype(np.int32).view(np.float32)
        out.append(chunk.reshape(shape))
    return out


@dataclass
class StepRows:
    """One step's committed tokens, still on the device: row ``i`` holds request
    ``rids[i]``'s ``lens[i]`` tokens from output position ``starts[i]`` on."""

    rids: list[str | None]  # None: a row that committed nothing (a mid-chunk prefill)
    starts: list[int]
    tokens: torch.Tensor  # [n, k]
    lens: torch.Tensor  # [n]
    #: What the caller attaches (HYBRID: each row's winning source and its requests).
    extra: Any = None
    host_tokens: np.ndarray | None = field(default=None, repr=False)
    host_lens: np.ndarray | None = field(default=None, repr=False)


class CommitLog:
    """Per request, the end position and last tokens it committed (module docstring)."""

    def __init__(self, keep: int) -> None:
        self.keep = max(1, int(keep))
        self._tail: dict[str, tuple[int, list[int]]] = {}
        self._unread: list[StepRows] = []
        self.resyncs = 0
        self.dropped_steps = 0

    def __len__(self) -> int:
        return len(self._tail)

    # -- at the step (device only) ----------------------------------------------------
    def stash(self, rows: StepRows) -> None:
        """Keep a step's rows for the next read (clones: graph buffers are reused)."""
        rows.tokens = rows.tokens.detach().clone()
        rows.lens = rows.lens.detach().clone()
        self._unread.append(rows)
        if len(self._unread) > MAX_UNREAD:
            self._unread.pop(0)
            self.dropped_steps += 1

    def stash_prefill(self, reqs: Sequence[Any], next_token_ids: Any) -> None:
        """A prefill's first output token of each request that finished its prompt (a
        request still being prefilled in chunks, ``is_chunked > 0``, committed none)."""
        bs = len(reqs)
        if not bs or not isinstance(next_token_ids, torch.Tensor) or next_token_ids.numel() < bs:
            return
        rids = [None if getattr(r, "is_chunked", 0) > 0 else r.rid for r in reqs]
        tokens = next_token_ids[:bs].reshape(bs, 1)
        lens = torch.ones(bs, dtype=torch.int64, device=tokens.device)
        self.stash(StepRows(rids, [len(r.output_ids) for r in reqs], tokens, lens))

    def unread_tensors(self) -> list[torch.Tensor]:
        """The tensors :meth:`apply` wants back from the host, in order."""
        return [t for rows in self._unread for t in (rows.tokens, rows.lens)]

    # -- after the read ---------------------------------------------------------------
    def apply(self, arrays: Sequence[np.ndarray]) -> list[StepRows]:
        """Record the host copies of :meth:`unread_tensors` (same order); return the
        steps they belonged to, with their host rows set."""
        steps, self._unread = self._unread, []
        if len(arrays) != 2 * len(steps):
            raise ValueError(f"{len(arrays)} host arrays for {len(steps)} unread steps")
        for i, rows in enumerate(steps):
            rows.host_tokens = np.asarray(arrays[2 * i]).reshape(len(rows.rids), -1)
            rows.host_lens = np.asarray(arrays[2 * i + 1]).reshape(-1)
            for rid, start, toks, n in zip(
                rows.rids, rows.starts, rows.host_tokens, rows.host_lens, strict=True
            ):
                if rid is not None:
                    self._put(rid, int(start), toks[: int(n)].tolist())
        return steps

    def _put(self, rid: str, start: int, tokens: list[int]) -> None:
        end, tail = self._tail.get(rid, (0, []))
        first = end - len(tail)  # position of tail[0]
        if first <= start <= end:  # contiguous (or rewriting the end): keep what precedes
            tail = tail[: start - first] + tokens
        else:  # a gap: only what this step says is known
            tail = list(tokens)
        self._tail[rid] = (start + len(tokens), tail[-self.keep :])

    # -- at the choice ----------------------------------------------------------------
    def committed(self, rid: str, output_ids: Sequence[int]) -> tuple[int, list[int], bool]:
        """``(total, beyond, resynced)``: the request's committed-token count, the
        committed tokens beyond ``output_ids``, and whether the record had to be reset
        from ``output_ids`` (the caller restarts the request's drafting state)."""
        have = len(output_ids)
        end, tail = self._tail.get(rid, (None, None))
        if end is not None:
            first = end - len(tail)
            ok = first <= have <= end
            if ok and have > first:  # where output_ids caught up, it must agree
                ok = int(output_ids[have - 1]) == tail[have - 1 - first]
            if ok:
                return end, tail[len(tail) - (end - have) :] if end > have else [], False
            self.resyncs += 1
        self._tail[rid] = (have, [int(t) for t in output_ids[-self.keep :]])
        return have, [], end is not None

    def start_of(self, rid: str, output_ids: Sequence[int]) -> int:
        """Where a step's tokens start for ``rid``: its recorded end, else ``output_ids``."""
        end = self._tail.get(rid, (None,))[0]
        return len(output_ids) if end is None else end

    def forget(self, rids: Any) -> None:
        for rid in rids:
            self._tail.pop(rid, None)

    def keep_only(self, rids: set[str], bound: int) -> None:
        """Beyond ``bound`` records, drop those of requests not in ``rids`` (prefilled
        requests that never reached a decode step)."""
        if len(self._tail) > bound:
            self._tail = {r: v for r, v in self._tail.items() if r in rids}
