"""Replicas that share what they learned: peers' snapshots loaded at start-up.

Several SUFFIX servers behind a router (``sglang-router``) each learn from the requests
they are sent. With ``SGLANG_SPEC_EXT_SNAPSHOT_PEERS=DIR`` (a directory the replicas
share: a network file system, or a directory an object-store sync fills) and each
replica's own ``SGLANG_SPEC_EXT_SNAPSHOT_PATH`` inside it (``DIR/replica-a.snap``,
``DIR/replica-b.snap``, ...), a replica that starts or restarts first loads every peer's
snapshot in the directory, oldest file first, then its own (``snapshots.SnapshotKeeper
.load_into``): it starts at what the fleet had learned at the peers' last periodic
writes, not cold. Each sequence keeps its tenant scope (a tenant's sequences stay that
tenant's), the drafter's bounds apply as for served requests (the newest kept), and a
peer's file is checked as the replica's own is: another model's, a corrupt or an
oversized file is refused with one WARNING line and the rest still load.

Sharing is at start-up: a running replica does not reload its peers (restart it, or
start a new one, to take in what the others learned since).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sglang_spec_ext.suffix.snapshot import SnapshotError, import_entries, read_snapshot

logger = logging.getLogger("sglang_spec_ext")

PEERS_ENV = "SGLANG_SPEC_EXT_SNAPSHOT_PEERS"


def peer_files(peers_dir: str | Path, own: Path | None) -> list[Path]:
    """The snapshot files in ``peers_dir`` other than ``own`` (and a writer's temp files),
    oldest first by modification time."""
    root = Path(peers_dir)
    own_resolved = own.resolve() if own is not None else None
    files = []
    for path in root.iterdir():
        if not path.is_file() or path.name.startswith(".") or path.name.endswith(".tmp"):
            continue
        if own_resolved is not None and path.resolve() == own_resolved:
            continue
        files.append(path)
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def load_peer_snapshots(keeper: Any, drafter: Any, peers_dir: str | Path) -> int:
    """Re-add every peer snapshot's sequences to ``drafter`` (see the module doc); the
    number of sequences re-added. Never raises: an unreadable directory or file is one
    WARNING line."""
    start = time.perf_counter()
    try:
        files = peer_files(peers_dir, getattr(keeper, "path", None))
    except OSError as e:
        logger.warning("SUFFIX snapshot peers: cannot list %s (%s); none loaded", peers_dir, e)
        return 0
    max_bytes, max_entries = keeper.limits(drafter)
    loaded = tokens = peers = 0
    for path in files:
        try:
            entries = read_snapshot(
                path, max_bytes=max_bytes, max_entries=max_entries, expect=keeper.identity
            )
        except (SnapshotError, OSError, ValueError) as e:
            logger.warning("SUFFIX snapshot peers: %s refused (%s)", path, e)
            continue
        n, t, e = import_entries(drafter, entries)
        loaded, tokens = loaded + n, tokens + t
        if e is not None:  # a drafter fault: what went in stays
            logger.warning(
                "SUFFIX snapshot peers: loading %s stopped (%s: %s)", path, type(e).__name__, e
            )
            continue
        peers += 1
    logger.info(
        "SUFFIX snapshot peers: loaded %d sequences (%d tokens) from %d of %d peer files in "
        "%s in %.2f s",
        loaded,
        tokens,
        peers,
        len(files),
        peers_dir,
        time.perf_counter() - start,
    )
    return loaded
