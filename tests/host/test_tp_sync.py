"""Adaptive width with tensor parallelism: every rank verifies at the same width (and the
same drafts, at the same ragged verify lengths).

Two processes on CPU join a gloo process group (the kind the host's TP group uses
for its ``cpu_group``); each runs the real adaptive SUFFIX worker's width choice
(``AdaptiveSuffixWorker._choose_width``: its real controller, then the TP sync),
with its controller fed DIFFERENT step times, as two GPUs' wall clocks would be.
Without the sync the ranks choose different widths (checked, so the test can
fail); with it they choose rank 0's widths at every step. The host's own
GroupCoordinator needs its distributed runtime; a plain gloo group stands in for
its ``cpu_group``, which is all the sync uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.harness.tp_ranks import rank_context

MAX_WIDTH = 8
STEPS = 80
BATCH_SIZES = [1, 1, 2, 4, 4, 4, 8, 8, 2, 1] * 8


def _step_time(rank: int, width: int, bs: int) -> float:
    # Rank 1's verify looks far more expensive per token than rank 0's.
    per_token = 2e-5 if rank == 0 else 4e-3
    return 1e-3 + per_token * width * bs


class _Req:
    def __init__(self, rid: str, prompt: list[int], out: list[int]) -> None:
        self.rid, self.origin_input_ids_unpadded, self.output_ids = rid, prompt, out


class _Batch:
    """The two fields of a host ScheduleBatch the draft path reads (sync mode)."""

    def __init__(self, reqs: list) -> None:
        self.reqs, self.spec_info = reqs, None

    def grammar_needs_sync(self) -> bool:
        return False


_REQS = [_Req(f"r{i}", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [7, 8, 5]) for i in range(3)]


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders

    cpu_placeholders.install()
    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            del os.environ[k]
    from sglang_spec_ext.sglang.workers.adaptive_worker import AdaptiveSuffixWorker
    from sglang_spec_ext.sglang.workers.tp_sync import TpSync

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    cpu_group = dist.new_group([0, 1], backend="gloo")
    result = {}
    for synced in (False, True):
        w = object.__new__(AdaptiveSuffixWorker)  # __init__ needs the host's runtime context
        w.draft_token_num = MAX_WIDTH
        w._init_drafter()
        if synced:
            w._tp_sync = TpSync(cpu_group, src=0)
        widths = []
        for step in range(STEPS):
            bs = BATCH_SIZES[step]
            rids = [f"r{i}" for i in range(bs)]
            width = w._choose_width(bs, rids)
            widths.append(width)
            accepted = [min(width - 1, 3)] * bs  # the same text on every rank
            w.controller.on_verify(bs, width - 1, accepted, _step_time(rank, width, bs), rids)
        result["synced" if synced else "own"] = widths
    # Drafts: a fault absorbed on rank 1 only (its drafter fails for request "r1"),
    # so without the sync rank 1 would verify different tokens for that request.
    from sglang_spec_ext.sglang.verify.ragged import RaggedVerify
    from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker

    for synced in (False, True):
        w = object.__new__(SuffixWorker)
        w.draft_token_num = MAX_WIDTH
        w.enable_overlap = False
        w._init_drafter()
        w._ragged = RaggedVerify()  # ragged verify: the lengths travel with the drafts
        if synced:
            w._tp_sync = TpSync(cpu_group, src=0)
        if rank == 1:
            real = w.drafter.speculate

            def failing(rid, n, real=real):
                if rid == "r1":
                    raise RuntimeError("injected on rank 1")
                return real(rid, n)

            w.drafter.speculate = failing
            w.drafter.speculate_batch = lambda rids, n: [failing(r, n) for r in rids]
        drafts = []
        for _ in range(3):
            tokens, mask = w._prepare_draft_tokens(_Batch(_REQS))
            lens = w._ragged.pending_lens(len(_REQS), MAX_WIDTH).tolist()
            drafts.append([tokens.tolist(), mask.astype(int).tolist(), lens])
        result["drafts_synced" if synced else "drafts_own"] = drafts
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def test_ranks_with_different_clocks_choose_the_same_widths(tmp_path):
    ctx = rank_context()  # forks from a preloaded forkserver
    procs = [
        ctx.Process(target=_rank_main, args=(r, str(tmp_path / "store"), str(tmp_path)))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["own"] != r1["own"], "the step times did not make the ranks disagree"
    assert len(set(r0["own"])) > 1  # the controller really switched widths
    assert r0["synced"] == r1["synced"]
    assert r0["synced"] == r0["own"]  # rank 0 decides, as it would alone
    # Drafts: the rank-local fault makes rank 1 draft differently on its own ...
    assert r0["drafts_own"] != r1["drafts_own"]
    # ... and with the sync both verify rank 0's drafts.
    assert r0["drafts_synced"] == r1["drafts_synced"] == r0["drafts_own"]
    # The ragged verify lengths (each step's last entry, compared above with the rest)
    # came with them: rank 1's own were shorter for "r1", whose draft it dropped.
    assert [d[2] for d in r0["drafts_own"]] != [d[2] for d in r1["drafts_own"]]
