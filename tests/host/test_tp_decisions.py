"""Two TP ranks on gloo: every decision a rank could take from local state is the first
rank's, and a fault on one rank never skips a collective on that rank only.

Each test starts two processes (tests/harness/tp_ranks.py) that join a gloo process
group (the kind the host's TP group uses for its ``cpu_group``; a plain gloo group
stands in for the host's ``GroupCoordinator``, whose distributed runtime needs the
server) with a short collective timeout, so a rank left waiting in a collective its
partner skipped fails the test with an error instead of hanging it. Covered:

* the model-draft controller (``GoodputStepPolicy``, attached by the real ``attach``
  to the host's real ``adaptive_runtime_state.AdaptiveController`` over a stand-in
  worker: the real EAGLE worker builds its states from GPU model runners), each rank
  with its own clock: without TP the ranks choose different step counts, with it both
  run the first rank's;
* HYBRID's choice and suffix rows when one rank's suffix drafting raises, and a wide
  step's width and rows (hybrid_wide.py);
* SUFFIX drafts when the first rank's drafting raises (every rank plain-decodes the step),
  and whether a step has no draft at all (a plain decode step), the draft gate's
  verify-or-plain call included: the first rank's call;
* the draft-KV repair when one rank cannot prepare it (no rank runs the forward);
* grammar-shaped SUFFIX drafts (ragged lengths on) when the ranks' shaping disagrees
  (one rank's matcher a token behind) or fails on one rank: the drafts and verify
  lengths are the first rank's.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from tests.harness.tp_ranks import rank_context

STEPS = 240
BATCH_SIZES = [1, 2, 4, 8]
COLLECTIVE_TIMEOUT_S = 20


def _run_two_ranks(target: Callable[..., dict], tmp_path: Path) -> tuple[dict, dict]:
    ctx = rank_context()  # forks from a preloaded forkserver
    procs = [ctx.Process(target=_rank_entry, args=(target, r, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():
            p.kill()
    results = []
    for r in range(2):
        out = tmp_path / f"rank{r}.json"
        assert out.exists(), f"rank {r} wrote no result (exit code {procs[r].exitcode})"
        results.append(json.loads(out.read_text()))
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results[0], results[1]


def _rank_entry(target: Callable[..., dict], rank: int, out_dir: str) -> None:
    import torch.distributed as dist

    from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders

    cpu_placeholders.install()
    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            del os.environ[k]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out_dir}/store",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    group = dist.new_group([0, 1], backend="gloo")
    try:
        result = target(rank, group)
    except Exception:  # a collective timeout or a wrong result: reported, not hung
        result = {"error": traceback.format_exc()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


# -- the model-draft controller -------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _step_time(rank: int, steps: int, bs: int) -> float:
    # Rank 1's draft steps look far dearer than rank 0's, as on a slower or busier GPU.
    per_step = 2e-4 if rank == 0 else 2e-2
    return 1e-2 + per_step * steps * bs


def _controller_rank(rank: int, group) -> dict:
    from sglang.srt.runtime_context import get_parallel

    from sglang_spec_ext.sglang.model_drafts import adaptive as mda
    from tests.host.test_model_draft_adaptive import StandInWorker

    os.environ["SGLANG_SPEC_EXT_ADAPTIVE"] = "1"
    result = {}
    for tp_size in (1, 2):
        tp_group = SimpleNamespace(cpu_group=group, ranks=[0, 1])
        with get_parallel().override(tp_size=tp_size, tp_group=tp_group):
            worker = StandInWorker(steps=3)
            policy = mda.attach(worker)
        clock = _Clock()
        policy._clock = clock
        host = worker.adaptive_controller
        host.init_states()
        chosen = []
        for step in range(STEPS):
            bs = BATCH_SIZES[(step // 20) % len(BATCH_SIZES)]
            host.activate_step_by_batch(bs)
            steps = worker.speculative_num_steps
            chosen.append(steps)
            clock.t += _step_time(rank, steps, bs)
            host.on_verify_complete([min(steps, 2)] * bs, bs)  # the same text on every rank
        result[f"tp{tp_size}"] = chosen
    return result


def test_model_draft_controller_runs_the_first_ranks_step_counts(tmp_path):
    r0, r1 = _run_two_ranks(_controller_rank, tmp_path)
    assert r0["tp1"] != r1["tp1"], "the clocks did not make the ranks disagree on their own"
    assert len(set(r0["tp1"])) > 1  # the controller really switched step counts
    assert r0["tp2"] == r1["tp2"]
    assert r0["tp2"] == r0["tp1"]  # rank 0 decides, as it would alone


# -- HYBRID: a suffix-drafting fault on one rank ---------------------------------------
def _hybrid_rank(rank: int, group, wide: bool = False) -> dict:
    import numpy as np

    from sglang_spec_ext.hybrid.choice import HybridState
    from sglang_spec_ext.sglang.workers.hybrid_worker import HybridMixin
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync

    bs, width, pack = 2, 4, 16
    spliced: list = []

    class Worker(HybridMixin):
        speculative_num_draft_tokens = width
        topk = 1

        def _decide(self, batch, verify_input, drafts, committed):
            if rank == 1:
                raise IndexError("injected: rank 1's suffix drafter fails")
            tokens = np.arange(bs * pack, dtype=np.int64).reshape(bs, pack) + 100
            masks = np.ones((bs, pack, pack), dtype=bool)
            # request 0's suffix draft: 9 nodes in a wide step, else 3 (the model's width)
            lens = np.array([9 if wide else width - 1, width - 1])
            return np.array([1, 0]), tokens, masks, lens

        def _splice(self, batch, vi, rows, tokens, masks):
            spliced.append(["narrow", rows, tokens[rows].tolist(), list(masks.shape)])

        def _widen(self, batch, vi, tokens, masks):
            spliced.append(["wide", tokens.tolist(), list(masks.shape)])
            return vi

        def _maybe_log_stats(self):
            return None

    w = object.__new__(Worker)
    w._init_wide(pack, 0.1)
    w._wide_resolved = True
    w.hybrid = HybridState("learned")
    w._suffix = SimpleNamespace(_maybe_log_stats=lambda: None)
    w._rids, w._choice, w._hybrid_faults = set(), [], 0
    w._tp = TpSync(group, src=0)
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    choices, steps = [], []
    for _ in range(3):
        w._choose_and_splice(batch, SimpleNamespace(topk=1), ([None, None], [0, 0]))
        choices.append(list(w._choice))
        steps.append(w._step_width)
    return {"spliced": spliced, "choices": choices, "faults": w._hybrid_faults, "steps": steps}


def _hybrid_wide_rank(rank: int, group) -> dict:
    return _hybrid_rank(rank, group, wide=True)


def test_hybrid_fault_on_one_rank_keeps_the_broadcast_and_the_first_ranks_rows(tmp_path):
    r0, r1 = _run_two_ranks(_hybrid_rank, tmp_path)
    assert (r0["faults"], r1["faults"]) == (0, 3)
    assert r0["spliced"] == r1["spliced"] and len(r0["spliced"]) == 3
    assert all(s[0] == "narrow" and s[3] == [2, 4, 4] for s in r0["spliced"])
    assert r0["choices"] == r1["choices"] == [["suffix", "model"]] * 3


def test_hybrid_wide_step_width_and_rows_are_the_first_ranks(tmp_path):
    """Rank 0 goes wide (a 9-node suffix draft: width 10); rank 1, whose drafting failed,
    widens to the same width with rank 0's rows (each row, the model's too)."""
    r0, r1 = _run_two_ranks(_hybrid_wide_rank, tmp_path)
    assert (r0["faults"], r1["faults"]) == (0, 3)
    assert r0["spliced"] == r1["spliced"] and len(r0["spliced"]) == 3
    assert all(s[0] == "wide" and s[2] == [2, 10, 10] for s in r0["spliced"])
    assert r0["steps"] == r1["steps"] == [10, 10, 10]
    assert r0["choices"] == r1["choices"] == [["suffix", "model"]] * 3


# -- SUFFIX: the first rank cannot draft ----------------------------------------------
class _SuffixBatch:
    """What SUFFIX's draft preparation reads of a decode batch."""

    spec_info = None

    def __init__(self, reqs):
        self.reqs = reqs

    def grammar_needs_sync(self):
        return False


def _suffix_reqs(prefix: str, n: int) -> list[SimpleNamespace]:
    """``n`` requests on a repeating prompt (the suffix trees draft for them)."""
    return [SimpleNamespace(rid=f"{prefix}{i}", origin_input_ids_unpadded=[5, 6, 7, 5, 6, 7, 5, 6],
                            output_ids=[7, 5, 6 + i]) for i in range(n)]  # fmt: skip


def _suffix_rank(rank: int, group) -> dict:
    from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync

    Batch = _SuffixBatch
    reqs = _suffix_reqs("r", 2)

    def worker() -> SuffixWorker:
        w = object.__new__(SuffixWorker)
        w.draft_token_num = 4
        w.enable_overlap = False
        w._init_drafter()
        w._tp_sync = TpSync(group, src=0)
        return w

    os.environ["SGLANG_SPEC_EXT_DRAFT_GATE"] = "0"  # the gate's part is below
    w = worker()
    out = {}
    real_local = w._local_drafts
    for failing in (1, 0):  # first rank 1's drafting fails, then rank 0's

        def local(batch, real=real_local, failing=failing):
            if rank == failing:
                raise RuntimeError(f"injected: rank {failing} cannot draft")
            return real(batch)

        w._local_drafts = local
        tokens, mask = w._prepare_draft_tokens(Batch(reqs))
        out[f"rank{failing}_fails"] = [tokens.tolist(), mask.astype(int).tolist()]
        out[f"rank{failing}_fails_empty"] = w._step_empty

    # Rank 1's drafter finds nothing, rank 0's does: whether the step runs as a plain
    # decode step (no draft for any request) is rank 0's call on every rank.
    def nothing_on_rank1(batch, real=real_local):
        if rank == 1:
            return w._root_only_drafts(batch)
        return real(batch)

    w._local_drafts = nothing_on_rank1
    tokens, _mask = w._prepare_draft_tokens(Batch(reqs))
    out["rank1_empty"] = [tokens.tolist(), w._step_empty]
    del w._local_drafts
    tokens, mask = w._local_drafts(Batch(reqs))
    out["own"] = [tokens.tolist(), mask.astype(int).tolist()]
    out["faults"] = dict(w._faults)

    # The draft gate (suffix/gate.py) decides on each rank from that rank's own measured
    # verify cost; here one rank prices the verify at 0 (verify) and the other at 100
    # (plain). Every rank runs the first rank's call.
    os.environ["SGLANG_SPEC_EXT_DRAFT_GATE"] = "1"
    for verify_rank in (0, 1):
        os.environ["SGLANG_SPEC_EXT_DRAFT_GATE_COST"] = "0" if rank == verify_rank else "100"
        g = worker()
        tokens, _mask = g._prepare_draft_tokens(Batch(reqs))
        out[f"gate_verifies_on_rank{verify_rank}"] = [tokens.tolist(), g._step_empty]
        out[f"gate_stats_rank{verify_rank}_verifies"] = g._gate.stats()
    return out


def test_suffix_fault_on_either_rank_never_skips_the_broadcast(tmp_path):
    r0, r1 = _run_two_ranks(_suffix_rank, tmp_path)
    # rank 1 failed: both verify rank 0's drafts
    assert r0["rank1_fails"] == r1["rank1_fails"]
    assert r0["rank1_fails"][0] == r0["own"][0]
    # rank 0 failed: both plain-decode the step (roots only, padding drafts)
    assert r0["rank0_fails"] == r1["rank0_fails"]
    tokens = r0["rank0_fails"][0]
    width = 4
    assert (tokens[0], tokens[width]) == (6, 7)  # roots: the last committed tokens
    assert r0["own"][0][1:width] != [0] * (width - 1)  # the real drafts were not empty
    assert tokens[1:width] == [0] * (width - 1)
    assert r0["faults"] == {"prepare": 1, "tp-source": 1}
    assert r1["faults"] == {"prepare": 1, "tp-source": 1}
    # the plain-step decision (plain_step.py) is the first rank's on both ranks
    assert r0["rank1_fails_empty"] is r1["rank1_fails_empty"] is False
    assert r0["rank0_fails_empty"] is r1["rank0_fails_empty"] is True
    assert r0["rank1_empty"] == r1["rank1_empty"] == [r0["own"][0], False]
    # the draft gate: each rank decided locally (its own counters), rank 0's call ran
    assert r0["gate_verifies_on_rank0"] == r1["gate_verifies_on_rank0"] == [r0["own"][0], False]
    assert r0["gate_stats_rank0_verifies"]["gate_steps_verified"] == 1
    assert r1["gate_stats_rank0_verifies"]["gate_steps_plain"] == 1
    assert r0["gate_verifies_on_rank1"] == r1["gate_verifies_on_rank1"]
    assert r0["gate_verifies_on_rank1"][1] is True  # plain on both ranks
    assert r0["gate_verifies_on_rank1"][0] == tokens  # roots only, as a plain step


# -- grammar-shaped drafts: the ranks' shaping disagrees -----------------------------
def _suffix_grammar_rank(rank: int, group) -> dict:
    """Each rank shapes its requests' drafts with its own grammar matcher (the host
    advances each rank's FSM itself: ``grammar_barrier`` per scheduler). Stand-ins for
    the shaping (``GrammarDrafts``; its real xgrammar work is tests/unit/
    test_grammar_shaping.py and tests/e2e/test_grammar_drafts.py): rank 0 drafts a
    forced closing string after each suffix draft; rank 1, whose matcher is a token
    behind, cuts every draft to nothing, then its shaping raises."""
    from sglang_spec_ext.sglang.verify.ragged import RaggedVerify
    from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync
    from sglang_spec_ext.suffix.draft import DraftTree

    class Batch(_SuffixBatch):
        has_grammar = True

    reqs = _suffix_reqs("g", 3)
    os.environ["SGLANG_SPEC_EXT_DRAFT_GATE"] = "0"
    w = object.__new__(SuffixWorker)
    w.draft_token_num = 8
    w.enable_overlap = False
    w._init_drafter()
    w._tp_sync = TpSync(group, src=0)
    w._ragged = RaggedVerify()
    forced = [90, 91]  # e.g. '"}' then the stop token: what the grammar admits alone

    def shape_rank0(reqs, trees, slots, matchers, prevs):
        out = []
        for tree in trees:  # the first slots - 2 nodes (a tree), the forced pair below
            n = min(len(tree.tokens), slots - 2)
            tokens = list(tree.tokens[:n]) + forced
            parents = list(tree.parents[:n]) + [n - 1, n]
            probs = list(tree.probs[:n]) + [1.0, 1.0]
            out.append(DraftTree(tokens, parents, probs, sum(probs), tree.match_len))
        return out

    def shape_rank1_stale(reqs, trees, slots, matchers, prevs):
        return [DraftTree() for _ in trees]

    def shape_rank1_raises(reqs, trees, slots, matchers, prevs):
        raise RuntimeError("injected: rank 1's grammar matcher failed")

    w._grammar.matcher_of = lambda req, prev=(): object()  # every request has a grammar
    out = {}
    for case, rank1 in (("stale", shape_rank1_stale), ("raises", shape_rank1_raises)):
        w._grammar.shape_batch = shape_rank0 if rank == 0 else rank1
        tokens, mask = w._prepare_draft_tokens(Batch(reqs))
        lens = w._ragged.pending_lens(len(reqs), w.draft_token_num).tolist()
        out[case] = [tokens.tolist(), mask.astype(int).tolist(), lens, w._step_empty]
    w._grammar.shape_batch = shape_rank0
    w._tp_sync = None  # what this rank would have verified alone
    tokens, mask = w._prepare_draft_tokens(Batch(reqs))
    out["own"] = [tokens.tolist(), w._ragged.pending_lens(len(reqs), 8).tolist()]
    out["faults"] = dict(w._faults)
    return out


def test_grammar_shaped_drafts_and_lengths_are_the_first_ranks(tmp_path):
    r0, r1 = _run_two_ranks(_suffix_grammar_rank, tmp_path)
    for case in ("stale", "raises"):
        assert r0[case] == r1[case], case
        tokens, _mask, lens, empty = r0[case]
        assert tokens == r0["own"][0] and lens == r0["own"][1] and empty is False
    tokens, lens = r0["own"]
    assert all(n >= 3 for n in lens)  # root (+ suffix draft) + the forced string
    for i in range(3):  # each request's row ends in the forced string
        row = tokens[8 * i : 8 * i + lens[i]]
        assert row[-2:] == [90, 91], row
    assert r1["faults"].get("prepare") == 1 and not r0["faults"].get("prepare")


# -- the draft-KV repair: one rank cannot prepare it ----------------------------------
def _repair_rank(rank: int, group) -> dict:
    from sglang_spec_ext.sglang.model_drafts import kv_repair as dkr
    from sglang_spec_ext.sglang.model_drafts import kv_repair_forward as rebuild
    from sglang_spec_ext.sglang.model_drafts import kv_repair_marks as marks
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync

    marks.STATS = marks.RepairStats()
    dkr._SYNC[:] = [TpSync(group, src=0)]
    ran = []

    def prepare(draft_worker, batch, stale):
        if rank == 1 and len(ran) == 1:
            raise RuntimeError("injected: rank 1 cannot build the extend batch")
        return lambda: ran.append(len(ran))

    rebuild.prepare_repair = prepare
    draft_worker = SimpleNamespace(
        speculative_algorithm=SimpleNamespace(is_standalone=lambda: True)
    )
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        reqs=[SimpleNamespace(**{marks.STALE_ATTR: 3})],
    )
    enabled = []
    for _ in range(3):
        dkr._repair_before_draft(draft_worker, batch)
        enabled.append(marks.STATS.enabled)
    return {"ran": len(ran), "enabled": enabled}


def test_repair_runs_on_every_rank_or_on_none(tmp_path):
    r0, r1 = _run_two_ranks(_repair_rank, tmp_path)
    # step 1: both repair; step 2: rank 1 cannot prepare, so neither runs its forward
    # and both switch the repair off; step 3: off on both
    assert r0 == r1 == {"ran": 1, "enabled": [True, False, False]}


def test_all_ok_is_true_only_if_every_rank_is(tmp_path):
    r0, r1 = _run_two_ranks(_all_ok_rank, tmp_path)
    assert r0 == r1 == {"agreed": [True, False, False, False]}


def _all_ok_rank(rank: int, group) -> dict:
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync

    sync = TpSync(group, src=0)
    cases = [(True, True), (True, False), (False, True), (False, False)]
    return {"agreed": [sync.all_ok(ok[rank]) for ok in cases]}
