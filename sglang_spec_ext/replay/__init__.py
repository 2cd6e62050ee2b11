"""Offline replay of greedy token traces through model-free drafters.

Engine-agnostic: nothing here imports SGLang (the host NGRAM adapter lives in
``sglang_spec_ext.sglang.host.replay_ngram`` and is imported only when chosen).
"""

from sglang_spec_ext.replay.drafters import (
    DRAFTER_NAMES,
    DrafterOptions,
    DrafterUnavailable,
    available_drafters,
    drafter_factory,
    make_drafter,
)
from sglang_spec_ext.replay.engine import ReplayResult, ReplayStats, replay
from sglang_spec_ext.replay.protocol import Draft, Drafter, DraftLike, greedy_accept
from sglang_spec_ext.replay.table import (
    AcceptanceRow,
    acceptance_table,
    read_acceptance_table,
    simulate_fixed_budget,
    write_acceptance_table,
)
from sglang_spec_ext.replay.trace import TraceError, TraceRecord, read_trace, write_trace

__all__ = [
    "DRAFTER_NAMES",
    "AcceptanceRow",
    "Draft",
    "DraftLike",
    "Drafter",
    "DrafterOptions",
    "DrafterUnavailable",
    "ReplayResult",
    "ReplayStats",
    "TraceError",
    "TraceRecord",
    "acceptance_table",
    "available_drafters",
    "drafter_factory",
    "greedy_accept",
    "make_drafter",
    "read_acceptance_table",
    "read_trace",
    "replay",
    "simulate_fixed_budget",
    "write_acceptance_table",
    "write_trace",
]
