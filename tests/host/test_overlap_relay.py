"""The adaptive SUFFIX worker under overlap scheduling, against the host's real relay.

Overlap scheduling (the GPU default) relays each step's accepted tokens to the next
step through the host's ``FutureMap`` (``srt/managers/overlap_utils.py``): the
scheduler stashes ``RelayPayload.from_ngram(result.next_draft_input)`` into a buffer
whose row width is fixed by the first stash, and the next step reads the rows back
through ``resolve_forward_inputs``. Prefill batches go through the host NGRAM extend
path, which emits its relay at the worker's current ``draft_token_num``. This test
runs a small scheduler loop in the host's overlap order (launch step N+1, then process
the result of step N; merge a prefill batch into the running batch, or make it the
running batch when that is empty; filter finished requests) over:

* REAL host code: ``FutureMap`` (stash, publish, ``resolve_seq_lens_cpu``,
  ``resolve_forward_inputs``), ``RelayPayload``, ``Scheduler._relay_forward_payload``,
  ``NgramVerifyInput`` (``filter_batch`` / ``merge_batch``), the output stride the
  host's result processor uses, ``Req``, and ``NGRAMWorker.forward_batch_generation``
  with its per-width buffers, for prefill and decode;
* STAND-INS, because they need a model, KV pools or the GPU runtime context: the
  target model (a deterministic bigram "model" whose greedy output the test knows),
  the greedy tree verify (``eagle_sample``: walks the drafted tree against the stand-in
  target, as the host's greedy verify does), KV-slot assignment and KV moves, and the
  mamba-state hooks (no-ops for a non-mamba model). The schedule batch is a namespace
  holding the fields the host code above reads.

Every request's output must be the stand-in target's greedy output (lossless), through
prefills between decode steps, width switches in both directions, width 1, batch
size changes and requests joining and leaving.
"""

from __future__ import annotations

import random
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.managers import overlap_utils
from sglang.srt.managers.overlap_utils import FutureMap, resolve_forward_inputs
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.batch_result_processor import (
    _get_speculative_output_stride,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative import ngram_worker

from sglang_spec_ext.sglang.cpu.fallbacks import ops
from sglang_spec_ext.sglang.serving.spec_class import ModelFreeSpecAlgo
from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker

MAX_WIDTH = 6
MAX_BS = 8
POOL = 16
VOCAB = 60


# -- the stand-in target: a bigram model with one short cycle per band of ten tokens --
def target_next(token: int) -> int:
    band, offset = divmod(token, 10)
    cycle = 3 + band % 3
    return band * 10 + (offset + 1) % cycle


def greedy_output(prompt: list[int], n: int) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(n):
        last = target_next(last)
        out.append(last)
    return out


class StandInTarget:
    """Replaces the target model forward (needs a model): one-hot logits of the bigram."""

    model_runner = SimpleNamespace(watermark_state=None)

    def forward_batch_generation(self, batch, pp_proxy_tensors=None, is_verify=False):
        tokens = batch.input_ids if is_verify else torch.tensor([r.last_token for r in batch.reqs])
        nxt = torch.tensor([target_next(int(t)) for t in tokens.tolist()], dtype=torch.int64)
        logits = torch.nn.functional.one_hot(nxt, VOCAB).float()
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits),
            next_token_ids=nxt,
            can_run_cuda_graph=False,
        )


def stand_in_greedy_verify(verify_input, batch, logits_output, grammar_mask, **kw):
    """The host's greedy tree verify, for the stand-in target (argmax, walk the tree)."""
    bs, w = len(batch.reqs), verify_input.draft_token_num
    target = logits_output.next_token_logits.argmax(-1).view(bs, w)
    draft = verify_input.draft_token.view(bs, w)
    nxt, sib = verify_input.retrieve_next_token, verify_input.retrieve_next_sibling
    predict = torch.zeros(bs * w, dtype=torch.int32)
    accept_index = torch.full((bs, w), -1, dtype=torch.int32)
    accept_lens = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        path, node = [0], 0
        while True:
            child = int(nxt[b, node])
            while child != -1 and int(draft[b, child]) != int(target[b, node]):
                child = int(sib[b, child])
            if child == -1:
                break
            path.append(child)
            node = child
        for j, n in enumerate(path):
            predict[b * w + n] = target[b, n]
            accept_index[b, j] = b * w + n
        accept_lens[b] = len(path)
    return predict, accept_lens, accept_index


@pytest.fixture
def host_stand_ins(monkeypatch):
    monkeypatch.setattr(ngram_worker, "eagle_sample", stand_in_greedy_verify)
    monkeypatch.setattr(
        ngram_worker,
        "reconstruct_indices_from_tree_mask_func",
        ops.reconstruct_indices_from_tree_mask,
    )
    monkeypatch.setattr(
        ngram_worker,
        "assign_extend_cache_locs_func",
        lambda **kw: torch.zeros(kw["batch_size"] * kw["draft_token_num"], dtype=torch.int64),
    )
    for name in (
        "prepare_mamba_track_for_verify",
        "commit_mamba_states_after_verify",
        "move_accept_tokens_to_target_kvcache",
    ):
        monkeypatch.setattr(ngram_worker, name, lambda *a, **k: None)
    for k in list(__import__("os").environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    assert not overlap_utils._DEBUG_ASSERT


class ScriptedWidths:
    """Stands in for the controller's choice (the test picks the widths)."""

    def __init__(self, worker: AdaptiveSuffixWorker) -> None:
        self.next_width = MAX_WIDTH
        self.chosen: list[int] = []
        worker.controller.choose_k = self.choose_k

    def choose_k(self, bs, rids):
        self.chosen.append(self.next_width)
        return self.next_width - 1


def make_worker() -> AdaptiveSuffixWorker:
    w = object.__new__(AdaptiveSuffixWorker)  # __init__ needs the host's runtime context
    w.draft_token_num = w.speculative_num_draft_tokens = MAX_WIDTH
    w.enable_overlap = True
    w.device = "cpu"
    w.max_batch_size = MAX_BS
    w._target_worker = StandInTarget()
    w.model_runner = w._target_worker.model_runner
    w.token_to_kv_pool_allocator = None
    w._prev_decode_rids = set()
    w.grammar_tree_host = None
    w._init_drafter()
    # Steps without any draft stay on the host's NGRAM verify here: a plain decode step
    # (plain_step.py) runs the target's real DECODE forward, which the stand-in target
    # cannot; its relay under the host's real overlap loop is checked end to end
    # (tests/e2e/test_overlap_parity.py, tests/e2e/test_plain_steps.py).
    w._plain_steps = False
    w._init_preallocated_tensors()
    return w


def _batch(reqs, mode, pool_idx, seq_lens, spec_info=None):
    return SimpleNamespace(
        reqs=reqs,
        forward_mode=mode,
        req_pool_indices=pool_idx,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        spec_info=spec_info,
        input_ids=None,
        out_cache_loc=None,
        prefill_input_ids_cpu=None,
        mix_running_indices=None,
        enable_overlap=True,
        spec_algorithm=None,  # set by the loop
        has_grammar=False,
        return_logprob=False,
        grammar_needs_sync=lambda: False,
        req_to_token_pool=SimpleNamespace(req_to_token=None),  # stand-in KV slots only
    )


class OverlapLoop:
    """The host scheduler's overlap loop, reduced to what the relay depends on."""

    def __init__(self, worker: AdaptiveSuffixWorker) -> None:
        self.worker = worker
        self.algo = ModelFreeSpecAlgo("SUFFIX", None, supports_overlap=True)
        pool = SimpleNamespace(req_to_token=torch.zeros((POOL, 4096), dtype=torch.int32))
        self.future_map = FutureMap(torch.device("cpu"), self.algo, pool)
        self.sched = SimpleNamespace(spec_algorithm=self.algo, future_map=self.future_map)
        self.free_slots = list(range(1, POOL))
        self.running = None
        self.last = None  # (batch, result) launched but not processed yet
        self.limit: dict[str, int] = {}
        self.slot: dict[str, int] = {}
        self.all_reqs: list[Req] = []
        self.max_accept = 0

    # -- one scheduler iteration ---------------------------------------------
    def run(self, batch) -> None:
        batch.spec_algorithm = self.algo
        self.future_map.resolve_seq_lens_cpu(batch)
        resolve_forward_inputs(batch, self.future_map)
        fi = batch.req_pool_indices
        result = self.worker.forward_batch_generation(
            batch, on_publish=partial(self.future_map.publish, fi)
        )
        Scheduler._relay_forward_payload(self.sched, batch, fi, result)
        batch.input_ids = None
        batch.spec_info = result.next_draft_input
        batch.spec_info.future_indices = fi
        launched = (
            list(batch.reqs),
            batch.forward_mode.is_decode(),
            result.next_token_ids.clone(),
            result.accept_lens.clone(),
            result,
        )
        if self.last is not None:
            self.process(*self.last)
        self.last = launched

    def process(self, reqs, was_decode, next_ids, accept_lens, result) -> None:
        stride = _get_speculative_output_stride(result) if was_decode else 1
        n = accept_lens.tolist() if was_decode else [1] * len(reqs)
        self.max_accept = max([self.max_accept, *n])
        for i, req in enumerate(reqs):
            if self.finished(req):
                continue  # the overlap step after a request finished is discarded
            req.output_ids.extend(next_ids[i * stride : i * stride + n[i]].tolist())

    def finished(self, req: Req) -> bool:
        return len(req.output_ids) >= self.limit[req.rid]

    # -- what get_next_batch_to_run does --------------------------------------
    def prefill(self, prompts: dict[str, list[int]], max_new: int) -> None:
        self._filter()
        reqs = []
        for rid, prompt in prompts.items():
            req = Req(rid, "", prompt, SamplingParams(max_new_tokens=max_new))
            self.limit[rid] = max_new
            self.slot[rid] = self.free_slots.pop(0)
            reqs.append(req)
            self.all_reqs.append(req)
        idx = torch.tensor([self.slot[r.rid] for r in reqs], dtype=torch.int64)
        lens = torch.tensor([len(r.origin_input_ids) for r in reqs], dtype=torch.int64)
        batch = _batch(reqs, ForwardMode.EXTEND, idx, lens)
        batch.input_ids = torch.tensor([t for r in reqs for t in r.origin_input_ids])
        for r in reqs:
            r.last_token = r.origin_input_ids[-1]
        self.run(batch)
        batch.forward_mode = ForwardMode.DECODE
        if self.running is None or not self.running.reqs:
            self.running = batch  # the prefill batch becomes the running batch
        else:  # ScheduleBatch.merge_batch
            r = self.running
            r.spec_info.merge_batch(batch.spec_info)
            r.reqs = r.reqs + batch.reqs
            r.req_pool_indices = torch.cat([r.req_pool_indices, batch.req_pool_indices])
            r.seq_lens = torch.cat([r.seq_lens, batch.seq_lens])
            r.seq_lens_cpu = r.seq_lens.clone()

    def decode(self, width: int, widths: ScriptedWidths) -> None:
        self._filter()
        assert self.running is not None and self.running.reqs
        widths.next_width = width
        self.run(self.running)

    def _filter(self) -> None:
        r = self.running
        if r is None:
            return
        keep = [i for i, req in enumerate(r.reqs) if not self.finished(req)]
        if len(keep) == len(r.reqs):
            return
        for i, req in enumerate(r.reqs):
            if i not in keep:
                self.free_slots.append(self.slot[req.rid])
        keep_t = torch.tensor(keep, dtype=torch.int64)
        r.spec_info.filter_batch(new_indices=keep_t)
        r.reqs = [r.reqs[i] for i in keep]
        r.req_pool_indices = r.req_pool_indices[keep_t]
        r.seq_lens = r.seq_lens[keep_t]
        r.seq_lens_cpu = r.seq_lens.clone()

    def drain(self, widths: ScriptedWidths, width: int = MAX_WIDTH) -> None:
        while self.running is not None and any(not self.finished(r) for r in self.running.reqs):
            self.decode(width, widths)
        if self.last is not None:
            self.process(*self.last)
            self.last = None

    def check_lossless(self) -> None:
        assert self.all_reqs
        for req in self.all_reqs:
            n = self.limit[req.rid]
            assert len(req.output_ids) >= n, (req.rid, len(req.output_ids), n)
            got = list(req.output_ids[:n])
            assert got == greedy_output(req.origin_input_ids, n), req.rid


def _prompt(band: int, rng: random.Random, n: int = 12) -> list[int]:
    return [band * 10 + rng.randrange(10) for _ in range(n)]


def _setup():
    worker = make_worker()
    return worker, ScriptedWidths(worker), OverlapLoop(worker)


def test_prefill_after_a_width_switch_keeps_the_relay_shape(host_stand_ins):
    # A middle width (2 <= w < max), then a new request: the host's FutureMap.stash
    # must accept the prefill's relay (it is sized by the first stash, at max width).
    worker, widths, loop = _setup()
    rng = random.Random(0)
    loop.prefill({"a": _prompt(0, rng), "b": _prompt(1, rng)}, max_new=40)
    for w in (3, 3, 4):
        loop.decode(w, widths)
    loop.prefill({"c": _prompt(2, rng)}, max_new=30)
    for w in (2, MAX_WIDTH, 3):
        loop.decode(w, widths)
    loop.drain(widths)
    loop.check_lossless()
    assert {2, 3, 4, MAX_WIDTH} <= set(widths.chosen)


def test_width_one_then_a_fresh_running_batch_stays_lossless(host_stand_ins):
    # Width 1 (plain decoding through the verify path) right before a prefill batch
    # that becomes the running batch: its relay rows must be read at the right stride.
    worker, widths, loop = _setup()
    rng = random.Random(1)
    loop.prefill({"a": _prompt(0, rng)}, max_new=6)
    loop.drain(widths, width=1)
    assert widths.chosen and set(widths.chosen) == {1}
    loop.prefill({"b": _prompt(1, rng), "c": _prompt(2, rng), "d": _prompt(3, rng)}, max_new=24)
    for w in (1, 4, MAX_WIDTH, 1, 2):
        loop.decode(w, widths)
    loop.drain(widths, width=3)
    loop.check_lossless()


@pytest.mark.parametrize("seed", [2, 3])
def test_random_schedule_of_widths_joins_and_leaves_is_lossless(host_stand_ins, seed):
    worker, widths, loop = _setup()
    rng = random.Random(seed)
    n_req = 0
    for _ in range(60):
        live = (
            [] if loop.running is None else [r for r in loop.running.reqs if not loop.finished(r)]
        )
        if len(live) < MAX_BS - 2 and (not live or rng.random() < 0.2):
            k = rng.randint(1, 3)
            prompts = {f"r{n_req + i}": _prompt((n_req + i) % 6, rng) for i in range(k)}
            n_req += k
            loop.prefill(prompts, max_new=rng.randint(3, 30))
        else:
            loop.decode(rng.randint(1, MAX_WIDTH), widths)
    loop.drain(widths, width=rng.randint(1, MAX_WIDTH))
    loop.check_lossless()
    assert n_req >= 6 and len(set(widths.chosen)) == MAX_WIDTH
    assert loop.max_accept == MAX_WIDTH  # drafts were accepted (the bigram cycles repeat)
    assert worker.drafter_stats()["sessions"] <= MAX_BS


class FaultyCalls:
    """Wraps drafter methods so that every ``every``-th call raises (before or after it ran)."""

    ERRORS = (RuntimeError, MemoryError, IndexError)

    def __init__(self, drafter, names, every: int) -> None:
        self.calls = 0
        self.raised = 0
        for name in names:
            setattr(drafter, name, self._wrap(getattr(drafter, name)))
        self.every = every

    def _wrap(self, fn):
        def call(*args, **kwargs):
            self.calls += 1
            after = self.calls % 2 == 0
            if self.calls % self.every == 0 and not after:
                self._raise()
            out = fn(*args, **kwargs)
            if self.calls % self.every == 0:
                self._raise()
            return out

        return call

    def _raise(self):
        self.raised += 1
        raise self.ERRORS[self.raised % 3](f"injected drafter fault {self.raised}")


def test_drafter_faults_under_overlap_stay_lossless(host_stand_ins):
    worker, widths, loop = _setup()
    faults = FaultyCalls(
        worker.drafter,
        ("start_request", "extend_request", "speculate_batch", "speculate", "finish_request"),
        every=5,
    )
    rng = random.Random(4)
    for i in range(4):
        loop.prefill({f"f{i}a": _prompt(i, rng), f"f{i}b": _prompt(i + 1, rng)}, max_new=20)
        for _ in range(4):
            loop.decode(rng.randint(1, MAX_WIDTH), widths)
    loop.drain(widths)
    loop.check_lossless()
    stats = worker.drafter_stats()
    # (a failed batched speculate is retried per request: not every raise is a fault)
    assert faults.raised >= 5 and stats["draft_faults"] >= faults.raised // 2
    assert loop.max_accept >= 3  # drafting still works between the faults
