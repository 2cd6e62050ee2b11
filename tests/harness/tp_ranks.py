"""TEST HARNESS: the process context the two-rank (gloo) tests start their ranks from.

A spawned rank is a fresh interpreter importing torch, the host and the plugin again,
tens of seconds per rank on a loaded 2-core machine. The ranks here start from a
forkserver instead: one server process per test process, which imports those modules
once (:mod:`tests.harness.tp_preload`); each rank is a fork of it, a fresh process with
nothing of the test process's state (its threads, its sockets) but the modules already
imported. The forkserver starts with the test process's environment at its first use;
the rank functions set what they need themselves.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

PRELOAD = ["tests.harness.tp_preload"]


def rank_context() -> BaseContext:
    """A ``multiprocessing`` context whose ``Process`` forks from the preloaded server."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
