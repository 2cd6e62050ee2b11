"""Regression (issue 10): speculative requests decoding up to the context limit.

With ``--speculative-num-draft-tokens 16`` the host reserves 32 KV slots past each
request's committed length per decode step, but its request-to-token rows hold only
4 + 16 beyond the context length: requests near the limit wrote past their row,
leaked KV slots, and the host's idle memory check ended the server (for the last row
the scheduler died on an index error). ``sglang_spec_ext/sglang/host/fixes.py``
widens the rows. Each algorithm gets its own server at a short context, a burst of
requests that end 0-3 tokens short of the limit, then an idle pause (the host checks
its pools whenever the scheduler is idle), and must stay up with every answer equal
to the plain server's.

``SPEC_EXT_TEST_HOST_FIXES=0`` runs the same test with the fix off: it then fails
(server dead or leak reported), which is how the regression was shown.
"""

from __future__ import annotations

import os

import pytest

from sglang_spec_ext.soak import ServerHandle, build_workload, plain_answers, soak
from tests.harness.server import CPUServer, ServerConfig

CONTEXT = 256
WIDTH = 16
LIMITS = ("--context-length", str(CONTEXT), "--max-running-requests", "16")
ALGORITHMS = {
    "SUFFIX": ({}, ("--speculative-algorithm", "SUFFIX")),
    "SUFFIX-adaptive": ({"SGLANG_SPEC_EXT_ADAPTIVE": "1"}, ("--speculative-algorithm", "SUFFIX")),
    "NGRAM": ({}, ("--speculative-algorithm", "NGRAM")),
}


@pytest.fixture(scope="module")
def workload(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = " ".join(
        f"Request {i} asks for item {i * 7 % 13}; the quick brown fox jumps over the lazy dog."
        f"\ndef add_{i}(a, b):\n    return a + b * {i}\n"
        for i in range(60)
    )
    pool = [t for t in tok(text)["input_ids"] if t not in set(tok.all_special_ids)]
    return build_workload(
        40,
        token_pool=pool,
        context_len=CONTEXT,
        seed=10,
        mix={"near_limit": 3, "greedy": 1},
        max_new=32,
    )


@pytest.fixture(scope="module")
def servers(tiny_model_dir, start_module_server) -> dict[str, CPUServer]:
    """The plain server and one server per algorithm, started side by side (each test
    uses its own algorithm's server only; an idle server sleeps, ``--sleep-on-idle``)."""
    fixes = {"SGLANG_SPEC_EXT_HOST_FIXES": os.environ.get("SPEC_EXT_TEST_HOST_FIXES", "1")}
    configs = {"plain": ServerConfig(tiny_model_dir, LIMITS)}
    for name, (env, flags) in ALGORITHMS.items():
        args = (*flags, "--speculative-num-draft-tokens", str(WIDTH), *LIMITS)
        configs[name] = ServerConfig(tiny_model_dir, args, {**env, **fixes})
    return start_module_server.start_all(configs)


@pytest.fixture(scope="module")
def plain(servers, workload):
    """A plain server at the same context length (the host clips max_new_tokens to the
    context, so answers are compared at equal limits), and its answers."""
    server = servers["plain"]
    return server, plain_answers(server.base_url, workload, concurrency=16, deadline_s=600)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_requests_at_the_context_limit_leave_no_leak(name, servers, plain, workload):
    server = servers[name]
    assert sum(r.kind == "near_limit" for r in workload) >= 20
    handle = ServerHandle(server.base_url, server.log_path, lambda: server.proc.poll() is None)
    verdict, _ = soak(
        handle,
        plain[0].base_url,
        workload,
        plain=plain[1],
        concurrency=16,
        deadline_s=600,
        post_abort=4,
    )
    print(f"\n{name}: accept length {verdict.mean_accept_length}, per kind {verdict.per_kind}")
    assert verdict.server_alive, server.log_tail(40)
    assert not verdict.fatal_log_lines, verdict.fatal_log_lines
    assert verdict.parity_mismatches == 0 and not verdict.failures, verdict.failures[:5]
    assert verdict.parity_checked == len(workload)
