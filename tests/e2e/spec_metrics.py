"""Reading the host's own speculative metrics from a response's ``meta_info``."""

from __future__ import annotations


def accept_length(meta_info: dict) -> float:
    """Mean tokens committed per verify step, bonus included, as the host reports it
    (``completion_tokens / spec_verify_ct``). Fails loudly when the host sent none."""
    assert "spec_accept_length" in meta_info and meta_info.get("spec_verify_ct", 0) > 0, (
        f"no speculative metrics in meta_info: {sorted(meta_info)}"
    )
    return float(meta_info["spec_accept_length"])


def plain_step_counts(log: str) -> dict[str, int]:
    """The last ``plain steps:`` counters of a server log (sglang/workers/plain_step.py):
    ``{"plain": N, "host_<reason>": M, ...}``; empty if the line never appeared."""
    from sglang_spec_ext.sglang.workers.plain_step import STATS_LOG_MARK

    lines = [ln.split(STATS_LOG_MARK, 1)[1] for ln in log.splitlines() if STATS_LOG_MARK in ln]
    if not lines:
        return {}
    return {k: int(v) for k, v in (kv.split("=") for kv in lines[-1].split())}
