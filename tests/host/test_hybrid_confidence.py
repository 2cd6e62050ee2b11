"""HYBRID's draft-confidence tap (sglang/workers/hybrid_confidence.py) under the CPU graph
emulation's capture and replay (cpu_graphs.TracedGraph, the stand-in for a CUDA graph
that the e2e graph mode uses): a replayed multi-step draft writes the same per-step top
probabilities as an eager one, for new inputs, where a Python wrapper alone would see
nothing after capture. The draft worker is a stand-in (the real one needs a loaded draft
model; tests/e2e/test_cpu_graphs_serving.py serves HYBRID with both)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_spec_ext.sglang.cpu.graph_capture import TracedGraph
from sglang_spec_ext.sglang.workers.hybrid_confidence import ConfidenceTap, top_prob

VOCAB = 16


class _DraftWorker:
    """The parts of the host's EagleDraftWorker the tap touches: ``draft_forward`` runs
    ``steps - 1`` draft-runner forwards on a static input buffer."""

    def __init__(self, bs: int, topk: int, steps: int) -> None:
        self.topk, self.speculative_num_steps, self.device = topk, steps, "cpu"
        self.inputs = torch.zeros(bs * topk, VOCAB)  # static buffer (as a graph runner's)
        weight = torch.linspace(-1.0, 1.0, VOCAB * VOCAB).view(VOCAB, VOCAB)
        self.draft_runner = SimpleNamespace(forward=self._runner_forward)
        self._weight = weight

    def _runner_forward(self, x: torch.Tensor) -> SimpleNamespace:
        logits = x @ self._weight
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    def draft_forward(self, _forward_batch=None) -> torch.Tensor:
        x = self.inputs
        for _ in range(self.speculative_num_steps - 1):
            logits = self.draft_runner.forward(x).logits_output.next_token_logits
            x = torch.softmax(logits, dim=-1) * 3.0
        return x


def _eager_steps(worker: _DraftWorker, bs: int) -> np.ndarray:
    x, cols = worker.inputs.clone(), []
    for _ in range(worker.speculative_num_steps - 1):
        logits = x @ worker._weight
        cols.append(top_prob(logits))
        x = torch.softmax(logits, dim=-1) * 3.0
    probs = torch.stack(cols, dim=1).view(bs, worker.topk, -1).amax(dim=1)
    return probs.numpy()


@pytest.mark.parametrize(("topk", "steps"), [(1, 3), (2, 3), (4, 2)])
@torch.inference_mode()
def test_replayed_draft_writes_the_eager_step_probabilities(topk, steps):
    bs = 3
    worker = _DraftWorker(bs, topk, steps)
    tap = ConfidenceTap(worker, max_requests=8)  # installed before capture, as the hook does
    gen = torch.Generator().manual_seed(0)
    worker.inputs.copy_(torch.randn(bs * topk, VOCAB, generator=gen))
    graph = TracedGraph("draft")
    graph.capture(lambda: worker.draft_forward(None))
    for _ in range(3):  # new inputs each step: only the replay runs, no Python wrapper
        worker.inputs.copy_(torch.randn(bs * topk, VOCAB, generator=gen))
        tap.buf.zero_()
        graph.replay()
        np.testing.assert_allclose(tap.step_probs(bs, steps), _eager_steps(worker, bs), rtol=1e-6)
    # the same draft run eagerly writes the same values
    tap.buf.zero_()
    worker.draft_forward(None)
    np.testing.assert_allclose(tap.step_probs(bs, steps), _eager_steps(worker, bs), rtol=1e-6)


def test_no_columns_without_draft_steps_or_beyond_the_buffer():
    worker = _DraftWorker(2, 1, 3)
    tap = ConfidenceTap(worker, max_requests=2)
    assert tap.step_probs(2, 1).shape == (2, 0)  # one step: no draft forward
    assert tap.step_probs(4, 3).shape == (4, 0)  # more requests than the buffer holds
    assert tap.step_probs(2, 5).shape == (2, 0)  # more steps than it was built for
    worker.inputs = torch.ones(4, VOCAB)  # an eager batch past the buffer: not written
    tap.buf.fill_(0.5)
    worker.draft_forward(None)
    assert bool((tap.buf == 0.5).all())


def test_top_prob_is_the_softmax_maximum():
    logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, -3.0, 5.0]])
    torch.testing.assert_close(top_prob(logits), torch.softmax(logits, -1).amax(-1))
