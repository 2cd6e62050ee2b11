"""Drafter faults on the real server (CPU, tiny model): output stays the target's.

The speculative server runs with ``tests/harness/faults`` on its PYTHONPATH and
``SPEC_EXT_TEST_FAULT_EVERY`` set: every few calls of the suffix drafter raise
(RuntimeError, MemoryError, IndexError; before or after the call did its work), in
the scheduler process of the real server. The worker must degrade those steps to
plain decoding: greedy output identical to the plain server's, requests answered,
the server healthy, and the faults visible in its log.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from pathlib import Path

import pytest

from tests.harness.server import cpu_server_env

FAULT_SITE = Path(__file__).resolve().parents[1] / "harness" / "faults"
WIDTH = 6
NEW_TOKENS = 24
PROMPTS = [
    ", ".join(str(i) for i in range(30)),
    "def f(x):\n    return x + 1\n" * 3,
    "The quick brown fox jumps over the lazy dog. " * 3,
    "hello world",
    "for i in range(10):\n    print(i)\n" * 2,
    "Suffix trees index the text seen so far; the longest",
]


@pytest.fixture(scope="module")
def faulty_server(tiny_model_dir, start_module_server):
    base_path = cpu_server_env()["PYTHONPATH"]
    env = {
        "PYTHONPATH": os.pathsep.join([base_path, str(FAULT_SITE)]),
        "SPEC_EXT_TEST_FAULT_EVERY": "3",
    }
    args = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
    return start_module_server(tiny_model_dir, *args, env=env)


def _greedy(server, ids):
    out = server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    return out["output_ids"]


def test_injected_drafter_faults_keep_greedy_output_and_the_server(
    faulty_server, tiny_baseline_server, tok
):
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    want = [_greedy(tiny_baseline_server, ids) for ids in prompts]
    for i, ids in enumerate(prompts):  # one at a time, then all at once
        assert _greedy(faulty_server, ids) == want[i], f"prompt {i} differs"
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _greedy(faulty_server, ids), prompts))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"concurrent prompt {i} differs"
    assert faulty_server.healthy()
    log = faulty_server.log_path.read_text(errors="replace")
    assert "injected drafter fault" in log, "no fault was injected: the test tested nothing"
    assert "SUFFIX drafter fault" in log
