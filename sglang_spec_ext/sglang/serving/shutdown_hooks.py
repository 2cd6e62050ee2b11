"""Close objects at shutdown: one ``atexit`` hook and one chained SIGTERM handler.

SGLang 0.5.23's schedulers end normally (``atexit`` runs) when the launcher shuts
the server down, but a SIGTERM sent to the whole process group (``kill -TERM
-PGID``, systemd's default) reaches a scheduler directly and its default action
ends it at once. :func:`register` installs, once per process, an ``atexit`` hook
and a SIGTERM handler that close every registered object and then do what the
previous handler would have done (by default: end the process by the signal).
Used by the snapshot keeper (``snapshots.py``) for its final write.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

_KEEPERS: weakref.WeakSet[Any] = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()
_hooks_installed = False
_previous_sigterm: Any = None


def register(keeper: Any) -> None:
    """Close ``keeper`` (its ``close()``) at interpreter exit or on SIGTERM."""
    global _hooks_installed
    with _HOOKS_LOCK:
        _KEEPERS.add(keeper)
        if _hooks_installed:
            return
        _hooks_installed = True
    atexit.register(_close_all)
    _install_sigterm_handler()


def unregister(keeper: Any) -> None:
    _KEEPERS.discard(keeper)


def _close_all() -> None:
    for keeper in list(_KEEPERS):
        try:
            keeper.close()
        except Exception:  # noqa: BLE001 - shutdown goes on
            logger.exception("closing %r at shutdown failed", keeper)


def _install_sigterm_handler() -> None:
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        logger.info(
            "shutdown hooks: not on the main thread, no SIGTERM handler (atexit only): a "
            "SIGTERM sent to this process itself skips the final snapshot write"
        )
        return
    try:
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError) as e:  # pragma: no cover - exotic embeddings
        logger.info("shutdown hooks: no SIGTERM handler (%s); atexit only", e)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Close every registered object, then do what the previous handler would have done."""
    _close_all()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL, or a handler not installed from Python: end by the signal
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
