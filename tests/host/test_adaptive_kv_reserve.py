"""KV reserved per decode step under adaptive tree drafts (sglang/verify/kv_reserve.py).

One decode step in the host's own order, in a fresh interpreter (the host's
HookRegistry is process-wide), with the plugin's hooks installed the way the plugin
installs them (``install_runtime_hooks`` with ``SGLANG_SPEC_EXT_ADAPTIVE=1``):

1. the scheduler's reservation: the real ``ScheduleBatch.new_tokens_required_next_decode``
   (what ``check_decode_mem`` asks the allocator for) and the real
   ``eagle_utils.eagle_prepare_for_decode`` on a real ``ReqToTokenPool`` and a real
   ``TokenToKVPoolAllocator`` (CPU tensors);
2. the worker's state switch: the real ``EAGLEWorkerV2.activate_step_by_batch`` and
   ``apply_runtime_state`` driving the real host ``AdaptiveController`` that our
   ``model_draft_adaptive.attach`` built with the goodput policy;
3. the draft's slot gather: the real ``assign_draft_cache_locs_contiguous_func`` (on the
   CPU engine, the plugin's pure-torch kernel fallback).

Stand-ins, each because the real one needs a GPU or a model: the worker object (the
real EAGLEWorkerV2 builds runtime states from CUDA graphs and attention backends; only
its two methods above run here, unbound, on the stand-in), the runtime states' backends
(``None``), the batch object (the real ScheduleBatch needs a model config and sampling
state; it carries the real pools, the host's batch methods are borrowed), the tree cache
(no prefix sharing), and the policy's choice of step count (scripted: which step count
wins is the controller's business, tests/host/test_model_draft_adaptive.py).

Scenario (topk 4, 5 steps, --speculative-num-draft-tokens 8, page size 1): request R0
filled row 1 and finished; A reuses row 1 and B got R0's freed slots, so row 1 still
names B's slots past A's prompt. The controller runs at 1 step when A and B start
decoding; the scheduler reserves, then the worker switches to 5 steps and drafts.
"""

from __future__ import annotations

from tests.harness.subproc import snippet_result

SCENARIO = """
import json, types
import torch
from sglang_spec_ext.plugin import install_runtime_hooks

res = {"installed": install_runtime_hooks()}

from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous_func
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.runtime_context import get_context, get_spec
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState
from sglang.srt.speculative.eagle_utils import eagle_prepare_for_decode
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang_spec_ext.sglang.model_drafts import adaptive as mda

STEPS, TOPK, W, PROMPT = 5, 4, 8, 100
get_context().override_server_args(
    speculative_algorithm="EAGLE", speculative_num_steps=STEPS, speculative_eagle_topk=TOPK,
    speculative_num_draft_tokens=W, page_size=1,
).install()


class Worker:  # stand-in for EAGLEWorkerV2; the two host methods below are the real ones
    activate_step_by_batch = EAGLEWorkerV2.activate_step_by_batch
    apply_runtime_state = EAGLEWorkerV2.apply_runtime_state

    def __init__(self):
        self.speculative_num_steps, self.speculative_num_draft_tokens, self.topk = STEPS, W, TOPK
        self.speculative_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
        self.adaptive_controller = None
        self._draft_worker = types.SimpleNamespace(
            draft_runner=types.SimpleNamespace(), _rebuild_topk1_chain_buffers=lambda: None)
        self._target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace())

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens,
                                     cuda_graph_bs=None):
        return SpecRuntimeState(speculative_num_steps, speculative_num_draft_tokens,
                                None, None, None, None, None, None)


worker = Worker()
policy = mda.attach(worker)
worker.adaptive_controller.register(worker.build_adaptive_runtime_state(STEPS, W))
worker.adaptive_controller.init_states(cuda_graph_bs=None)  # what init_cuda_graphs does
plan = [1, STEPS]
policy.get_steps_for_batch = lambda bs: plan.pop(0)
worker.activate_step_by_batch(2)  # an earlier decode step chose 1 step
res["active_before"] = get_spec().speculative_num_steps

rows = ReqToTokenPool(size=2, max_context_len=512, device="cpu", enable_memory_saver=False)
alloc = TokenToKVPoolAllocator(300, torch.float32, "cpu", None, True)
r0 = alloc.alloc(230)  # R0 in row 1, then finished
rows.req_to_token[1, :230] = r0.to(torch.int32)
alloc.free(r0)
reqs, owned = [], {}
for row in (1, 2):  # A (row 1), B (row 2): prompts prefilled
    slots = alloc.alloc(PROMPT)
    rows.req_to_token[row, :PROMPT] = slots.to(torch.int32)
    reqs.append(types.SimpleNamespace(
        kv=types.SimpleNamespace(kv_committed_len=PROMPT, kv_allocated_len=PROMPT),
        decode_batch_idx=0))


class Batch:  # stand-in for ScheduleBatch carrying the real pools; host methods borrowed
    new_tokens_required_next_decode = ScheduleBatch.new_tokens_required_next_decode
    _new_tokens_required_next_decode_spec_v2 = (
        ScheduleBatch._new_tokens_required_next_decode_spec_v2)

    def maybe_evict_swa(self):
        pass


batch = Batch()
batch.reqs, batch.device, batch.req_to_token_pool = reqs, "cpu", rows
batch.token_to_kv_pool_allocator = alloc
batch.tree_cache = types.SimpleNamespace(
    token_to_kv_pool_allocator=alloc, supports_prefix_sharing=lambda: False)
batch.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
batch.sampling_info = types.SimpleNamespace(
    penalizer_orchestrator=types.SimpleNamespace(is_required=False))
batch.req_pool_indices = torch.tensor([1, 2], dtype=torch.int64)
batch.seq_lens = torch.tensor([PROMPT, PROMPT], dtype=torch.int64)
batch.seq_lens_cpu = batch.seq_lens.clone()
batch.hisparse_coordinator = None

# 1. scheduler: check_decode_mem's estimate, then the reservation
res["estimate"] = batch.new_tokens_required_next_decode()
eagle_prepare_for_decode(batch)
res["allocated"] = [r.kv.kv_allocated_len for r in reqs]
# 2. worker: the controller switches to STEPS before drafting
worker.activate_step_by_batch(2)
steps = get_spec().speculative_num_steps
res["active_after"] = steps
# 3. draft: topk * steps slots per request from seq_lens on
out = torch.empty(2 * TOPK * steps, dtype=torch.int64)
assign_draft_cache_locs_contiguous_func(
    batch.req_pool_indices, rows.req_to_token, batch.seq_lens, out, TOPK, steps)
drafted = out.view(2, TOPK * steps)
res["outside"], res["hits_other"] = [], []
for i, row in enumerate((1, 2)):
    mine = set(rows.req_to_token[row, : reqs[i].kv.kv_allocated_len].tolist())
    other = set(rows.req_to_token[3 - row, : reqs[1 - i].kv.kv_allocated_len].tolist())
    res["outside"].append(sorted(set(drafted[i].tolist()) - mine))
    res["hits_other"].append(sorted(set(drafted[i].tolist()) & other))
print("RESULT", json.dumps(res))
"""


def test_draft_after_switching_up_stays_inside_the_kv_the_scheduler_reserved():
    res = snippet_result(SCENARIO, env={"SGLANG_SPEC_EXT_ADAPTIVE": "1"}, cpu_engine=True)
    # the host's order: reserved at 1 step, drafted at 5
    assert (res["active_before"], res["active_after"]) == (1, 5), res
    # every draft slot is one the scheduler reserved for that request: none of B's
    assert {"outside": res["outside"], "hits_other": res["hits_other"]} == {
        "outside": [[], []],
        "hits_other": [[], []],
    }, res
    # reserved for the largest state: 2 * max(5 steps * topk 4, W 8) = 40 per request
    assert res["estimate"] == 2 * 40, res
    assert res["allocated"] == [100 + 40, 100 + 40], res
    assert "adaptive_kv_reserve" in res["installed"], res


def test_reservation_is_the_hosts_own_formula_at_the_largest_step_count():
    """The hook evaluates the host's ``get_alloc_len_per_decode`` at the recorded step
    count, leaves it alone without a recorded one or at that count, and never lowers it."""
    res = snippet_result(
        """
import json
from sglang.srt.runtime_context import get_context, get_spec
import sglang.srt.mem_cache.allocation_sizing as sizing
from sglang_spec_ext.sglang.verify import kv_reserve as kv

res = {"installed": kv.install_adaptive_kv_reserve(), "again": kv.install_adaptive_kv_reserve()}
get_context().override_server_args(
    speculative_algorithm="EAGLE", speculative_num_steps=5, speculative_eagle_topk=4,
    speculative_num_draft_tokens=8, page_size=1,
).install()
spec = get_spec()
def lens():
    return [sizing.get_alloc_len_per_decode(), sizing.get_alloc_reserve_per_decode()]
res["startup"] = lens()
with spec.override(speculative_num_steps=1):
    res["at1_unrecorded"] = lens()
    kv.note_states([0, 1, 2, 3, 4, 5])
    res["at1_recorded"] = lens()
    res["bag_after"] = spec.speculative_num_steps
with spec.override(speculative_num_steps=5):
    res["at5"] = lens()
print("RESULT", json.dumps(res))
"""
    )
    assert res["installed"] == ["adaptive_kv_reserve"], res
    assert res["startup"] == [20, 40], res  # max(5 * 4, 8), doubled
    assert res["at1_unrecorded"] == [8, 16], res  # the host alone: max(1 * 4, 8)
    assert res["at1_recorded"] == [20, 40], res
    assert res["bag_after"] == 1, res  # the scoped override is restored
    assert res["at5"] == [20, 40], res
