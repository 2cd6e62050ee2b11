"""SUFFIX with an adaptive verify width (``SGLANG_SPEC_EXT_ADAPTIVE=1``).

Before each decode step the controller (``sglang_spec_ext.adaptive``) picks the
number of draft nodes ``k`` for the batch size at hand; the step then verifies
``k + 1`` tokens per request (``k = 0`` is plain decoding through the verify
path). ``--speculative-num-draft-tokens`` is the largest width.

How widths switch without touching the host (``width_switch.py``, shared with the
fixed-width worker's narrow steps):

* the host's NGRAM worker keeps preallocated draft buffers sized by
  ``draft_token_num``; one set per width is built lazily with the host's own
  ``_init_preallocated_tensors`` and swapped in before the step;
* the step's result reports its width (``speculative_num_draft_tokens``), so
  the scheduler's output processing and its metrics use the width really used;
* under overlap scheduling the relayed accepted tokens are always at the
  startup width, which is what the host's future map is sized for: decode
  steps pad their relay, and prefill (extend) batches, whose relay the host
  builds at ``draft_token_num``, always run at the startup width
  (tests/host/test_overlap_relay.py drives this against the host's FutureMap).

Feedback: the accepted drafts per request of a step come from the host's result
processing, which has them on the CPU already (``on_verify_complete_cpu``, as the
host's own adaptive controllers get theirs), so the worker reads nothing from the
device for them; the step time fed to the cost model is the wall time between two
consecutive decode steps of the same batch size, which is what bounds decode
throughput. A step's feedback reaches the controller once both are known (under
overlap scheduling one step later than without). With ``--tp-size`` > 1 the first TP
rank's choice is broadcast to the others (``tp_sync.TpSync``), so all ranks
verify the same shape.

The target's attention metadata follows the width (``verify/widths.py``):
flashinfer, triton and torch_native read it from the verify input; a backend that
sizes its verify metadata at start-up (FA3, the default on Hopper) gets one
target attention backend per width, built at start-up by the host's factory and
swapped into the target model runner before each step. With CUDA graphs on, the
target's verify graph runner is captured at every width the controller can choose
(:func:`verify_graph_widths`), each with its own attention backend, and swapped in
with the width. Tested end to end on the CPU engine (with its graph emulation); the
metadata of the real FA3, triton and flashinfer code at every width in
tests/host/test_verify_attention_metadata.py.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController
from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.serving.server_args import plugin_config
from sglang_spec_ext.sglang.verify.widths import VerifyWidthBackends
from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

logger = logging.getLogger("sglang_spec_ext")

#: Decode steps between two INFO lines summarising the widths the controller used.
LOG_EVERY_STEPS = 200
#: Decode steps whose feedback may wait for the host's result processing (older ones are
#: dropped: the host processes each step's result one or two steps later).
MAX_UNRESOLVED_STEPS = 8


@dataclass
class _Step:
    """A decode step waiting for its feedback: its time (from the next decode step's
    start) and its accepted drafts (from the host's result processing)."""

    bs: int
    k: int
    rids: list[str]
    start: float
    seconds: float | None = None  # None: not known yet
    timed: bool = True  # False: no step time (the next step had another batch size)
    accepted: list[int] | None = None


def adaptive_config_for(max_width: int) -> AdaptiveConfig:
    """The controller config from the plugin config, capped by the startup width."""
    from sglang_spec_ext.config import adaptive_config

    return adaptive_config(plugin_config(), max_k=max_width - 1)


def verify_graph_widths(max_width: int) -> tuple[int, ...]:
    """The verify widths with target verify graphs: the startup width and the widths the
    controller can choose (its candidate draft lengths + 1, capped by the startup width),
    the narrowest ``SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS`` of the latter where that is set."""
    others = list(verify_graph_widths_all(max_width)[:-1])
    keep = plugin_config().verify_graph_widths
    if keep >= 0:
        others = others[:keep]
    return (*others, max_width)


def verify_graph_widths_all(max_width: int) -> tuple[int, ...]:
    """Every verify width the controller can choose, ascending (the startup width last)."""
    ks = adaptive_config_for(max_width).ks
    return (*sorted({min(k + 1, max_width) for k in ks} - {max_width}), max_width)


class AdaptiveSuffixWorker(SuffixWorker):
    """``--speculative-algorithm SUFFIX`` with ``SGLANG_SPEC_EXT_ADAPTIVE=1``."""

    NARROW_EMPTY_STEPS = False  # width 1 is on the controller's ladder, with its graphs
    USES_DRAFT_GATE = False  # the controller chooses the width; width 1 is a plain step

    def _init_drafter(self) -> None:
        super()._init_drafter()
        config = plugin_config()
        if config.draft_gate and config.sources.get("draft_gate") != "default":
            logger.warning(
                "SGLANG_SPEC_EXT_DRAFT_GATE=1 is ignored with SGLANG_SPEC_EXT_ADAPTIVE=1: the "
                "controller chooses the verify width (width 1 is a plain step)"
            )
        self.controller = AdaptiveController(adaptive_config_for(self.max_width))
        self._steps: deque[_Step] = deque(maxlen=MAX_UNRESOLVED_STEPS)
        self._widths_used: Counter[int] = Counter()
        self.feedback_mismatches = 0  # host results whose batch size matched no step
        self.fed_back_steps = 0

    PREPARES_EVERY_WIDTH = True  # (suffix_ragged._prepare_shorter_widths)

    def init_cuda_graphs(self) -> None:
        """After the target's graphs (the scheduler's order): a verify backend per width."""
        super().init_cuda_graphs()
        self._verify_backends = VerifyWidthBackends(self.model_runner, self.max_width)
        # Graphs first: a width with graphs verifies on its graphs' backend, so prepare()
        # then builds eager backends only for the widths without.
        graph_widths = verify_graph_widths(self.max_width)
        self._verify_backends.prepare_graphs(graph_widths)
        self._verify_backends.prepare(range(1, self.max_width + 1))
        if self._verify_backends.startup_graphs is not None:
            eager = sorted(set(verify_graph_widths_all(self.max_width)) - set(graph_widths))
            if eager:
                logger.info("SUFFIX adaptive: verify graphs at widths %s; widths %s verify "
                            "without graphs of their own (SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS="
                            "%d)", list(graph_widths), eager,
                            plugin_config().verify_graph_widths)  # fmt: skip

    # -- the step ----------------------------------------------------------------
    def forward_batch_generation(
        self, batch: Any, on_publish=None, pp_proxy_tensors=None, *, grammar_barrier=None
    ):
        if not batch.forward_mode.is_decode():
            self._close_step(None)  # a prefill in between: no decode step time to measure
            # The host's extend path relays accept_tokens at draft_token_num: that
            # must be the startup width, which the host's future map is sized for
            # (and which every relayed row stride assumes), not the last decode width.
            self._use_width(self.max_width)
            return super().forward_batch_generation(
                batch,
                on_publish=on_publish,
                pp_proxy_tensors=pp_proxy_tensors,
                grammar_barrier=grammar_barrier,
            )
        now = time.perf_counter()
        bs = len(batch.reqs)
        rids = [req.rid for req in batch.reqs]
        self._close_step(now, bs)
        width = self._choose_width(bs, rids)
        self._use_width(width)
        result = super().forward_batch_generation(
            batch,
            on_publish=on_publish,
            pp_proxy_tensors=pp_proxy_tensors,
            grammar_barrier=grammar_barrier,
        )
        self._steps.append(_Step(bs, width - 1, rids, now))
        if width < self.max_width and result.next_draft_input is not None:
            self._pad_relay(result.next_draft_input, bs, width)
        self._widths_used[width] += 1
        spec_metrics.on_adaptive_step("width", self.controller, bs, width, batch.reqs)
        if sum(self._widths_used.values()) >= LOG_EVERY_STEPS:
            logger.info(
                "SUFFIX adaptive: verify widths used in the last %d decode steps: %s "
                "(feedback: %d steps fed back, %d host results matched no step)",
                LOG_EVERY_STEPS,
                dict(sorted(self._widths_used.items())),
                self.fed_back_steps,
                self.feedback_mismatches,
            )
            self._widths_used.clear()
        return result

    def _choose_width(self, bs: int, rids: list[str]) -> int:
        """The verify width of this decode step, the same on every TP rank."""
        k = self.controller.choose_k(bs, rids)
        width = max(1, min(k + 1, self.max_width))
        if self._tp_sync is not None:
            width = self._tp_sync.width(width)
        return width

    def _close_step(self, now: float | None, bs: int = 0) -> None:
        """The last decode step's time, up to ``now`` (the next decode step's start, of
        ``bs`` requests; None: a prefill came between, so no step time)."""
        if self._steps and self._steps[-1].seconds is None and self._steps[-1].timed:
            last = self._steps[-1]
            if now is None or last.bs != bs:
                last.timed = False
            else:
                last.seconds = now - last.start
        self._feed_back()

    def on_verify_complete_cpu(
        self, num_correct_drafts_per_req: list[int], batch_size: int = 0
    ) -> None:
        """The host's result processing of a decode step, its accepted drafts per request
        on the CPU (``batch_result_processor``): the oldest step still waiting for them."""
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        waiting = next((s for s in self._steps if s.accepted is None), None)
        if waiting is None or len(num_correct_drafts_per_req) != waiting.bs:
            self.feedback_mismatches += 1
            return
        waiting.accepted = [max(0, int(a)) for a in num_correct_drafts_per_req]
        self._feed_back()

    def _feed_back(self) -> None:
        """Feed the controller every leading step whose time and acceptance are known."""
        while self._steps:
            step = self._steps[0]
            if step.accepted is None or (step.timed and step.seconds is None):
                return
            self._steps.popleft()
            self.fed_back_steps += 1
            self.controller.on_verify(step.bs, step.k, step.accepted,
                                      step.seconds if step.timed else None,
                                      req_ids=step.rids)  # fmt: skip

    def close_sessions(self, rids: list[str]) -> None:
        super().close_sessions(rids)
        self.controller.forget_requests(rids)
