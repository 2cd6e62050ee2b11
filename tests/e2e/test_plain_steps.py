"""Zero draft steps as plain decode steps on the GPU default path's emulation.

One STANDALONE server (the tiny model, a 1-layer draft, chains of 2) with the CPU
engine's overlap scheduling and graph runners both on (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``,
``SGLANG_SPEC_EXT_CPU_GRAPHS=1``, graphs captured for batch size 4 only), our
controller with batch sizes 4 and up pinned at zero draft steps and the draft-KV
repair on. Requests of different lengths arrive together, so the batch shrinks
through every kind of step: 5-6 requests at zero steps run eagerly, i.e. as plain
decode steps (``sglang/workers/plain_step.py``) whose results go through the overlap relay;
4 requests at zero steps replay the width-1 verify graph (the host's path, counted as
``host_graph``); 1-3 requests draft again (pinned at 2 steps), padded into the graphs, after the repair
rebuilt the draft KV that zero steps and deferred prefills left unwritten. Greedy
output must equal plain serving's; a streamed request aborted mid-generation leaves the
server serving correctly; sampled requests at zero steps finish. (This is also the
STANDALONE case of the overlap tests: ``test_overlap_parity.py`` serves EAGLE3, the same
V2 worker and relay.)
SUFFIX's plain steps (no draft for any request of a batch) are checked on its own
servers: random-token prompts in ``test_suffix_serving.py`` (eager), the overlap
relay in ``test_overlap_parity.py``.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE
from sglang_spec_ext.sglang.model_drafts.kv_repair_marks import STATS_LOG_MARK as REPAIR_MARK
from tests.e2e.spec_metrics import plain_step_counts
from tests.e2e.test_suffix_serving import PROMPTS
from tests.harness.server import abort_mid_stream

#: Chains of 2 (three step counts, each with its graphs, keep the start-up short).
CHAIN2 = ("--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "3")  # fmt: skip
ENV = {
    "SGLANG_SPEC_EXT_CPU_OVERLAP": "1",
    "SGLANG_SPEC_EXT_CPU_GRAPHS": "1",
    "SGLANG_SPEC_EXT_ADAPTIVE": "1",
    "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,2,4",
    # Batch sizes 1-3 pinned at 2 steps: left to the controller, cheap plain steps can make
    # it choose zero there too, and then no request drafts again and nothing is repaired.
    "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "2,2,0",
    "SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1",
    "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0",
}


@pytest.fixture(scope="module")
def server(tiny_model_dir, weak_draft_dir, start_module_server):
    return start_module_server(
        tiny_model_dir, "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(weak_draft_dir), *CHAIN2,
        "--cuda-graph-bs-decode", "4", env=ENV,
    )  # fmt: skip


def _greedy(server, ids: list[int], n: int) -> list[int]:
    out = server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)
    return out["output_ids"]


def _counters(log: str, mark: str) -> dict[str, int]:
    lines = [ln.split(mark, 1)[1] for ln in log.splitlines() if mark in ln]
    assert lines, f"no '{mark}' line in the server log"
    return {k: int(v) for k, v in (kv.split("=") for kv in lines[-1].split())}


def test_zero_steps_under_overlap_and_graphs_keep_greedy_parity(server, tiny_baseline_server, tok):
    prompts = [tok(text)["input_ids"] for _, text, _ in PROMPTS[:6]]
    lengths = [40, 34, 28, 22, 16, 10]  # the batch shrinks 6 -> 1 step by step
    want = [_greedy(tiny_baseline_server, ids, n) for ids, n in zip(prompts, lengths, strict=True)]
    for _ in range(2):  # the second wave prefills while the first one's tail decodes
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda a: _greedy(server, *a), zip(prompts, lengths, strict=True)))
        assert got == want
    log = server.log_path.read_text(errors="replace")
    plain = plain_step_counts(log)
    repair = _counters(log, REPAIR_MARK)
    print(f"\nplain-step counters: {plain}; draft-KV repair: {repair}")
    assert plain["plain"] >= 1, "no zero step ran as a plain decode step"
    assert plain.get("host_graph", 0) >= 1, "no zero step replayed the width-1 verify graph"
    assert repair["requests"] >= 1 and repair["failures"] == 0, repair
    assert LOOP_MESSAGE in log  # the overlap loop really ran


def test_abort_under_overlap_leaves_the_server_serving(server, tiny_baseline_server, tok):
    ids = tok(PROMPTS[0][1] * 2)["input_ids"]
    last = abort_mid_stream(server, ids, 2000)
    assert last["finish_reason"]["type"] == "abort", last["finish_reason"]
    assert server.healthy()
    assert _greedy(server, ids, 16) == _greedy(tiny_baseline_server, ids, 16)


def test_sampled_request_at_zero_steps_finishes(server, tok, tiny_baseline_server):
    prompts = [tok(text)["input_ids"] for _, text, _ in PROMPTS[:5]]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda ids: server.generate(
            input_ids=ids, max_new_tokens=16, temperature=1.0, ignore_eos=True), prompts))  # fmt: skip
    vocab = tok.vocab_size
    for out in outs:
        assert out["meta_info"]["completion_tokens"] == 16
        assert all(0 <= t < vocab for t in out["output_ids"])
    assert server.healthy()
