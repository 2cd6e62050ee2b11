"""HYBRID with overlap scheduling (the host's default for its V2 model-draft workers),
and with the CPU graph emulation on top, against HYBRID without either.

Under overlap the scheduler launches step N+1 before it processes step N, so a
request's ``output_ids`` lags one step; HYBRID's suffix sessions take the committed
tokens from the worker's own outputs instead (sglang/workers/hybrid_commits.py). If they did
not, the suffix drafts would start from a stale context: fewer would win, fewer would
be accepted. So besides greedy parity with plain serving, the same sequential requests
must need the same verify steps per request and leave the same per-source figures and
learned table as on the server without overlap. Also: concurrency with prefills
between decode steps, an abort, sampled requests, and the host reads per decode step
counted (tests/harness/host_reads) against the host's own STANDALONE worker under
overlap, the same model-draft path without the suffix part.

What a CPU run cannot show: whether the reads stall a real GPU pipeline (here every
"device" op has finished when it returns). The count says how many there are.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import time
from pathlib import Path

import pytest

from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE
from sglang_spec_ext.sglang.serving.metrics import META_KEY
from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK
from tests.e2e.test_standalone_serving import TOPK1, _cases
from tests.e2e.test_suffix_serving import CODE
from tests.harness.server import CPUServer, abort_mid_stream, cpu_server_env

READS_SITE = Path(__file__).resolve().parents[1] / "harness" / "host_reads"
READS_MARK = "sglang-spec-ext test host reads:"
NEW_TOKENS = 20
CAPTURE_BS = ("--cuda-graph-bs-decode", "1", "2", "4")

#: name -> (algorithm, extra args, env)
#: Wide steps off (suffix width = the model's 4): whether a step goes wide follows each
#: server's own step timing, so the servers would verify the same requests differently;
#: wide steps under overlap and graphs are tested in test_hybrid_wide.py.
NARROW = {"SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH": "4"}
SERVERS = {
    "hybrid-eager": ("HYBRID", (), {OVERLAP_ENV: "0", GRAPHS_ENV: "0", **NARROW}),
    "hybrid-overlap": ("HYBRID", (), {OVERLAP_ENV: "1", GRAPHS_ENV: "0", **NARROW}),
    "hybrid-graphs-overlap": (
        "HYBRID",
        CAPTURE_BS,
        {OVERLAP_ENV: "1", GRAPHS_ENV: "1", **NARROW},
    ),  # fmt: skip
    "standalone-overlap": ("STANDALONE", (), {OVERLAP_ENV: "1", GRAPHS_ENV: "0"}),
}


@pytest.fixture(scope="module")
def servers(tiny_model_dir, weak_draft_dir, tmp_path_factory):
    """The four servers, started side by side (start-up mostly waits on imports)."""
    logs = tmp_path_factory.mktemp("hybrid-overlap")
    site = os.pathsep.join([cpu_server_env()["PYTHONPATH"], str(READS_SITE)])
    made = {}
    for name, (algo, extra, env) in SERVERS.items():
        args = ("--speculative-algorithm", algo, "--speculative-draft-model-path",
                str(weak_draft_dir), *TOPK1, *extra)  # fmt: skip
        env = {**env, "PYTHONPATH": site, "SPEC_EXT_TEST_COUNT_HOST_READS": "1",
               "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}  # fmt: skip
        made[name] = CPUServer(tiny_model_dir, args, env=env, log_path=logs / f"{name}.log")
    pool = cf.ThreadPoolExecutor(len(made))  # threads live as long as their servers
    try:
        for future in [pool.submit(server.start) for server in made.values()]:
            future.result()
        yield made
    finally:
        list(pool.map(CPUServer.stop, made.values()))
        pool.shutdown()


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    """Chat-like and code-edit-like prompts (the latter repeat: suffix drafts win)."""
    return [ids for _, ids in _cases(tok)] + [tok(CODE * 2)["input_ids"]]


@pytest.fixture(scope="module")
def expected(tiny_baseline_server, prompts) -> list[list[int]]:
    return [_greedy(tiny_baseline_server, ids)["output_ids"] for ids in prompts]


def _greedy(server, ids: list[int], n: int = NEW_TOKENS) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


def _stats(server) -> dict:
    lines = [ln for ln in server.log_path.read_text().splitlines() if STATS_LOG_MARK in ln]
    assert lines, "no HYBRID stats line"
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


def _reads(server) -> tuple[int, int, int]:
    """(decode steps, host reads, of which the plugin's) from the last counter line."""
    lines = [ln for ln in server.log_path.read_text().splitlines() if READS_MARK in ln]
    assert lines, f"no host-read counter line:\n{server.log_tail(30)}"
    m = re.search(r"steps=(\d+) reads=(\d+) plugin_reads=(\d+)", lines[-1])
    print(f"  {server.log_path.stem}: {lines[-1].split(READS_MARK, 1)[1].strip()}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _sources(out: dict) -> dict:
    """A request's verify steps and committed tokens per winning source (meta_info)."""
    return out["meta_info"][META_KEY]["drafted_by"]


def test_sequential_requests_match_hybrid_without_overlap(servers, prompts, expected):
    """Plain serving's output on every server. Overlapped (graphs or not), every request
    needs the same verify steps, and wins them with the same sources and tokens, as
    without overlap: the suffix sessions saw the same tokens at every step. The two
    overlapped servers (graph replays or eager drafts) also learn the same table.

    (The learned table of the non-overlapped server is not compared: under overlap the
    scheduler runs one more step for a request that its last step finished, and the
    suffix session then learns from that step's committed tokens, which a non-overlapped
    server never shows it; the step itself is dropped from every count.)"""
    got: dict[str, list[dict]] = {}
    for name in ("hybrid-eager", "hybrid-overlap", "hybrid-graphs-overlap", "standalone-overlap"):
        got[name] = [_greedy(servers[name], ids) for ids in prompts]
        for i, (g, want) in enumerate(zip(got[name], expected, strict=True)):
            assert g["output_ids"] == want, f"{name}, prompt {i}: output differs from plain"
    steps = {n: [g["meta_info"]["spec_verify_ct"] for g in outs] for n, outs in got.items()}
    print(f"\nverify steps per request: {steps}")
    for name in ("hybrid-overlap", "hybrid-graphs-overlap"):
        assert steps[name] == steps["hybrid-eager"], name
        for i, (a, b) in enumerate(zip(got[name], got["hybrid-eager"], strict=True)):
            assert _sources(a) == _sources(b), f"{name}, prompt {i}: other sources won"
    stats = {name: _stats(servers[name]) for name in ("hybrid-overlap", "hybrid-graphs-overlap")}
    assert stats["hybrid-graphs-overlap"]["by_source"] == stats["hybrid-overlap"]["by_source"]
    for source, rows in stats["hybrid-overlap"]["learned"].items():
        other = stats["hybrid-graphs-overlap"]["learned"][source]
        assert [(r["lo"], r["seen"]) for r in other] == [(r["lo"], r["seen"]) for r in rows]
        for a, b in zip(other, rows, strict=True):
            assert a["mean_raw"] == pytest.approx(b["mean_raw"], rel=1e-5, abs=1e-6)
            assert a["mean_accepted"] == pytest.approx(b["mean_accepted"])
    shares = stats["hybrid-overlap"]["by_source"]
    print(f"per source under overlap: {shares}")
    assert all(shares.get(s, {}).get("steps", 0) > 0 for s in ("model", "suffix")), shares
    assert stats["hybrid-overlap"]["commit_resyncs"] == 0
    # steps where the suffix draft won for every request before the model drafted ran no
    # draft forward (the parity above covers them)
    skipped = {name: stat["model_draft_skipped_steps"] for name, stat in stats.items()}
    print(f"model draft skipped in {skipped} steps")
    assert skipped["hybrid-overlap"] >= 1
    assert sum(steps["hybrid-eager"]) < len(prompts) * NEW_TOKENS  # drafts were accepted


@pytest.mark.parametrize("name", ["hybrid-overlap", "hybrid-graphs-overlap"])
def test_concurrency_abort_and_sampling_under_overlap(servers, prompts, expected, name):
    server = servers[name]
    with cf.ThreadPoolExecutor(len(prompts) + 2) as pool:
        futures = []
        for i, ids in enumerate(prompts):
            futures.append(pool.submit(_greedy, server, ids))
            time.sleep(0.05 * (i % 3))  # prefills land between decode steps
        sampled = [pool.submit(server.generate, input_ids=prompts[i], max_new_tokens=NEW_TOKENS,
                               temperature=0.8, ignore_eos=True) for i in (0, 5)]  # fmt: skip
        aborted = abort_mid_stream(server, prompts[-1], max_new_tokens=400)
        got = [f.result() for f in futures]
        outs = [f.result() for f in sampled]
    for i, (g, want) in enumerate(zip(got, expected, strict=True)):
        assert g["output_ids"] == want, f"{name}, prompt {i}: output differs under load"
    assert all(o["meta_info"]["completion_tokens"] == NEW_TOKENS for o in outs)
    print(f"\n{name}: aborted request {aborted}")
    assert server.healthy()


def test_the_overlap_loop_ran_and_host_reads_per_step(servers):
    for name in ("hybrid-overlap", "hybrid-graphs-overlap", "standalone-overlap"):
        log = servers[name].log_path.read_text()
        assert LOOP_MESSAGE in log, f"{name}: the scheduler did not run event_loop_overlap"
        assert "overlap scheduling turned off" not in log, name
    assert "overlap scheduling turned off" in servers["hybrid-eager"].log_path.read_text()
    print("\nhost reads in decode steps (CPU engine, counted by tests/harness/host_reads):")
    per_step = {}
    for name in ("hybrid-eager", "hybrid-overlap", "hybrid-graphs-overlap", "standalone-overlap"):
        steps, reads, plugin = _reads(servers[name])
        per_step[name] = (reads / steps, plugin / steps)
    print("per decode step (all, the plugin's own): "
          + ", ".join(f"{n} {a:.2f}, {p:.2f}" for n, (a, p) in per_step.items()))  # fmt: skip
    # the plugin's own: at most two device-to-host copies per step, one packed copy each
    # (the earlier steps' outputs before the model drafts; the model's draft after it,
    # not made when the model did not draft); nothing else of ours reads the device
    for name in ("hybrid-eager", "hybrid-overlap", "hybrid-graphs-overlap"):
        assert 1.0 <= per_step[name][1] <= 2.0, (name, per_step[name])
    assert per_step["standalone-overlap"][1] == 0  # no plugin code in the host's worker step


def test_grammar_requests_keep_overlap(servers, tiny_baseline_server, tok):
    """Structured requests (JSON schema tool call, regex, JSON mode, free) under overlap:
    HYBRID keeps overlap scheduling for grammar batches (the host's EAGLE verify advances
    the grammar FSM through the scheduler's barrier), so at drafting time a request's
    matcher is one step behind its committed tokens and its suffix draft is shaped from a
    fork fed the relayed ones (``grammar_fed_relayed``). Greedy output stays plain
    constrained decoding's."""
    from tests.e2e.test_grammar_drafts import CONSTRAINTS, PROMPTS

    def ask(server, prompt, constraint):
        ids = tok(prompt)["input_ids"]
        return server.generate(input_ids=ids, max_new_tokens=40, temperature=0,
                               **constraint)["output_ids"]  # fmt: skip

    want = [ask(tiny_baseline_server, p, c) for p, c in zip(PROMPTS, CONSTRAINTS, strict=True)]
    for name in ("hybrid-overlap", "hybrid-graphs-overlap"):
        for _ in range(2):
            with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
                pairs = list(zip(PROMPTS, CONSTRAINTS, strict=True))
                got = list(pool.map(lambda pc, s=servers[name]: ask(s, *pc), pairs))
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert a == b, f"{name}: request {i} ({CONSTRAINTS[i] or 'free'}) differs"
        suffix = _stats(servers[name])["suffix"]
        shaped = {k: v for k, v in suffix.items() if k.startswith("grammar_")}
        print(f"\n{name}: {shaped}")
        assert suffix["grammar_requests"] > 0 and suffix["grammar_faults"] == 0, shaped
        assert suffix["grammar_fed_relayed"] > 0, shaped
        assert servers[name].healthy()
