"""Ragged verify (``sglang/verify/ragged.py``) served on the CPU engine: SUFFIX at width 16.

Each request's verify forward covers its own draft; the rest of the host's verify keeps
its padded layout. Served eagerly, under overlap scheduling, and under the CUDA-graph
emulation, where the verify graphs are keyed by the batch's total verify tokens (token
buckets, ``verify/ragged_graphs.py``): a ragged step replays the smallest bucket that
holds it (its stats count such steps), or with ``SGLANG_SPEC_EXT_RAGGED_GRAPHS=0`` runs
its verify forward eagerly. Every server must give plain serving's greedy output token
for token with concurrent requests, and its drafter-stats line must show ragged steps
that put fewer tokens through the target than the padded verify would have. The same
server with ``SGLANG_SPEC_EXT_RAGGED_VERIFY=0`` verifies every token of its width. One
server runs the draft gate's per-request lengths (each draft cut to the nodes worth their
verify cost) on the GPU default path's emulation. Two serve chain drafts
(``SGLANG_SPEC_EXT_USE_TREE=0``) through the host-layout route: the verify input carries
the host's ``RaggedVerifyLayout`` and the CPU attention reads it with FA3's causal varlen
semantics on the geometry the host builds (``cpu/causal_ragged_attention.py``), the
contract FA3 and trtllm_mha read on a GPU.
"""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
from sglang_spec_ext.sglang.workers.suffix_sessions import STATS_LOG_MARK
from tests.e2e.test_suffix_serving import CODE, PROMPTS
from tests.harness.server import ServerConfig

WIDTH = 16
NEW_TOKENS = 32
SUFFIX = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
GATED = {"SGLANG_SPEC_EXT_DRAFT_GATE": "1", "SGLANG_SPEC_EXT_DRAFT_GATE_COST": "2"}
CHAINS = {"SGLANG_SPEC_EXT_USE_TREE": "0"}
SERVED = {
    "ragged": ((), {}),
    "ragged-overlap": ((), {OVERLAP_ENV: "1"}),
    "ragged-graphs+overlap": (
        ("--cuda-graph-bs-decode", "1", "2", "4", "8"),
        {GRAPHS_ENV: "1", OVERLAP_ENV: "1"},
    ),
    "ragged-eager-verify+graphs": (
        ("--cuda-graph-bs-decode", "1", "2", "4"),
        {GRAPHS_ENV: "1", "SGLANG_SPEC_EXT_RAGGED_GRAPHS": "0"},
    ),
    # The draft gate (off in the test harness) cuts each draft to what pays for its verify
    # (suffix/lengths.py), priced here as if a full-width verify cost 3 plain steps.
    "ragged-gated+graphs+overlap": (
        ("--cuda-graph-bs-decode", "1", "2", "4"),
        {GRAPHS_ENV: "1", OVERLAP_ENV: "1", **GATED},
    ),
    "padded": ((), {"SGLANG_SPEC_EXT_RAGGED_VERIFY": "0"}),
    # Chain drafts (topk 1): the host-layout route, the verify input carrying the host's
    # RaggedVerifyLayout read with FA3's causal varlen semantics (ragged_backends.py).
    "chains-ragged": ((), CHAINS),
    "chains-ragged-graphs+overlap": (
        ("--cuda-graph-bs-decode", "1", "2", "4", "8"),
        {GRAPHS_ENV: "1", OVERLAP_ENV: "1", **CHAINS},
    ),
}


@pytest.fixture(scope="module")
def servers(tiny_model_dir, start_module_server):
    return start_module_server.start_all({
        name: ServerConfig(tiny_model_dir, (*SUFFIX, *args), {**STATS, **env})
        for name, (args, env) in SERVED.items()
    })  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    ids = [tok(p)["input_ids"] for _, p, _ in PROMPTS[:6]]
    # A request the trees know by heart next to ones they do not: ragged lengths.
    return ids + [tok(CODE * 2)["input_ids"], tok(PROMPTS[2][1])["input_ids"]]


def _greedy(server, ids: list[int]) -> list[int]:
    out = server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                          ignore_eos=True)  # fmt: skip
    return out["output_ids"]


def _last_stats(server) -> dict:
    lines = [ln for ln in server.log_path.read_text(errors="replace").splitlines()
             if STATS_LOG_MARK in ln]  # fmt: skip
    assert lines, server.log_tail()
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


@pytest.mark.parametrize("name", list(SERVED))
def test_greedy_parity_with_concurrent_requests(servers, tiny_baseline_server, prompts, name):
    expected = [_greedy(tiny_baseline_server, ids) for ids in prompts]
    server = servers[name]
    for _ in range(2):  # the second round drafts from the first's answers
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda ids: _greedy(server, ids), prompts))
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert a == b, f"{name}: request {i} differs from plain serving"
    stats = _last_stats(server)
    if name == "padded":
        assert "ragged_verify_steps" not in stats, stats
        return
    print(name, {k: v for k, v in stats.items() if "verify" in k})
    assert stats["ragged_verify_steps"] > 0, stats
    assert stats["verify_tokens_per_step"] < stats["padded_verify_tokens_per_step"], stats
    if "graphs" in name and "eager-verify" not in name:  # token-bucket graphs replayed
        assert stats["bucket_verify_steps"] > 0, stats
        assert stats["bucket_tokens_per_step"] < stats["padded_verify_tokens_per_step"], stats
    else:
        assert stats["bucket_verify_steps"] == 0, stats
    # Chains hand the forward the host's layout (eager steps read it as FA3 does).
    assert (stats["host_layout_verify_steps"] > 0) == name.startswith("chains"), stats
    if "gated" in name:  # drafts were cut per request, some nodes verified
        assert 0 < stats["lengths_nodes_verified"] < stats["lengths_nodes_drafted"], stats


def test_start_up_line_names_the_verify(servers):
    for name, server in servers.items():
        log = server.log_path.read_text(errors="replace")
        want = "SUFFIX: verify padded" if name == "padded" else "SUFFIX: verify ragged"
        assert want in log, (name, server.log_tail())
        buckets = "graphs" in name and "eager-verify" not in name
        assert ("token buckets" in log) == buckets, (name, server.log_tail())
        route = "the host's ragged layout" if name.startswith("chains") else "tree verify"
        assert name == "padded" or route in log, (name, server.log_tail())
