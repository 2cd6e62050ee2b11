"""The suffix drafter's request sessions: what SUFFIX and HYBRID share.

A session is what the drafter has been told about one request:

* :meth:`~DrafterSessionsMixin._sync` starts a session (the request's prompt, in its
  isolation scope) the first time the request is seen in a decode batch and then
  pushes, each step, the output tokens committed since the last step;
* :meth:`~DrafterSessionsMixin.close_sessions` closes the sessions of requests that left
  the decode batch (finished, aborted or retracted): their last tokens go to the global
  tree and their per-request state is freed. A retracted request that comes back
  simply starts a new session.

Drafter faults never stop serving: an exception in a drafter call (a C++
``out_of_range`` or ``bad_alloc`` surfacing as ``IndexError`` / ``MemoryError``, a bad
draft, anything) drops the affected request's session (it restarts from the request's
tokens at the next step; its draft that step is empty: plain decoding through the
verify path, the output stays the target's), is counted in
:meth:`~DrafterSessionsMixin.drafter_stats` and logged once per request id
(``fault_log.py``). A fault while dropping a session resets the whole drafter, and a
drafter that cannot even reset is rebuilt empty (its external corpora reattached).

The statistics line (:data:`STATS_LOG_MARK`) and the periodic snapshot are written from
here too, once per decode step when due.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.workers.fault_log import FaultLog
from sglang_spec_ext.suffix import SuffixDrafter
from sglang_spec_ext.suffix.draft import DraftTree
from sglang_spec_ext.suffix.gate import DraftGate
from sglang_spec_ext.suffix.scopes import scope_key

logger = logging.getLogger("sglang_spec_ext")

#: The INFO line with the drafter statistics (JSON after the mark), logged at the first
#: decode step and then at most every SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S seconds (the
#: soak harness, sglang_spec_ext/soak/runner.py, reads them from the server log).
STATS_LOG_MARK = "sglang-spec-ext drafter stats: "


@dataclass
class Session:
    """What the drafter has been told about one request."""

    synced: int = 0  # output tokens already pushed to the drafter
    req: Any = field(default=None, repr=False)  # the host Req, for the final push
    scope: Any = ""  # the request's tenant scope (suffix/scopes.py)
    last: int = -1  # the last token pushed (the prompt's last, before any output)


class SessionCloser:
    """Stands where the host's NGRAM worker keeps its corpus object.

    ``NGRAMWorker.forward_batch_generation`` calls ``erase_match_state`` with the
    rids that left the decode batch and ``clear_cache_pool`` calls ``reset``.
    """

    def __init__(self, worker: DrafterSessionsMixin) -> None:
        self._worker = worker

    def erase_match_state(self, req_ids: list[str]) -> None:
        self._worker.close_sessions(req_ids)

    def reset(self) -> None:
        self._worker.reset_drafter()

    def synchronize(self) -> None:
        return None


class DrafterSessionsMixin:
    """The drafter's sessions, its faults and its statistics (see the module doc).

    The worker sets ``drafter``, ``corpora`` (``serving/external_corpus.py``: reattached
    after a rebuild), ``_gate`` (the draft gate or None: told of commits and of
    sessions that end) and ``_config``, then calls :meth:`_init_sessions`."""

    drafter: SuffixDrafter
    corpora: Any
    _gate: DraftGate | None
    _config: Any

    def _init_sessions(self, config: Any) -> None:
        """Empty sessions and fault counts; the drafter's snapshot loaded where one is
        configured (warm restarts, ``sglang/serving/snapshots.py``, opt-in)."""
        self._sessions: dict[str, Session] = {}
        self._faults: Counter[str] = Counter()  # stage -> drafting faults absorbed
        self._relay_repeats = 0  # relayed tokens output_ids already held (see _unrelayed)
        self._fault_log = FaultLog()
        self._stats_logged_at: float | None = None
        self._stats_log_interval_s = config.stats_log_interval_s
        self._isolation = config.isolation
        self._snapshots = None
        if config.snapshot_path:
            from sglang_spec_ext.sglang.serving.snapshot_owner import snapshot_identity
            from sglang_spec_ext.sglang.serving.snapshots import SnapshotKeeper

            self._snapshots = SnapshotKeeper.from_plugin_config(config, snapshot_identity(self))
            if self._snapshots is not None:
                if config.snapshot_peers:  # replicas sharing a directory (snapshot_peers.py)
                    from sglang_spec_ext.sglang.serving.snapshot_peers import load_peer_snapshots

                    load_peer_snapshots(self._snapshots, self.drafter, config.snapshot_peers)
                self._snapshots.load_into(self.drafter)

    # -- what each request committed -------------------------------------------------
    def _unrelayed(self, req: Any, prev: list[int]) -> list[int]:
        """``prev`` (the overlap relay's tokens for ``req``: what its previous step
        accepted), or nothing where ``req.output_ids`` already holds them.

        The relay carries a request's last step, not the batch's last: when another batch
        ran in between (another request's prefill, say), the scheduler has processed that
        step by now and the same tokens are relayed again. The host's NGRAM splices them a
        second time; counted here, they would push the drafter's context past tokens it
        never saw. Seen from the session: the output reached exactly what was synced plus
        ``prev``, and holds ``prev`` there (a lagging output holds only what was synced)."""
        if not prev:
            return prev
        session = self._sessions.get(req.rid)
        synced = session.synced if session is not None else 0
        out = req.output_ids
        if len(out) == synced + len(prev) and list(out[synced:]) == list(prev):
            self._relay_repeats = getattr(self, "_relay_repeats", 0) + 1
            return []
        return prev

    def _sync(self, req: Any, prev: list[int]) -> None:
        """Push what ``req`` committed since the last step to the drafter.

        The committed sequence is ``req.output_ids + prev``; only its new tail is
        read, so the cost per step does not grow with the output length.
        """
        out = req.output_ids
        total = len(out) + len(prev)
        session = self._sessions.get(req.rid)
        if session is not None and total < session.synced:
            # Output shrank (cannot happen in 0.5.23; be safe): start over.
            self._close(req.rid)
            session = None
        if session is None:
            scope = self._request_scope(req)
            prompt = req.origin_input_ids_unpadded
            self.drafter.start_request(req.rid, prompt, scope=scope)
            last = int(prompt[-1]) if len(prompt) else -1
            session = self._sessions[req.rid] = Session(scope=scope, last=last)
            if self._gate is not None:
                self._gate.forget(req.rid)
        if total > session.synced:
            start = session.synced
            new = list(out[start:]) + prev if start < len(out) else prev[start - len(out) :]
            self.drafter.extend_request(req.rid, new)
            if self._gate is not None:  # what the request's last draft was up against
                self._gate.on_committed(req.rid, new)
            self._on_committed(req.rid, session.scope, session.last, new)
            session.synced = total
            session.last = int(new[-1])
        session.req = req

    def _request_scope(self, req: Any) -> Any:
        """``req``'s tenant scope (``suffix/scopes.py``) under this server's isolation."""
        return scope_key(
            getattr(req, "cache_salt", None),
            getattr(req, "extra_key", None),
            getattr(req, "lora_id", None),
            self._isolation,
        )

    def _on_committed(self, rid: str, scope: Any, before: int, new: list[int]) -> None:
        """``rid`` committed ``new`` after the token ``before`` (a draft source that learns
        from it overrides this: ``suffix_sources.py``)."""

    def _speculate(self, rids: list[str], max_nodes: int) -> list[DraftTree]:
        """Drafts for ``rids``; a request whose drafting fails gets an empty draft."""
        if not rids:
            return []
        try:
            trees = self.drafter.speculate_batch(rids, max_nodes)
            if len(trees) == len(rids):
                return trees
        except Exception:  # find the failing request(s); the others keep their drafts
            pass
        trees = []
        for rid in rids:
            try:
                trees.append(self.drafter.speculate(rid, max_nodes))
            except Exception as exc:
                self._fault("speculate", rid, exc)
                trees.append(DraftTree())
        return trees

    # -- sessions that end -------------------------------------------------------------
    def _close(self, rid: str) -> None:
        if self._gate is not None:
            self._gate.forget(rid)
        recycle_forget = getattr(self, "_recycle_forget", None)
        if recycle_forget is not None:
            recycle_forget(rid)
        grammar = getattr(self, "_grammar", None)
        if grammar is not None:
            grammar.forget([rid])
        session = self._sessions.pop(rid, None)
        if session is None:
            return
        req = session.req
        if req is not None and len(req.output_ids) > session.synced:
            # Tokens committed in the request's last step(s).
            self.drafter.extend_request(rid, list(req.output_ids[session.synced :]))
        self.drafter.finish_request(rid)

    def close_sessions(self, rids: list[str]) -> None:
        for rid in rids:
            self._guarded("close", rid, self._close, rid)

    def reset_drafter(self) -> None:
        self._sessions.clear()
        try:
            self.drafter.reset()
        except Exception as exc:
            self._fault("reset", None, exc)
            self._rebuild_drafter()

    # -- statistics ---------------------------------------------------------------------
    def drafter_stats(self) -> dict:
        """Sessions, drafting faults absorbed (total and by stage) and the drafter's sizes."""
        stats: dict[str, Any] = {
            "sessions": len(self._sessions),
            "draft_faults": sum(self._faults.values()),
            "draft_faults_by_stage": dict(self._faults),
            "relay_repeats": getattr(self, "_relay_repeats", 0),
        }
        try:
            stats.update(self.drafter.stats())
        except Exception as exc:
            self._fault("stats", None, exc)
        if getattr(self, "_gate", None) is not None:
            stats.update(self._gate.stats())
        if getattr(self, "_grammar", None) is not None:
            stats.update(self._grammar.summary())
        return stats

    def _maybe_log_stats(self) -> None:
        """Once per decode step (SUFFIX and HYBRID): the stats line when due, and the
        periodic snapshot when due (the keeper knows whether this rank writes it)."""
        if self._snapshots is not None:
            self._snapshots.maybe_save(self.drafter)
        now = time.monotonic()
        interval = self._stats_log_interval_s
        if self._stats_logged_at is not None and now - self._stats_logged_at < interval:
            return
        self._stats_logged_at = now
        stats = self.drafter_stats()
        logger.info("%s%s", STATS_LOG_MARK, json.dumps(stats, default=str))
        spec_metrics.publish_drafter(stats, self._config)

    # -- drafter faults -------------------------------------------------------------------
    def _guarded(self, stage: str, rid: str, fn: Any, *args: Any) -> bool:
        """Run one drafter call for ``rid``; on a fault drop its session, return False."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            self._fault(stage, rid, exc)
            return False

    def _fault(self, stage: str, rid: str | None, exc: BaseException) -> None:
        """Count and log a drafting fault; drop ``rid``'s (possibly broken) session."""
        self._faults[stage] += 1
        self._log_fault(stage, rid, exc)
        if rid is not None:
            self._drop_session(rid)

    def _drop_session(self, rid: str) -> None:
        self._sessions.pop(rid, None)
        if self._gate is not None:
            self._gate.forget(rid)
        if rid not in self.drafter:
            return
        try:
            self.drafter.abort_request(rid)
        except Exception as exc:
            # The drafter cannot even drop a request: start over with an empty one.
            self._faults["abort"] += 1
            self._log_fault("abort", rid, exc)
            self._sessions.clear()
            self._rebuild_drafter()

    def _rebuild_drafter(self) -> None:
        self._sessions.clear()
        try:
            self.drafter.reset()
        except Exception:
            self.drafter = SuffixDrafter(self.drafter.config, backend=self.drafter.backend)
            self.corpora.reattach()
        logger.warning("SUFFIX drafter reset after a fault; every request starts a new session")

    def _log_fault(self, stage: str, rid: str | None, exc: BaseException) -> None:
        self._fault_log.log(stage, rid, exc, sum(self._faults.values()))
