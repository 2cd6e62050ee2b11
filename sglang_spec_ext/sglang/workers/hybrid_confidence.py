"""HYBRID's model-draft confidence, read the same way from eager drafts and graph replays.

HYBRID scores the model's draft of each request by the draft model's own top
probability at each draft step (``hybrid.chain_score``). Those steps are the forwards
inside the host's multi-step draft (``EagleDraftWorker.draft_forward``), which the host
runs from a CUDA graph wherever the batch size was captured (its GPU default;
``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` on the CPU test bed) and eagerly otherwise. A Python
wrapper on the draft runner's ``forward`` runs at capture only, so it cannot see a
replay. :class:`ConfidenceTap` is installed on the draft worker *before* the host
captures its graphs (:func:`install_tap_hook`, AROUND ``_capture_cuda_graphs``) and
records device work, not Python state:

* per draft step, the top probability of the step's logits, ``exp(max - logsumexp)``
  (the logits are the host's, computed inside the graph; the host itself keeps only the
  argmax for top-k 1 and the top-k probabilities for top-k > 1, which this equals for the
  best branch);
* at the end of ``draft_forward``, the steps stacked and copied into a buffer allocated
  before capture (``[max_running_requests * topk, steps - 1]``). A graph replays that
  copy into the same buffer, exactly as an eager draft writes it.

After the draft, :meth:`ConfidenceTap.step_rows` gives the rows of the batch, which
HYBRID copies to the host with the step's other reads. Scores, choices and output are therefore the
same whether a draft ran eagerly or from a graph (``tests/e2e/test_cpu_graphs_serving.py``).
The first draft token's probability comes from the draft extend, whose graph runner
returns its logits (``hybrid_worker.py`` reads them from either path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as draft_kv_repair

logger = logging.getLogger("sglang_spec_ext")

#: Where the host's model-draft worker captures its graphs (runs on every device).
CAPTURE_TARGET = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs"
#: The draft worker attribute holding its tap.
TAP_ATTR = "_spec_ext_confidence_tap"


def top_prob(logits: torch.Tensor) -> torch.Tensor:
    """``[n, vocab]`` logits -> ``[n]`` probability of the most likely token."""
    x = logits.float()
    return torch.exp(x.amax(dim=-1) - torch.logsumexp(x, dim=-1))


def next_token_logits(out: Any) -> torch.Tensor | None:
    logits = getattr(getattr(out, "logits_output", out), "next_token_logits", None)
    return logits if isinstance(logits, torch.Tensor) and logits.dim() == 2 else None


class ConfidenceTap:
    """Records the multi-step draft's per-step top probabilities into a fixed buffer."""

    def __init__(self, draft_worker: Any, max_requests: int) -> None:
        self.topk = int(draft_worker.topk)
        self.rows = max(1, int(max_requests)) * self.topk
        self.cols = max(1, int(draft_worker.speculative_num_steps) - 1)
        device = getattr(draft_worker, "device", "cpu")
        self.buf = torch.zeros(self.rows, self.cols, dtype=torch.float32, device=device)
        self._steps: list[torch.Tensor] | None = None
        draft_forward = draft_worker.draft_forward
        runner_forward = draft_worker.draft_runner.forward

        def tapped_draft_forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._steps = []
            try:
                out = draft_forward(forward_batch, *args, **kwargs)
            finally:
                steps, self._steps = self._steps, None
            if steps:
                self._write(torch.stack(steps, dim=1))
            return out

        def tapped_forward(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = runner_forward(forward_batch, *args, **kwargs)
            if self._steps is not None and not draft_kv_repair.repairing():
                logits = next_token_logits(out)
                if logits is not None:
                    self._steps.append(top_prob(logits))
            return out

        draft_worker.draft_forward = tapped_draft_forward
        draft_worker.draft_runner.forward = tapped_forward

    def _write(self, probs: torch.Tensor) -> None:
        """Device copy of ``[n, k]`` step probabilities (a graph records it)."""
        n, k = probs.shape
        if n <= self.rows and k <= self.cols:
            self.buf[:n, :k].copy_(probs)

    def step_rows(self, bs: int, steps: int) -> torch.Tensor | None:
        """``[bs, steps - 1]`` on the device: per request, the best branch's top
        probability at each draft forward of the last draft; None when it had none or
        did not fit (no host read: HYBRID copies it with the step's other reads)."""
        k = int(steps) - 1
        n = bs * self.topk
        if k <= 0 or k > self.cols or n > self.rows or bs <= 0:
            return None
        return self.buf[:n, :k].view(bs, self.topk, k).amax(dim=1)

    def step_probs(self, bs: int, steps: int) -> np.ndarray:
        """:meth:`step_rows` on the host; ``[bs, 0]`` when there are none."""
        rows = self.step_rows(bs, steps)
        return np.zeros((max(bs, 0), 0)) if rows is None else rows.cpu().numpy()


def is_hybrid() -> bool:
    """Whether this process serves ``--speculative-algorithm HYBRID``."""
    try:
        from sglang.srt.runtime_context import get_spec

        return str(get_spec().speculative_algorithm or "").upper() == "HYBRID"
    except Exception:  # noqa: BLE001 - no host context: not serving
        return False


def _max_requests(draft_worker: Any) -> int:
    pool = getattr(getattr(draft_worker, "draft_runner", None), "req_to_token_pool", None)
    size = getattr(pool, "size", None)
    if size:
        return int(size)
    return int(getattr(draft_worker.server_args, "max_running_requests", None) or 256)


def ensure_tap(draft_worker: Any) -> ConfidenceTap:
    """The draft worker's tap, installed now if it has none (idempotent)."""
    tap = getattr(draft_worker, TAP_ATTR, None)
    if tap is None:
        tap = ConfidenceTap(draft_worker, _max_requests(draft_worker))
        setattr(draft_worker, TAP_ATTR, tap)
    return tap


def capture_with_tap_hook(original: Callable[..., Any], worker: Any, *a: Any, **kw: Any) -> Any:
    """AROUND ``EagleDraftWorker._capture_cuda_graphs``: for HYBRID, the tap goes on the
    draft worker before any graph is captured; other algorithms are untouched."""
    if is_hybrid():
        ensure_tap(worker)
    return original(worker, *a, **kw)


def install_tap_hook() -> list[str]:
    """Register :func:`capture_with_tap_hook` (inert unless the server runs HYBRID)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(CAPTURE_TARGET, capture_with_tap_hook, HookType.AROUND)])
    return ["hybrid_confidence_tap"]


class FirstTokenProbs:
    """Per request, the top probability of its next first draft token: the draft
    extend's logits at the request's last committed position, read from the extend's
    eager forward or from the rows its graph runner's replay returns.

    The rows stay on the device until HYBRID's next host copy (:meth:`unread` /
    :meth:`apply`); :attr:`probs` holds what was read, bounded like the other
    per-request state."""

    #: Draft extends whose rows wait on the device at most (prefills with no decode).
    MAX_UNREAD = 32

    def __init__(self) -> None:
        self.in_extend = False
        self._captured: tuple[torch.Tensor, bool] | None = None
        self._unread: list[tuple[list[str], torch.Tensor]] = []
        self.probs: dict[str, float] = {}

    def begin(self) -> None:
        """A draft extend starts."""
        self._captured = None
        self.in_extend = True

    def capture(self, out: Any, selected: bool) -> None:
        """A forward of the draft extend returned ``out`` (``selected``: one row per
        request already, as the extend graph returns them)."""
        if not self.in_extend or draft_kv_repair.repairing():  # a repair is no extend
            return
        logits = next_token_logits(out)
        if logits is not None:
            self._captured = (top_prob(logits), selected)

    def tap_graph_runner(self, runner: Any) -> None:
        """Capture from the extend graph runner's replays too (the host builds it after
        the worker's ``__init__``, so this is called on each extend; idempotent)."""
        if runner is None or getattr(runner, "_spec_ext_tapped", False):
            return
        execute = runner.execute

        def tapped_execute(*args: Any, **kwargs: Any) -> Any:
            out = execute(*args, **kwargs)
            self.capture(out, selected=True)
            return out

        runner.execute = tapped_execute
        runner._spec_ext_tapped = True

    def end(self, rids: list[str], accept_lens: Any, width: int) -> None:
        """The extend ended: keep each request's row (its last committed position)."""
        self.in_extend = False
        captured, self._captured = self._captured, None
        bs = len(rids)
        if captured is None or not bs:
            return
        probs, selected = captured
        if selected and probs.numel() >= bs:  # a replay: one row per (padded) request
            rows = probs[:bs]
        elif probs.numel() == bs:
            rows = probs
        elif accept_lens is not None and probs.numel() == bs * width:
            lens = accept_lens.to(device=probs.device, dtype=torch.int64)
            idx = torch.arange(bs, dtype=torch.int64, device=probs.device) * width
            rows = probs[idx + lens - 1]
        else:
            return
        self._unread.append((list(rids), rows.detach().clone()))
        del self._unread[: -self.MAX_UNREAD]

    def unread(self) -> list[torch.Tensor]:
        return [rows for _, rows in self._unread]

    def apply(self, arrays: list[np.ndarray]) -> None:
        """The host copies of :meth:`unread` (same order)."""
        pending, self._unread = self._unread, []
        for (rids, _), probs in zip(pending, arrays, strict=True):
            for rid, p in zip(rids, probs.tolist(), strict=True):
                self.probs[rid] = float(p)

    def get(self, rid: str) -> float:
        return self.probs.get(rid, 1.0)

    def forget(self, rids: Any) -> None:
        for rid in rids:
            self.probs.pop(rid, None)

    def keep_only(self, rids: set[str], bound: int) -> None:
        if len(self.probs) > bound:  # prefilled requests that never decoded
            self.probs = {r: p for r, p in self.probs.items() if r in rids}
