"""Which engine the host runs: the CPU engine (our fallbacks and emulations) or a GPU."""

from __future__ import annotations


def host_runs_cpu_engine() -> bool:
    """True iff the host's own platform probes say: CPU engine, and no GPU/NPU backend."""
    from sglang.srt import utils as host_utils

    if not host_utils.is_cpu():
        return False
    for probe in ("is_cuda", "is_hip", "is_xpu", "is_npu", "is_musa"):
        check = getattr(host_utils, probe, None)
        if check is not None and check():
            return False
    return True
