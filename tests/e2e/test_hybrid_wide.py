"""HYBRID's wide steps on the real host's CPU engine (sglang/workers/hybrid_wide.py): a
winning suffix draft verified at its own length (up to SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH,
default 16) beside the model's 3-token chains (width 4), in eager serving and with
overlap scheduling plus the CPU graph emulation (where a wide step runs the verify and
the draft extend eagerly). A repeated request's answer is in the global suffix tree, so
its second run drafts the whole answer: accepted beyond the model's width, greedy output
identical to plain serving, sampled requests and concurrency with prefills in between
still served, concurrent wide steps verifying each row at its own length (ragged: the
CPU engine's verify attention). The control server (suffix width 4) never goes wide. One
server drafts suffix chains (SGLANG_SPEC_EXT_USE_TREE=0): its wide steps hand the target
the host's RaggedVerifyLayout, read as the host's FA3 backend reads it."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK
from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_standalone_serving import TOPK1, TOPK2, _cases

NEW_TOKENS = 40
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
SERVERS = {
    "eager": (TOPK1, {OVERLAP_ENV: "0", GRAPHS_ENV: "0"}),
    "graphs-overlap": (
        (*TOPK1, "--cuda-graph-bs-decode", "1", "2", "4"),
        {OVERLAP_ENV: "1", GRAPHS_ENV: "1"},
    ),
    "tree": (TOPK2, {OVERLAP_ENV: "0", GRAPHS_ENV: "0"}),
    "control": (TOPK1, {"SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH": "4"}),
    # Suffix drafts as chains: every row of a wide step a chain, verified through the
    # host-layout route (the host's RaggedVerifyLayout read as FA3 reads it).
    "chains": (TOPK1, {OVERLAP_ENV: "0", GRAPHS_ENV: "0", "SGLANG_SPEC_EXT_USE_TREE": "0"}),
}


@pytest.fixture(scope="module")
def servers(tiny_model_dir, weak_draft_dir, start_module_server):
    made = {}
    for name, (shape, env) in SERVERS.items():
        args = ("--speculative-algorithm", "HYBRID", "--speculative-draft-model-path",
                str(weak_draft_dir), *shape)  # fmt: skip
        made[name] = start_module_server(tiny_model_dir, *args, env={**STATS, **env})
    return made


def _greedy(server, ids, n=NEW_TOKENS):
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


def _stats(server) -> dict:
    text = server.log_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if STATS_LOG_MARK in ln]
    assert lines, "no HYBRID stats line in the server log"
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


@pytest.mark.parametrize("name", ["eager", "graphs-overlap", "tree", "control", "chains"])
def test_repeated_requests_go_wide_with_plain_output(tiny_baseline_server, servers, tok, name):
    server = servers[name]
    cases = _cases(tok)[:6]
    best = 0.0
    for label, ids in cases + cases:  # the second round's answers are in the suffix tree
        want = _greedy(tiny_baseline_server, ids)["output_ids"]
        got = _greedy(server, ids)
        assert got["output_ids"] == want, f"{name}/{label}: output differs from plain serving"
        best = max(best, accept_length(got["meta_info"]))
    wide = _stats(server)["wide"]
    print(f"\n{name}: best accept length {best:.2f}; wide: {json.dumps(wide)}")
    if name == "control":
        assert wide["suffix_width"] == 0 and wide["wide_steps"] == 0
        assert best <= 4.0  # never beyond the model's width
        return
    assert wide["suffix_width"] == 16
    assert wide["wide_steps"] > 0 and wide["wide_rows"] > 0
    assert best > 4.0, "no request accepted beyond the model's verify width"
    route = "the host's ragged layout" if name == "chains" else "the plugin's tree verify"
    log = server.log_path.read_text(errors="replace")
    assert f"wide steps verify each row at its own length (ragged: {route}" in log


def test_chain_rows_verify_ragged_through_the_hosts_layout(servers, tok):
    server = servers["chains"]
    # Repeated requests (long suffix chains) beside new ones (the model's chains) in
    # concurrent wide steps: rows of their own length.
    prompts = [ids for _, ids in _cases(tok)[:3]] + [ids for _, ids in _cases(tok)[6:]]
    prompts += [[t + 1 for t in ids] for _, ids in _cases(tok)[:3]]
    for _ in range(2):
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            list(pool.map(lambda ids: _greedy(server, ids, 24), prompts))
    wide = _stats(server)["wide"]
    assert wide["wide_ragged_verify_steps"] > 0, wide
    assert (
        "HYBRID: suffix drafts are chains (SGLANG_SPEC_EXT_USE_TREE=0)"
        in server.log_path.read_text(errors="replace")
    )


def test_concurrent_and_sampled_requests_under_wide_steps(tiny_baseline_server, servers, tok):
    server = servers["graphs-overlap"]
    prompts = [ids for _, ids in _cases(tok)[:6]] * 2
    want = [_greedy(tiny_baseline_server, ids, 24)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda ids: _greedy(server, ids, 24)["output_ids"], prompts))
        sampled = list(pool.map(
            lambda ids: server.generate(input_ids=ids, max_new_tokens=24, temperature=0.8,
                                        top_p=0.95, ignore_eos=True),
            prompts[:4],
        ))  # fmt: skip
    assert got == want
    assert all(len(s["output_ids"]) == 24 for s in sampled)
    assert all(0 <= t < len(tok) for s in sampled for t in s["output_ids"])
    stats = _stats(server)
    assert stats["choice_faults"] == 0
    wide = stats["wide"]  # concurrent wide steps verify each row at its own length
    assert wide["wide_ragged_verify_steps"] > 0
    assert wide["wide_verify_tokens_per_step"] < wide["wide_padded_verify_tokens_per_step"]
    assert server.healthy()
