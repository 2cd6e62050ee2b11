"""The goodput controller as the host's adaptive step policy (``AdaptiveSpecPolicy``).

The host's ``adaptive_runtime_state.AdaptiveController`` keeps one runtime state per
draft step count and asks its policy, before each decode step, for the step count of the
batch size at hand (``get_steps_for_batch``), and tells it, after each verify, the
accepted drafts per request (``on_verify_complete``). :class:`GoodputStepPolicy` answers
with our controller (``adaptive.AdaptiveController`` with chain acceptance per draft
depth, ``adaptive/chain.py``):

* the step time fed to the cost model is the wall time between two consecutive decode
  steps of the same batch size with no prefill between them (:meth:`note_prefill`);
  a step during which the draft-KV repair rebuilt skipped draft KV
  (``kv_repair_marks.STATS``) goes to the controller with the repair's size, which
  splits its time between the step and the repair;
* under overlap scheduling the accepted counts of a step arrive after the next step
  started; decisions are matched to reports in order;
* with ``--tp-size`` > 1 only the first TP rank's controller decides and the others take
  its step count (``tp_sync.TpSync.choice``).

How the policy is attached to the host's worker, configured and priced: ``adaptive.py``
and ``step_prior.py``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable

from sglang_spec_ext.adaptive import AdaptiveController
from sglang_spec_ext.sglang.model_drafts.kv_repair_marks import STATS as REPAIR_STATS
from sglang_spec_ext.sglang.serving import metrics as spec_metrics
from sglang_spec_ext.sglang.workers.tp_sync import TpSync

logger = logging.getLogger("sglang_spec_ext")

#: Log line prefix; what follows is {batch-size tier: {draft steps: decode steps}} since
#: the previous line.
STEPS_LOG_MARK = "sglang-spec-ext adaptive steps per batch-size tier since the last line: "
#: Decisions kept waiting for their verify report (overlap keeps one in flight).
MAX_PENDING = 8


class GoodputStepPolicy:
    """The host's ``AdaptiveSpecPolicy`` protocol, answered by our controller."""

    #: Read by the metrics' verify hook (``serving/metrics.py``): each request's step
    #: count is ours to report.
    spec_ext_step_policy = True

    def __init__(
        self,
        controller: AdaptiveController,
        *,
        clock: Callable[[], float] = time.perf_counter,
        log_interval_s: float = 30.0,
        tp: TpSync | None = None,
    ) -> None:
        self.controller = controller
        self._clock = clock
        self._tp = tp  # TP > 1: the first rank decides, the others take its choice
        self._cuda_graph_bs: list[int] | None = None
        # (bs, steps) awaiting a report; overlap keeps one in flight, the bound drops stale ones
        self._pending: deque[tuple[int, int]] = deque(maxlen=MAX_PENDING)
        self._last: tuple[int, int, float] | None = None  # (bs, steps, start) of the last step
        self._log_interval_s = log_interval_s
        self._logged_at = clock()
        self._used: dict[int, Counter[int]] = {}
        self._repairs_seen = (0, 0, 0)  # draft-KV (repairs, requests, tokens) at the last step

    # -- host protocol -------------------------------------------------------------
    @property
    def candidate_steps(self) -> list[int]:
        return [int(k) for k in self.controller.ks]

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        # every step count can be chosen at every batch size
        return None if self._cuda_graph_bs is None else list(self._cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        """Called by the host before each decode step: the step count to run."""
        now = self._clock()
        bs = int(batch_size)
        # a step that rebuilt skipped draft KV (draft_kv_repair) did more than its steps:
        # the controller splits its time between the two
        seen = self._repairs_seen
        self._repairs_seen = (REPAIR_STATS.repairs, REPAIR_STATS.requests, REPAIR_STATS.tokens)
        if self._last is not None:
            last_bs, last_k, start = self._last
            if self._repairs_seen != seen:
                if last_bs == bs:
                    reqs = self._repairs_seen[1] - seen[1]
                    tokens = self._repairs_seen[2] - seen[2]
                    self.controller.observe_repair_step(bs, last_k, now - start, tokens, reqs)
            elif last_bs == bs:
                self.controller.observe_step_time(bs, last_k, now - start)
        if bs < 1:  # an idle batch: nothing to decide
            self._last = None
            return self.candidate_steps[0]
        # what a repair would rebuild now (0 without the repair)
        self.controller.note_unwritten(
            REPAIR_STATS.unwritten_tokens, REPAIR_STATS.unwritten_requests
        )
        steps = self._decide(bs)
        self._last = (bs, steps, now)
        self._pending.append((bs, steps))
        self._count(bs, steps, now)
        return steps

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> None:
        """Called by the host after each decode verify; switching happens at the next
        ``get_steps_for_batch``, so this never asks for one (returns ``None``)."""
        if not self._pending:
            return None
        bs, steps = self._pending.popleft()
        accepted = [int(a) for a in num_correct_drafts_per_req]
        if len(accepted) != bs:  # a report that does not match the decision: skip it
            return None
        self.controller.on_verify(bs, steps, accepted)
        return None

    # -- ours -----------------------------------------------------------------------
    def _decide(self, bs: int) -> int:
        """The step count of this decode step, the same on every TP rank: the first
        rank's controller decides from its own clock and the others take its choice (a
        rank-local choice would switch draft steps, verify width and graphs on one rank
        only: mismatched collectives). Every rank calls this once per decode step, in
        the lockstep order of the TP schedulers."""
        if self._tp is None:
            return int(self.controller.choose_k(bs))
        steps = int(self.controller.choose_k(bs)) if self._tp.is_src else -1
        return self._tp.choice(steps)

    def note_prefill(self) -> None:
        """A prefill ran: the time since the last decode step is not a step time."""
        self._last = None

    def _count(self, bs: int, steps: int, now: float) -> None:
        """Count the choice; every ``log_interval_s`` log the counts since the last line."""
        tier = int(self.controller.policy.tiers[self.controller.policy.tier_index(bs)])
        self._used.setdefault(tier, Counter())[steps] += 1
        spec_metrics.on_adaptive_step("steps", self.controller, bs, steps)
        if now - self._logged_at >= self._log_interval_s:
            self._logged_at = now
            counts = {t: dict(sorted(c.items())) for t, c in sorted(self._used.items())}
            logger.info("%s%s", STEPS_LOG_MARK, counts)
            self._used.clear()
