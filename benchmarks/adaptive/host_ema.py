"""adaptive_replay.py: the host's EMA policy (for benchmarks/results/adaptive_replay*.json).

``sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams``, run through its
real Python API; its chosen step count maps to ``k = steps``, a chain.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence

import numpy as np


class HostEMAPolicy:
    """The host's EMA step controller (real sglang code), one chain step = one draft."""

    name = "host EMA"

    def __init__(self, initial_steps: int = 3, max_steps: int | None = None) -> None:
        """``max_steps``: drop the host's default candidates above it (through its own
        config-file interface, as the server does), so it chooses among steps the
        drafts really have."""
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

        from sglang_spec_ext.sglang.model_drafts.adaptive import host_ema_policy

        logging.getLogger("sglang").setLevel(logging.WARNING)
        if max_steps is None:
            self.params = AdaptiveSpeculativeParams(initial_steps=initial_steps)
        else:
            self.params = host_ema_policy(max_steps)

    def choose(self, batch_size: int, req_ids: Sequence[Hashable]) -> int:
        return int(self.params.get_steps_for_batch(batch_size))

    def observe(
        self,
        batch_size: int,
        k: int,
        accepted: np.ndarray,
        step_time_s: float,
        req_ids: Sequence[Hashable],
        finished: Sequence[Hashable],
        within: Mapping[int, np.ndarray] | None = None,
    ) -> None:
        self.params.on_verify_complete([int(a) for a in accepted], batch_size)


def host_ema_available() -> bool:
    try:
        import sglang.srt.speculative.adaptive_spec_params  # noqa: F401
    except Exception:
        return False
    return True
