"""Overlap scheduling on the CPU engine (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``): greedy parity.

On a GPU the host's default is overlap scheduling (the scheduler's
``event_loop_overlap``, the V2 workers, step N's results relayed into step N+1
through the future map, ``req.output_ids`` one step behind). The CPU engine turns
it off for speculative decoding; the switch keeps it on (sglang/cpu/overlap.py).
Each algorithm is served with the switch on and must give plain serving's greedy
output token for token, with several concurrent requests arriving while another
request decodes (so prefills land between decode steps) and one request aborted
mid-stream. The server log must prove that the overlap loop ran and that decode
inputs came through the relay (the trace lines of sglang/cpu/overlap.py); for
adaptive SUFFIX also that the verify width went down and up between decode steps.

What a CPU run cannot show: real concurrency between the forward stream and the
scheduler (missing waits, a host sync inside a step, races on relay buffers). Those
need a GPU run with the same requests.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
import time
from pathlib import Path

import pytest
import requests

from sglang_spec_ext.sglang.cpu.overlap import ENV, LOOP_MESSAGE, TRACE_MESSAGE, parse_trace
from sglang_spec_ext.sglang.workers.suffix_sessions import STATS_LOG_MARK as DRAFTER_STATS
from tests.e2e.spec_metrics import accept_length, plain_step_counts
from tests.e2e.test_suffix_serving import CODE, PROMPTS

NEW_TOKENS = 24
LONG_TOKENS = 2000  # the aborted request: NGRAM on a looping output commits ~8 per step
OVERLAP_ENV = {ENV: "1"}
CHAIN3 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4")  # fmt: skip
ADAPTIVE_ENV = {
    "SGLANG_SPEC_EXT_ADAPTIVE": "1",
    # Short patience and frequent probes, as in test_adaptive_serving.py, so the
    # width changes within a few dozen decode steps.
    "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "2",
    "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
}


def _suffix(_model: Path, _tmp) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", "8"), {}


def _adaptive_suffix(model: Path, tmp) -> tuple[tuple[str, ...], dict[str, str]]:
    return _suffix(model, tmp)[0], ADAPTIVE_ENV


def _gated_suffix(model: Path, tmp) -> tuple[tuple[str, ...], dict[str, str]]:
    # The draft gate (suffix/gate.py) with a verify priced at one expected token per
    # request until timed: steps go plain or verify by the drafts' calibrated worth.
    return _suffix(model, tmp)[0], {"SGLANG_SPEC_EXT_DRAFT_GATE": "1",
                                    "SGLANG_SPEC_EXT_DRAFT_GATE_COST": "1",
                                    "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}  # fmt: skip


def _ngram(_model: Path, _tmp) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"), {}


def _eagle3(model: Path, tmp) -> tuple[tuple[str, ...], dict[str, str]]:
    from sglang_spec_ext.models.testing.llama import build_eagle3_head

    head = build_eagle3_head(model, tmp.mktemp("eagle3-overlap") / "head")
    return ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(head),
            *CHAIN3), {}  # fmt: skip


SERVED = {
    "SUFFIX": _suffix,
    "SUFFIX-adaptive": _adaptive_suffix,
    "SUFFIX-gated": _gated_suffix,
    "NGRAM": _ngram,
    "EAGLE3": _eagle3,
}
# STANDALONE runs the same V2 model-draft worker and relay as EAGLE3; it is served under
# overlap (with graphs; drafting at small batch sizes, zero steps above them, an abort)
# in tests/e2e/test_plain_steps.py.


# HYBRID is not served here: it turns overlap scheduling off on every device, the switch
# included (its overlap support is separate work); tests/host/test_cpu_overlap.py checks
# that resolution. Every algorithm served here runs overlapped on a GPU by default.


@pytest.fixture(scope="module", params=list(SERVED))
def overlap_server(request, tiny_model_dir, tmp_path_factory, start_module_server):
    """One speculative server with the switch on; the previous one is stopped first."""
    args, env = SERVED[request.param](tiny_model_dir, tmp_path_factory)
    server = start_module_server(tiny_model_dir, *args, env={**OVERLAP_ENV, **env})
    yield request.param, server
    server.stop(term_wait=3)  # nothing to flush: spare CI the graceful shutdown


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    ids = [tok(p)["input_ids"] for _, p, _ in PROMPTS[:6]]
    return ids + [tok(CODE * 2)["input_ids"], tok(PROMPTS[2][1])["input_ids"]]


@pytest.fixture(scope="module")
def expected(tiny_baseline_server, prompts) -> list[list[int]]:
    return [_greedy(tiny_baseline_server, ids)["output_ids"] for ids in prompts]


def _greedy(server, ids: list[int], n: int = NEW_TOKENS) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


class _Stream:
    """A long greedy streaming request (by rid) that can be aborted."""

    def __init__(self, server, ids: list[int]) -> None:
        self.server = server
        self.rid = f"overlap-abort-{time.time()}"
        self.chunks: list[dict] = []
        payload = {"input_ids": ids, "rid": self.rid, "stream": True,
                   "sampling_params": {"max_new_tokens": LONG_TOKENS, "temperature": 0,
                                       "ignore_eos": True}}  # fmt: skip
        self.thread = threading.Thread(target=self._run, args=(payload,), daemon=True)
        self.thread.start()

    def _run(self, payload: dict) -> None:
        url = self.server.base_url + "/generate"
        with requests.post(url, json=payload, stream=True, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    self.chunks.append(json.loads(line[5:]))

    def wait_decoding(self, chunks: int = 3, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while len(self.chunks) < chunks and time.time() < deadline:
            time.sleep(0.05)
        assert len(self.chunks) >= chunks, "the streamed request produced nothing"

    def abort(self) -> dict:
        requests.post(self.server.base_url + "/abort_request", json={"rid": self.rid}, timeout=30)
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the aborted stream did not end"
        return self.chunks[-1]["meta_info"]


def _trace(server, timeout: float = 30) -> dict[str, str]:
    """The scheduler's last overlap-trace line (written when it goes idle)."""
    deadline = time.time() + timeout
    while True:
        lines = [ln for ln in server.log_path.read_text().splitlines() if TRACE_MESSAGE in ln]
        if lines or time.time() > deadline:
            break
        time.sleep(0.5)
    assert lines, f"no '{TRACE_MESSAGE}' line in the server log:\n{server.log_tail(40)}"
    return parse_trace(lines[-1])


def _wait_for_trace(server, key: str, minimum: int, timeout: float = 30) -> dict[str, str]:
    deadline = time.time() + timeout
    trace = _trace(server, timeout)
    while int(trace[key]) < minimum and time.time() < deadline:
        time.sleep(0.5)
        trace = _trace(server, 1)
    return trace


def test_sequential_parity_and_suffix_drafts_equal_non_overlap(
    overlap_server, prompts, expected, start_server, tiny_model_dir
):
    """On the fresh server, one request at a time: plain serving's output. For SUFFIX
    also the drafts themselves: the drafter splices the relayed accepted tokens onto
    the request's lagging output, so it must see the same history as without overlap
    and need exactly as many verify steps per request as a non-overlapped server."""
    name, server = overlap_server
    got = [_greedy(server, ids) for ids in prompts[:4]]
    for i, (g, want) in enumerate(zip(got, expected, strict=False)):
        assert g["output_ids"] == want, f"{name} prompt {i}: output differs from plain serving"
    steps = [g["meta_info"]["spec_verify_ct"] for g in got]
    print(f"\n{name} verify steps, one request at a time: {steps}")
    if name != "SUFFIX":
        return
    # "0" explicitly: under pytest --gpu-path overlap the harness would switch it on.
    sync = start_server(tiny_model_dir, *_suffix(tiny_model_dir, None)[0], env={ENV: "0"})
    assert "overlap scheduling turned off" in sync.log_path.read_text()
    sync_steps = [_greedy(sync, ids)["meta_info"]["spec_verify_ct"] for ids in prompts[:4]]
    assert steps == sync_steps, f"SUFFIX drafts differ under overlap: {steps} vs {sync_steps}"
    assert sum(steps) < len(steps) * NEW_TOKENS  # drafts were accepted at all


def test_greedy_parity_under_overlap_with_concurrency_and_abort(overlap_server, prompts, expected):
    name, server = overlap_server
    # A long request decodes; the others arrive while it runs (their prefills come
    # between its decode steps) and it is aborted while they are in flight.
    stream = _Stream(server, prompts[0])
    stream.wait_decoding()
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        futures = []
        for i, ids in enumerate(prompts):
            futures.append(pool.submit(_greedy, server, ids))
            time.sleep(0.05 * (i % 3))
        time.sleep(0.3)
        aborted = stream.abort()
        got = [f.result() for f in futures]
    assert aborted["finish_reason"]["type"] == "abort", aborted["finish_reason"]
    assert 3 <= aborted["completion_tokens"] < LONG_TOKENS
    for i, (g, want) in enumerate(zip(got, expected, strict=True)):
        assert g["output_ids"] == want, f"{name} prompt {i}: output differs from plain serving"
    accs = [accept_length(g["meta_info"]) for g in got]
    print(f"\n{name} under CPU overlap: accept lengths {[round(a, 2) for a in accs]}")
    assert max(accs) > 1.0, f"{name}: no draft token was ever accepted"
    assert server.healthy()


def test_gated_suffix_runs_weak_steps_plain_under_overlap(overlap_server, tok):
    """SUFFIX-gated only: sampled requests on random tokens give the drafter short,
    spurious matches; the gate runs those steps plain (its counters in the drafter stats
    line), and every request still gets its tokens through the relay."""
    import random

    name, server = overlap_server
    if name != "SUFFIX-gated":
        return
    rng = random.Random(11)
    prompts = [[rng.randrange(100, len(tok) - 1) for _ in range(48)] for _ in range(4)]
    # Long enough for the gate to learn these drafts' worth: each of its (match length,
    # score) cells starts from what the module's repeating greedy text accepted, and only
    # verified steps' evidence (a few per cell per step) pulls it down to what these accept.
    n = 4 * NEW_TOKENS
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda ids: server.generate(
            input_ids=ids, max_new_tokens=n, temperature=1.0, ignore_eos=True), prompts))  # fmt: skip
    assert all(o["meta_info"]["completion_tokens"] == n for o in outs)
    log = server.log_path.read_text()
    stats = [ln.split(DRAFTER_STATS, 1)[1] for ln in log.splitlines() if DRAFTER_STATS in ln]
    gate = {k: v for k, v in json.loads(stats[-1]).items() if k.startswith("gate_")}
    print(f"\n{name} draft gate: {gate}")
    assert gate["gate_steps_plain"] >= 1 and gate["gate_steps_verified"] >= 1, gate
    assert server.healthy()


def test_the_overlap_loop_and_relay_really_ran(overlap_server):
    name, server = overlap_server
    log = server.log_path.read_text()
    assert LOOP_MESSAGE in log, f"{name}: the scheduler did not run event_loop_overlap"
    assert "Non-overlap (synchronous) spec v2" not in log
    assert "overlap scheduling turned off" not in log
    if name.startswith("SUFFIX"):
        assert re.search(r"SUFFIX worker: .*overlap True", log), "our worker ran without overlap"
        # steps where no request had a draft ran as plain decode steps (plain_step.py),
        # their tokens relayed like a verify's (the parity tests above pass)
        plain = plain_step_counts(log)
        print(f"\n{name} plain-step counters: {plain}")
        assert plain.get("plain", 0) >= 1, f"{name}: no plain decode step under overlap"
    trace = _wait_for_trace(server, "relayed_steps", 10)
    print(f"\n{name} overlap trace: {trace}")
    assert int(trace["relayed_steps"]) >= 10, trace
    assert int(trace["prefills_between_decodes"]) >= 1, trace
    if name == "SUFFIX-adaptive":
        assert int(trace["width_down"]) >= 1 and int(trace["width_up"]) >= 1, (
            f"the adaptive width never went both ways between decode steps: {trace}"
        )
