"""Warm restarts of the SUFFIX drafter: its global trees saved to a file and loaded back.

``SGLANG_SPEC_EXT_SNAPSHOT_PATH`` (empty: off) names the file. The SUFFIX worker
builds one :class:`SnapshotKeeper` per scheduler process:

* at start-up :meth:`SnapshotKeeper.load_into` re-adds the saved sequences to the
  fresh drafter (a missing file starts empty; a refused file, for another model,
  corrupt, too large, ..., starts empty with one WARNING line; never a crash);
* every decode step :meth:`SnapshotKeeper.maybe_save` (one comparison when not
  due): every ``SGLANG_SPEC_EXT_SNAPSHOT_INTERVAL_S`` seconds the drafter's
  sequences are exported on the calling thread and written on a background
  thread (at most one write in flight; a failed write logs a WARNING);
* at shutdown :meth:`SnapshotKeeper.close` writes a last snapshot synchronously.

What runs at shutdown in SGLang 0.5.23 (``srt/managers/tokenizer_manager.py``
``sigterm_watchdog``, ``srt/managers/scheduler.py`` ``run_scheduler_process``):
SIGTERM (or SIGINT) to the launcher drains the requests, sends the schedulers a
``ShutdownReq``, waits up to 15 s for them to leave their event loop and exit
(``mp`` spawn: the interpreter exits normally, ``atexit`` runs), then SIGKILLs
what is left. SIGINT to the whole process group (Ctrl-C) raises
KeyboardInterrupt in the scheduler, which also exits through ``atexit``. SIGTERM
to the whole group (``kill -TERM -PGID``, systemd's default KillMode, the test
harness) reaches the scheduler directly, whose default action ends it at once.
So the keeper registers both an ``atexit`` hook and a SIGTERM handler that
writes the snapshot and then chains to the previous handler (the default one:
the process still ends by SIGTERM). SIGKILL, or a scheduler that does not exit
within the host's 15 s, loses what was learnt since the last periodic write.

Which file a process keeps and whether it writes it (a drafter per data-parallel
replica or attention-DP rank), and what a file must have been written for:
``snapshot_owner.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_spec_ext import __version__
from sglang_spec_ext.sglang.serving import shutdown_hooks as exit_hooks
from sglang_spec_ext.sglang.serving.snapshot_owner import (
    _rank_role,
    check_snapshot_path,
)
from sglang_spec_ext.suffix.snapshot import (
    SnapshotError,
    import_entries,
    read_snapshot,
    write_snapshot,
)

logger = logging.getLogger("sglang_spec_ext")

#: Bytes a snapshot may take per token, per sequence (scope index and length, a
#: scope name of up to 248 bytes) and in all (the JSON header).
BYTES_PER_TOKEN = 4
BYTES_PER_ENTRY = 256
SLACK_BYTES = 1 << 20


class SnapshotKeeper:
    """Loads, periodically writes and finally writes one drafter's snapshot.

    ``path``: the file. ``interval_s``: seconds between periodic writes (0: only
    at :meth:`close`). ``identity``: what the file must match to be loaded (see
    :func:`snapshot_identity`). ``writer``: False on ranks that only load.
    ``shutdown_hooks``: register :meth:`close` with ``atexit`` and a chaining
    SIGTERM handler (see the module docstring).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        interval_s: float = 300.0,
        identity: Mapping[str, Any] | None = None,
        writer: bool = True,
        shutdown_hooks: bool = True,
    ) -> None:
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.identity = dict(identity or {})
        self.writer = writer
        self._drafter: Any = None
        self._next_due: float | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # serialises file writes (background and final)
        self._export_seq = 0  # exports taken, numbered; a write never replaces a newer one
        self._written_seq = 0
        self._closing = False
        self.writes = 0
        self.write_errors = 0
        self.last_write: dict[str, Any] = {}
        if shutdown_hooks and writer:
            exit_hooks.register(self)

    @classmethod
    def from_plugin_config(cls, config: Any, identity: Mapping[str, Any]) -> SnapshotKeeper | None:
        """The keeper for the plugin configuration, or None with ``snapshot_path`` empty.

        Raises :class:`ConfigError` (naming ``SGLANG_SPEC_EXT_SNAPSHOT_PATH``) when
        the file's directory does not exist or is not writable."""
        raw = str(getattr(config, "snapshot_path", "") or "")
        if not raw:
            return None
        writer, dp_rank = _rank_role()
        if dp_rank is not None:
            raw = f"{raw}.dp{dp_rank}"
        path = check_snapshot_path(raw, writable=writer)
        keeper = cls(
            path,
            interval_s=float(getattr(config, "snapshot_interval_s", 300.0)),
            identity=identity,
            writer=writer,
        )
        logger.info(
            "SUFFIX snapshot: %s, %s%s",
            path,
            f"written every {keeper.interval_s:g} s and at shutdown"
            if keeper.interval_s > 0
            else "written at shutdown",
            "" if writer else " (by the first TP rank; this rank only loads it)",
        )
        return keeper

    # -- bounds ------------------------------------------------------------------
    @staticmethod
    def limits(drafter: Any) -> tuple[int, int]:
        """(max_bytes, max_entries) a snapshot for ``drafter`` may have."""
        cfg = drafter.config
        max_entries = int(cfg.max_cached_requests)
        max_bytes = (
            BYTES_PER_TOKEN * int(cfg.max_cached_tokens)
            + BYTES_PER_ENTRY * max_entries
            + SLACK_BYTES
        )
        return max_bytes, max_entries

    def meta(self, drafter: Any) -> dict[str, Any]:
        """The header meta written with ``drafter``'s sequences."""
        return {
            **self.identity,
            "max_depth": int(drafter.config.max_depth),
            "plugin": "sglang-spec-ext",
            "plugin_version": __version__,
        }

    # -- start-up ----------------------------------------------------------------
    def load_into(self, drafter: Any) -> int:
        """Re-add the snapshot's sequences to ``drafter`` (oldest first); the number
        re-added. Never raises: a missing file starts empty (INFO), a refused or
        unreadable one starts empty with one WARNING line."""
        self._drafter = drafter
        self._next_due = time.monotonic() + self.interval_s
        if self.writer:
            self._remove_stale_temp_files()
        start = time.perf_counter()
        max_bytes, max_entries = self.limits(drafter)
        try:
            entries = read_snapshot(
                self.path, max_bytes=max_bytes, max_entries=max_entries, expect=self.identity
            )
        except FileNotFoundError:
            logger.info(
                "SUFFIX snapshot: no snapshot yet at %s; the global trees start empty", self.path
            )
            return 0
        except SnapshotError as e:
            logger.warning("SUFFIX snapshot refused, the global trees start empty: %s", e)
            return 0
        except Exception as e:  # noqa: BLE001 - unreadable file, out of memory, ...
            logger.warning(
                "SUFFIX snapshot refused, the global trees start empty: snapshot %s: %s: %s",
                self.path,
                type(e).__name__,
                e,
            )
            return 0
        loaded, tokens, e = import_entries(drafter, entries)
        if e is not None:  # a drafter fault: what went in stays
            logger.warning(
                "SUFFIX snapshot: loading %s stopped after %d of %d sequences (%s: %s)",
                self.path,
                loaded,
                len(entries),
                type(e).__name__,
                e,
            )
            return loaded
        logger.info(
            "SUFFIX snapshot: loaded %d sequences (%d tokens) from %s in %.2f s",
            loaded,
            tokens,
            self.path,
            time.perf_counter() - start,
        )
        return loaded

    def _remove_stale_temp_files(self) -> None:
        """Temp files a killed writer left (``.<name>.*.tmp`` beside the snapshot)."""
        with contextlib.suppress(OSError):
            for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):
                with contextlib.suppress(OSError):
                    stale.unlink()

    # -- periodic writes ---------------------------------------------------------
    def maybe_save(self, drafter: Any, now: float | None = None) -> bool:
        """Once per decode step: when a periodic write is due, export ``drafter``'s
        sequences here and write them on a background thread. True if one started."""
        self._drafter = drafter
        if self.interval_s <= 0 or not self.writer or self._closing:
            return False
        now = time.monotonic() if now is None else now
        if self._next_due is None:
            self._next_due = now + self.interval_s
            return False
        if now < self._next_due:
            return False
        thread = self._thread
        if thread is not None and thread.is_alive():
            return False  # the previous write is still going: try at the next step
        self._next_due = now + self.interval_s
        exported = self._export(drafter)
        if exported is None:
            return False
        self._thread = threading.Thread(
            target=self._write, args=exported, name="sglang-spec-ext-snapshot", daemon=True
        )
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background write in flight; False if it is still running."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _export(self, drafter: Any) -> tuple[list, dict, int, float] | None:
        start = time.perf_counter()
        try:
            entries = drafter.export_cached()
            meta = self.meta(drafter)
        except Exception as e:  # noqa: BLE001 - serving goes on
            self.write_errors += 1
            logger.warning(
                "SUFFIX snapshot: exporting the drafter failed (%s: %s); serving goes on",
                type(e).__name__,
                e,
            )
            return None
        self._export_seq += 1
        return entries, meta, self._export_seq, time.perf_counter() - start

    def _write(self, entries: list, meta: dict, seq: int, export_s: float) -> bool:
        start = time.perf_counter()
        with self._lock:
            if seq <= self._written_seq:
                return False  # a newer export is on disk already
            try:
                nbytes = write_snapshot(self.path, entries, meta)
            except Exception as e:  # noqa: BLE001 - serving goes on
                self.write_errors += 1
                logger.warning(
                    "SUFFIX snapshot: writing %s failed (%s: %s); the previous snapshot is "
                    "kept and serving goes on",
                    self.path,
                    type(e).__name__,
                    e,
                )
                return False
            self._written_seq = seq
            self.writes += 1
        self.last_write = {
            "sequences": len(entries),
            "tokens": sum(len(t) for _, t in entries),
            "bytes": nbytes,
            "export_s": export_s,
            "write_s": time.perf_counter() - start,
        }
        return True

    # -- shutdown ----------------------------------------------------------------
    def close(self, drafter: Any = None) -> None:
        """Write a last snapshot synchronously (after any write in flight); idempotent.
        ``drafter``: the one to save (default: the last one this keeper saw)."""
        if self._closing:
            return
        self._closing = True
        exit_hooks.unregister(self)
        drafter = drafter if drafter is not None else self._drafter
        self.wait()
        if not self.writer or drafter is None:
            return
        exported = self._export(drafter)
        if exported is not None and self._write(*exported):
            w = self.last_write
            logger.info(
                "SUFFIX snapshot: wrote %d sequences (%d tokens, %d bytes) to %s in %.2f s",
                w["sequences"],
                w["tokens"],
                w["bytes"],
                self.path,
                w["export_s"] + w["write_s"],
            )
