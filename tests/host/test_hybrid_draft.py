"""HYBRID's draft step without the model (sglang/workers/hybrid_draft.py ``draft_without_model``).

The draft worker here is a stand-in with the host's attribute names (the real
``EagleDraftWorker`` needs a loaded draft model): its ``draft`` runs a draft-KV repair
forward first (as the repair's BEFORE hook on the host's ``draft`` does), then two draft
forwards. Without the model, the draft forwards get zero logits of the right row count
and no model runs; the repair forward still runs the model (its KV is needed by the
next drafts; stubbing it once left a wrong-shaped draft input behind and crashed the
scheduler in the adaptive HYBRID e2e test); the graph runner and the forward are put back.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as rebuild
from sglang_spec_ext.sglang.workers.hybrid_draft import draft_without_model


def _worker():
    calls = []

    def real_forward(forward_batch):
        calls.append(("model", forward_batch.input_ids.shape[0]))
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=None))

    worker = SimpleNamespace(topk=1, cuda_graph_runner="graphs",
                             draft_runner=SimpleNamespace(forward=real_forward))  # fmt: skip
    seen = []

    def draft(batch, with_topology=False):
        seen.append(worker.cuda_graph_runner)
        with rebuild._repair_forward():  # the repair's extend over 3 skipped tokens
            worker.draft_runner.forward(SimpleNamespace(input_ids=torch.zeros(3)))
        for _ in range(2):  # draft steps of 2 requests
            fb = SimpleNamespace(
                input_ids=torch.zeros(2), spec_info=SimpleNamespace(hidden_states=None)
            )
            out = worker.draft_runner.forward(fb).logits_output
            seen.append(tuple(out.next_token_logits.shape))
        return "verify input"

    return worker, draft, calls, seen


def test_draft_steps_are_stubbed_and_the_repair_runs_the_model():
    worker, draft, calls, seen = _worker()
    forward = worker.draft_runner.forward
    assert draft_without_model(worker, draft, batch=None) == "verify input"
    assert calls == [("model", 3)]  # only the repair ran the model
    assert seen == [None, (2, 2), (2, 2)]  # graphs set aside; zero logits per draft row
    assert worker.cuda_graph_runner == "graphs" and worker.draft_runner.forward is forward


def test_everything_is_put_back_when_the_draft_fails():
    worker, _draft, _calls, _seen = _worker()
    forward = worker.draft_runner.forward

    def failing(batch, with_topology=False):
        raise RuntimeError("host draft failed")

    with pytest.raises(RuntimeError, match="host draft failed"):
        draft_without_model(worker, failing, batch=None)
    assert worker.cuda_graph_runner == "graphs" and worker.draft_runner.forward is forward
