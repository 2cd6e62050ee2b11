"""DP attention's token-count exchange (``workers/dp_tokens.py``) on two gloo ranks, and
what the host's forward makes of it (its real ``ForwardBatch.init_mlp_sync_metadata``).

Each rank passes what its own forward runs: a verify rank its requests times its width, an
idle rank or a prefilling rank ``None`` (the scheduler's gathered count is already in
tokens for them). Both ranks must come out with the same per-rank list, in DP-rank order,
and the host must take it as is: without the exchange the host scales every rank's
scheduler count by this rank's verify width (an idle rank by nothing), and the ranks'
lists disagree, which the gathered MLP cannot survive.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.harness.tp_ranks import rank_context

#: (rank 0's batch, rank 1's batch): scheduler counts (what the host gathered before the
#: step: requests for a decode batch, tokens for a prefill), this rank's forward tokens.
CASES = {
    "verify beside idle": (([3, 0], 3 * 8), ([3, 0], None)),
    "prefill beside verify": (([17, 2], None), ([17, 2], 2 * 4)),
    "two widths": (([3, 2], 3 * 8), ([3, 2], 2 * 4)),
}
WANT = {
    "verify beside idle": [24, 0],
    "prefill beside verify": [17, 8],
    "two widths": [24, 8],
}


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_spec_ext.sglang.workers.dp_tokens import DpTokenCounts

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    group = dist.new_group([0, 1], backend="gloo")
    out = {}
    for name, batches in CASES.items():
        counts, tokens = batches[rank]
        batch = SimpleNamespace(global_num_tokens=list(counts),
                                global_num_tokens_for_logprob=list(counts),
                                dp_spec_prefill_coordination_applied=False,
                                draft_global_num_tokens=None,
                                can_run_decode_cuda_graph=False,
                                can_run_dp_draft_cuda_graph=False)  # fmt: skip
        DpTokenCounts(group, world=2, stride=1, dp_rank=rank).apply(batch, tokens)
        # the host's own reading of the batch, with a verify input of width 8 present
        fb = SimpleNamespace(
            spec_info=SimpleNamespace(num_tokens_per_req=8, num_tokens_for_logprob_per_req=8)
        )
        ForwardBatch.init_mlp_sync_metadata(fb, batch, torch.device("cpu"))
        out[name] = {"exchanged": batch.global_num_tokens,
                     "logprob": batch.global_num_tokens_for_logprob,
                     "host": list(fb.global_num_tokens_cpu),
                     "applied": batch.dp_spec_prefill_coordination_applied}  # fmt: skip
    # attention TP 2, one DP rank: both ranks are the same DP rank; the first rank's kept
    batch = SimpleNamespace(global_num_tokens=[5], global_num_tokens_for_logprob=[5])
    DpTokenCounts(group, world=2, stride=2, dp_rank=0).apply(batch, 5 * 4)
    out["one DP rank"] = batch.global_num_tokens
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def test_ranks_agree_on_real_token_counts_and_the_host_keeps_them(tmp_path):
    ctx = rank_context()
    store = str(tmp_path / "store")
    procs = [ctx.Process(target=_rank_main, args=(r, store, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for name, want in WANT.items():
        for rank in (0, 1):
            seen = got[rank][name]
            assert seen["exchanged"] == want, (name, rank, seen)
            assert seen["logprob"] == want, (name, rank, seen)
            assert seen["host"] == want, (name, rank, seen)  # not rescaled by the host
            assert seen["applied"] is True
    assert got[0]["one DP rank"] == got[1]["one DP rank"] == [20]


def test_the_host_rescales_without_the_exchange():
    """The failure the exchange prevents, on the host's own code: a batch whose scheduler
    counts are requests ([3, 0]) read by a rank with a width-8 verify input comes out as
    [24, 0], and by the idle rank (no verify input) as [3, 0]: two ranks, two lists."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    def host_counts(spec_info) -> list[int]:
        batch = SimpleNamespace(global_num_tokens=[3, 0], global_num_tokens_for_logprob=[3, 0],
                                dp_spec_prefill_coordination_applied=False,
                                draft_global_num_tokens=None, can_run_decode_cuda_graph=False,
                                can_run_dp_draft_cuda_graph=False)  # fmt: skip
        fb = SimpleNamespace(spec_info=spec_info)
        ForwardBatch.init_mlp_sync_metadata(fb, batch, torch.device("cpu"))
        return list(fb.global_num_tokens_cpu)

    verify = SimpleNamespace(num_tokens_per_req=8, num_tokens_for_logprob_per_req=8)
    assert host_counts(verify) == [24, 0]
    assert host_counts(None) == [3, 0]
