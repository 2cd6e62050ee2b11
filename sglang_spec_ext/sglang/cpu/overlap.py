"""Overlap scheduling for speculative decoding on SGLang's CPU engine (a test bed).

On a GPU the host's default is overlap scheduling: the scheduler's
``event_loop_overlap`` launches step N+1 before it processes step N's results, the
V2 speculative workers hand step N's accepted tokens to step N+1 through the
``FutureMap`` relay, and ``req.output_ids`` lags one step. On the CPU engine the host
turns overlap off for speculative decoding
(``srt/arg_groups/speculative_hook.py`` ``_disable_overlap_schedule_for_cpu``), so
that path is never served end to end without a GPU.

``SGLANG_SPEC_EXT_CPU_OVERLAP=1`` keeps it on with the CPU engine:

* argument resolution: :func:`keep_overlap_hook` (AROUND on the host's
  ``_disable_overlap_schedule_for_cpu``) skips that one resolution, and our own
  ``handle_server_args`` (``server_args.py``) does not turn overlap off on CPU;
* a stand-in for the one GPU-only piece the overlap path reaches on CPU: the host
  gathers the relayed draft extras of EAGLE/STANDALONE (``FutureMap``) with a Triton
  kernel, which cannot launch without a GPU driver; :func:`gather_spec_extras` takes
  the same rows with torch indexing. Streams and events needed none: the host takes
  them from ``torch.get_device_module(device)``, which on CPU is ``torch.cpu``'s
  synchronous Stream/Event (``query()`` True, ``record``/``wait``/``synchronize``
  no-ops, a stream context only swaps the current stream), makes the schedule
  stream's ``synchronize`` a no-op on CPU, and keeps pinned memory and its private
  copy stream to CUDA; ``non_blocking`` copies between CPU tensors are synchronous.
  CPU ops run to completion before they return, so a no-op wait is exact here;
* a trace (:class:`OverlapTrace`, hooks on the scheduler) that logs that the
  overlap loop ran and what crossed the relay, for the end-to-end tests.

What this emulates: the order of the overlap loop (launch, then process the previous
result), the relay of accepted tokens and draft extras through the future map, the
one-step lag of ``req.output_ids``, publish events and the copies the loop makes.
What it cannot show: real concurrency between the forward stream and the scheduler
(races, missing waits or event records, a host sync inside a step that stalls the
pipeline), CUDA-graph replay under overlap, pinned-memory copy streams; only a GPU
run checks those.

Nothing is installed unless the switch is on *and* the host runs its CPU engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger("sglang_spec_ext")

#: The switch (environment variable).
ENV = "SGLANG_SPEC_EXT_CPU_OVERLAP"
_TRUE = ("1", "true", "yes", "on")

#: The host's resolution that turns overlap off for speculative decoding on CPU.
DISABLE_FOR_CPU_TARGET = "sglang.srt.arg_groups.speculative_hook._disable_overlap_schedule_for_cpu"
#: The host's fused Triton gather of the relayed draft extras (EAGLE/STANDALONE relay).
GATHER_SPEC_EXTRAS_TARGET = "sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras"
#: Scheduler methods the overlap trace (:class:`OverlapTrace`) observes.
EVENT_LOOP_TARGET = "sglang.srt.managers.scheduler.Scheduler.event_loop_overlap"
RUN_BATCH_TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
ON_IDLE_TARGET = "sglang.srt.managers.scheduler.Scheduler.on_idle"
#: Logged by the scheduler when its overlap event loop starts (the proof a test reads).
LOOP_MESSAGE = "sglang-spec-ext CPU overlap: scheduler entered event_loop_overlap"
#: Prefix of the trace summary line (see :meth:`OverlapTrace.summary`).
TRACE_MESSAGE = "sglang-spec-ext CPU overlap trace:"
#: Log line written (once per process) when the resolution above is skipped.
KEEP_MESSAGE = "sglang-spec-ext: overlap scheduling kept on for speculative decoding on CPU"


def cpu_overlap_requested(env: dict[str, str] | None = None) -> bool:
    """Whether ``SGLANG_SPEC_EXT_CPU_OVERLAP`` asks for overlap on the CPU engine."""
    value = (os.environ if env is None else env).get(ENV, "")
    return value.strip().lower() in _TRUE


def cpu_overlap_enabled() -> bool:
    """The switch is on and the host runs its CPU engine (nothing else is touched)."""
    if not cpu_overlap_requested():
        return False
    from sglang_spec_ext.sglang.host.platform import host_runs_cpu_engine

    return host_runs_cpu_engine()


_kept_logged = False


def keep_overlap_hook(original: Callable[..., None], server_args: Any, *a: Any, **kw: Any) -> None:
    """AROUND the host's ``_disable_overlap_schedule_for_cpu``: with the switch on the
    resolution is skipped (overlap stays as resolved so far); otherwise the host runs."""
    global _kept_logged
    if not cpu_overlap_requested():
        return original(server_args, *a, **kw)
    if not _kept_logged:
        _kept_logged = True
        logger.warning("%s (%s=1)", KEEP_MESSAGE, ENV)
    return None


def gather_spec_extras(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Pure-torch stand-in for the host's Triton ``gather_spec_extras``: the rows
    ``indices`` of each relay buffer (new tensors; the buffers are not touched)."""
    rows = indices.reshape(-1).long()
    hidden = None if hidden_states_buf is None else hidden_states_buf[rows]
    return topk_p_buf[rows], topk_index_buf[rows], output_tokens_buf[rows], hidden


class OverlapTrace:
    """What the overlap loop really did, for the log (and the end-to-end tests).

    Counted at ``Scheduler.run_batch`` (one call per launched batch): decode steps
    whose inputs come through the future-map relay (``spec_info.future_indices``
    set, ``enable_overlap`` on), prefill (extend) batches launched between two
    decode steps, and changes of the verify width between consecutive decode steps
    (the width each step's result reports).
    """

    def __init__(self) -> None:
        self.decode_steps = 0
        self.relayed_steps = 0
        self.extend_steps = 0
        self.prefills_between_decodes = 0
        self.width_down = 0
        self.width_up = 0
        self.widths: set[int] = set()
        self._last_width: int | None = None
        self._extend_since_decode = False
        self._logged: dict[str, Any] | None = None

    def on_batch(self, batch: Any, result: Any, relayed: bool) -> None:
        """Count one launched batch and its result; ``relayed``: the batch's inputs
        came through the overlap relay (see :func:`_run_batch_hook`)."""
        mode = getattr(batch, "forward_mode", None)
        if mode is None:
            return
        if mode.is_extend():
            self.extend_steps += 1
            if self.decode_steps:
                self._extend_since_decode = True
            return
        if not mode.is_decode():
            return
        self.decode_steps += 1
        if self._extend_since_decode:
            self.prefills_between_decodes += 1
            self._extend_since_decode = False
        if relayed:
            self.relayed_steps += 1
        width = getattr(result, "speculative_num_draft_tokens", None)
        if width is None:
            return
        width = int(width)
        self.widths.add(width)
        if self._last_width is not None and width < self._last_width:
            self.width_down += 1
        elif self._last_width is not None and width > self._last_width:
            self.width_up += 1
        self._last_width = width

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode_steps": self.decode_steps,
            "relayed_steps": self.relayed_steps,
            "extend_steps": self.extend_steps,
            "prefills_between_decodes": self.prefills_between_decodes,
            "width_down": self.width_down,
            "width_up": self.width_up,
            "widths": sorted(self.widths),
        }

    def summary(self) -> str:
        """One log line: :data:`TRACE_MESSAGE` then ``key=value`` pairs."""
        return TRACE_MESSAGE + " " + " ".join(f"{k}={v}" for k, v in self.as_dict().items())

    def log_if_changed(self) -> None:
        state = self.as_dict()
        if state != self._logged and self.decode_steps:
            self._logged = state
            logger.info("%s", self.summary())


#: This process's trace (only the scheduler process launches batches).
TRACE = OverlapTrace()


def parse_trace(line: str) -> dict[str, str]:
    """The ``key=value`` pairs of a :meth:`OverlapTrace.summary` line."""
    tail = line[line.index(TRACE_MESSAGE) + len(TRACE_MESSAGE) :]
    pairs = [p.split("=", 1) for p in tail.replace(", ", ",").split() if "=" in p]
    return {k: v for k, v in pairs}


def _event_loop_hook(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.event_loop_overlap``: say that the overlap loop runs."""
    logger.warning("%s", LOOP_MESSAGE)


def _run_batch_hook(
    original: Callable[..., Any], scheduler: Any, batch: Any, *a: Any, **kw: Any
) -> Any:
    """AROUND ``Scheduler.run_batch``: the batch is counted by :data:`TRACE`."""
    # Under overlap a decode batch's spec_info carries the future-map slots its
    # inputs are gathered from (resolved inside run_batch); without overlap it has none.
    relayed = bool(getattr(scheduler, "enable_overlap", False)) and (
        getattr(getattr(batch, "spec_info", None), "future_indices", None) is not None
    )
    result = original(scheduler, batch, *a, **kw)
    try:
        TRACE.on_batch(batch, result, relayed)
        if TRACE.decode_steps % 50 == 0:
            TRACE.log_if_changed()
    except Exception:  # the trace must never break serving
        logger.exception("sglang-spec-ext CPU overlap trace failed")
    return result


def _on_idle_hook(*args: Any, **kwargs: Any) -> None:
    """AFTER ``Scheduler.on_idle``: log the trace when it changed since the last line."""
    TRACE.log_if_changed()


def install_cpu_overlap() -> list[str]:
    """Install the CPU-overlap pieces where the switch is on; return what was installed."""
    if not cpu_overlap_enabled():
        return []
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(
        [
            (DISABLE_FOR_CPU_TARGET, keep_overlap_hook, HookType.AROUND),
            (GATHER_SPEC_EXTRAS_TARGET, gather_spec_extras, HookType.REPLACE),
            (EVENT_LOOP_TARGET, _event_loop_hook, HookType.BEFORE),
            (RUN_BATCH_TARGET, _run_batch_hook, HookType.AROUND),
            (ON_IDLE_TARGET, _on_idle_hook, HookType.AFTER),
        ]
    )
    return ["cpu_overlap_args", "gather_spec_extras", "overlap_trace"]
