"""Ragged verify in the SUFFIX worker: each request's own draft through the target.

The mechanism is ``sglang/verify/ragged.py`` (compact target forward, padding cut off the
trees, logits scattered back); this mixin wires it into :class:`~.suffix_worker.SuffixWorker`
(and adaptive SUFFIX): whether the step is ragged (the setting, the target's attention
backend, LoRA), the lengths each step's drafts set, the target worker the host's NGRAM
verify calls, and the step verified at the batch's longest draft instead of the whole
width.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_spec_ext.sglang.verify.ragged import RaggedVerify, draft_lens
from sglang_spec_ext.sglang.verify.ragged_backends import ragged_route
from sglang_spec_ext.sglang.verify.ragged_graphs import compact_runner
from sglang_spec_ext.sglang.verify.widths import (
    VerifyWidthBackendError,
    VerifyWidthBackends,
    reads_width_from_spec_info,
)
from sglang_spec_ext.suffix.draft import DraftTree

logger = logging.getLogger("sglang_spec_ext")


class RaggedStepsMixin:
    """Ragged verify for a SUFFIX worker (see the module doc). The worker sets ``_ragged``
    and ``_ragged_resolved`` (``_init_drafter``), then calls :meth:`_init_ragged`."""

    _ragged: RaggedVerify | None
    _ragged_resolved: bool
    _step_drafts: int
    _shorter_steps: bool
    _verify_backends: VerifyWidthBackends | None
    draft_token_num: int
    max_width: int

    def _init_ragged(self) -> None:
        """Ragged verify (``verify/ragged.py``) if the setting asks for it; whether the
        target's attention backend can run it is known once the backends exist
        (:meth:`_resolve_ragged`, at start-up in :meth:`init_cuda_graphs`)."""
        self._ragged = None
        self._ragged_resolved = False
        if self._config.ragged_verify and self.max_width > 1:
            self._ragged = RaggedVerify()

    def _resolve_ragged(self) -> None:
        """One start-up line: the verify is ragged, or padded and why."""
        if self._ragged_resolved:
            return
        self._ragged_resolved = True
        if self._ragged is None:
            logger.info("SUFFIX: verify padded to the batch's width (SGLANG_SPEC_EXT_RAGGED_"
                        "VERIFY=0 or width 1)")  # fmt: skip
            return
        route, problem = ragged_route(self.model_runner, chains=int(self.topk) <= 1)
        problem = problem or _lora_problem(self) or _dp_attention_problem(self)
        if problem is not None:
            self._ragged = None
            logger.info("SUFFIX: verify padded: %s (SGLANG_SPEC_EXT_RAGGED_VERIFY=0 silences "
                        "this line's reason).", problem)  # fmt: skip
            return
        if compact_runner(self._target_worker) is not None:
            how = ("verify graphs keyed by the batch's total verify tokens, token buckets: "
                   "a step replays the smallest bucket that holds it")  # fmt: skip
        else:
            how = self._eager_policy()
        self._ragged.route = route
        logger.info("SUFFIX: verify ragged: each request's target verify covers its own draft "
                    "(%s; %s)", route.describe(), how)  # fmt: skip

    #: adaptive SUFFIX builds a verify backend for every width itself (its init_cuda_graphs)
    PREPARES_EVERY_WIDTH = False

    def _prepare_shorter_widths(self) -> None:
        """A ragged step no request of which needs the whole width verifies at the batch's
        longest draft (:meth:`_shorter_step`). Where the target's attention backend sizes
        its verify metadata at construction (FA3 / FA4: ``verify/widths.py``) that takes a
        backend per width: built here, at start-up, not inside a decode step; where one
        cannot be built, ragged steps verify at the whole width instead (still ragged)."""
        if self._ragged is None or self.PREPARES_EVERY_WIDTH or self.max_width <= 2:
            return
        runner = getattr(self, "model_runner", None)
        backend = getattr(runner, "attn_backend", None)
        if backend is None or reads_width_from_spec_info(backend):
            return
        backends = self._verify_backends or VerifyWidthBackends(runner, self.max_width)
        try:
            backends.prepare(range(2, self.max_width))
        except VerifyWidthBackendError as exc:
            self._shorter_steps = False
            logger.warning("SUFFIX: ragged steps verify at the full width %d (no verify "
                           "backend per shorter width: %s)", self.max_width, exc)  # fmt: skip
            return
        self._verify_backends = backends

    def _shorter_fits(self, bs: int, width: int) -> bool:
        """Whether a step of ``bs`` requests whose longest draft is ``width`` verifies at
        that width (:meth:`_shorter_step`). Not where the step keeps its padded graph
        replay (``RaggedVerify.keeps_graph``) and ``width`` has no verify graph holding it:
        there the narrower verify would run eagerly and still padded, so it verifies at the
        startup width on its graph (adaptive SUFFIX's per-width graphs do hold it)."""
        if not self._shorter_steps:
            return False
        if self._ragged is None or not self._ragged.keeps_graph(bs):
            return True
        runner = (
            None if self._verify_backends is None else self._verify_backends.graph_runner(width)
        )
        return runner is not None and bs <= int(getattr(runner, "max_bs", 0))

    def _eager_policy(self) -> str:
        """Where ragged steps run eagerly: on a GPU with verify graphs, only at batches the
        graphs do not hold (``SGLANG_SPEC_EXT_RAGGED_EAGER=auto``), so no step trades a graph
        replay for an eager forward; the CPU engine (its graphs are an emulation) always."""
        runner = getattr(getattr(self._target_worker, "model_runner", None),
                         "decode_cuda_graph_runner", None)  # fmt: skip
        on_gpu = str(getattr(self.model_runner, "device", "cpu")).startswith("cuda")
        if on_gpu and runner is not None and self._config.ragged_eager == "auto":
            self._ragged.graph_bs_limit = int(runner.max_bs)
            return (f"a ragged step runs its verify forward eagerly, so batches up to the "
                    f"captured {runner.max_bs} verify padded and replay their graph; "
                    "SGLANG_SPEC_EXT_RAGGED_EAGER=always verifies them ragged")  # fmt: skip
        return "a ragged step runs the verify forward eagerly"

    def _shorter_step(self, batch: Any, width: int, on_publish, pp_proxy_tensors) -> Any:
        """Ragged verify where no request's draft needs the whole width: the host's verify
        at the batch's longest draft (its root included), so the verify input, the
        sampler's logits and the padding the host still builds shrink with it; the drafts
        are the staged ones cut to their first ``width`` rows (every real node is among
        them, padding follows), the relay padded back to the width of the step."""
        tokens, mask = self._staged
        bs, full = len(batch.reqs), self.draft_token_num
        staged = (
            tokens.reshape(bs, full)[:, :width].reshape(-1),
            mask.reshape(bs, full, full)[:, :width, :width].reshape(-1),
        )
        self._ragged.padded_width = full
        try:
            return self._verify_at_width(batch, width, staged, on_publish, pp_proxy_tensors)
        finally:
            self._ragged.padded_width = None

    @property
    def target_worker(self) -> Any:
        """The target worker; during a ragged verify step, its compact-forward wrapper."""
        ragged = getattr(self, "_ragged", None)
        if ragged is None:
            return self._target_worker
        return ragged.target(self._target_worker)

    def _prepare_for_speculative_decoding(self, batch: Any) -> None:
        super()._prepare_for_speculative_decoding(batch)
        self._resolve_ragged()
        if self._ragged is not None:
            always = compact_runner(self._target_worker) is not None
            self._ragged.plan(batch, self.draft_token_num, always=always)

    def _set_lens(self, trees: list[DraftTree]) -> None:
        self._step_drafts = sum(len(t.parents) for t in trees)
        if self._ragged is not None:
            self._ragged.set_lens(draft_lens([len(t.parents) for t in trees], self.draft_token_num))

    def drafter_stats(self) -> dict:
        stats = super().drafter_stats()
        if getattr(self, "_ragged", None) is not None:
            stats.update(self._ragged.stats_dict())
        return stats


def _dp_attention_problem(worker: Any) -> str | None:
    """Under DP attention the host sizes each rank's verify as requests x one width."""
    if getattr(worker, "_dp_tokens", None) is not None:
        return (
            "DP attention (the host lays each rank's verify out as its requests times "
            "one width when it pads for the gathered MLP)"
        )
    return None


def _lora_problem(worker: Any) -> str | None:
    """LoRA serving maps adapters to the verify's uniform rows per request."""
    args = getattr(worker, "server_args", None)
    if args is not None and (
        getattr(args, "enable_lora", None) or getattr(args, "lora_paths", None)
    ):
        return "LoRA serving (--enable-lora / --lora-paths) maps adapters onto uniform verify rows"
    return None
