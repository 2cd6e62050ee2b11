"""SUFFIX replicas behind SGLang's own router (``sglang-router``, the PyPI package), started
the way a user starts them: greedy output through the router identical to one plain
server, the accept length of two replicas behind the cache-aware router against one SUFFIX
server on repeated work (round robin printed beside it), and a replica started from its
peers' snapshots (``SGLANG_SPEC_EXT_SNAPSHOT_PEERS``) drafting the fleet's earlier answers
at once.

Tiny random-weight model, text prompts (the router's cache-aware policy routes by the
request text). The replicas write their snapshots every second while serving (the test
servers start their schedulers by fork, whose shutdown write is not relied on here)."""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

WIDTH = 8
NEW_TOKENS = 24
SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
PROMPTS = [
    "counting: " + ", ".join(str(i) for i in range(12)),
    "The lighthouse keeper wrote in the log every night",
    "def area(width, height):\n    return",
    "A list of fruit: apple, pear, plum, apple, pear,",
]

if importlib.util.find_spec("sglang_router") is None:
    pytest.skip(
        "sglang-router is not installed (scripts/setup_env.sh installs it)", allow_module_level=True
    )

from tests.harness.router import Router, replica_router_args  # noqa: E402


def _payload(text: str) -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0,
            "ignore_eos": True}}  # fmt: skip


def _greedy(server, text: str) -> dict:
    return server.generate(text=text, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def _accept(outs: list[dict]) -> float:
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    steps = sum(o["meta_info"].get("spec_verify_ct") or 0 for o in outs)
    return tokens / max(steps, 1)


def _snapshot_env(shared: Path, name: str) -> dict[str, str]:
    return {"SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(shared / f"{name}.snap"),
            "SGLANG_SPEC_EXT_SNAPSHOT_PEERS": str(shared),
            "SGLANG_SPEC_EXT_SNAPSHOT_INTERVAL_S": "1"}  # fmt: skip


def test_replicas_behind_the_router(tiny_model_dir, tiny_baseline_server, start_module_server,
                                    tmp_path):  # fmt: skip
    from tests.harness.server import ServerConfig

    shared = tmp_path / "snapshots"
    shared.mkdir()
    servers = start_module_server.start_all(
        {
            "single": ServerConfig(tiny_model_dir, SUFFIX_ARGS, {}, {}),
            "a": ServerConfig(tiny_model_dir, SUFFIX_ARGS, _snapshot_env(shared, "a"), {}),
            "b": ServerConfig(tiny_model_dir, SUFFIX_ARGS, _snapshot_env(shared, "b"), {}),
        }
    )
    expected = {p: _greedy(tiny_baseline_server, p)["output_ids"] for p in PROMPTS}

    # one SUFFIX server: the prompts, then the same prompts again (repeated work)
    single = [[_greedy(servers["single"], p) for p in PROMPTS] for _round in range(2)]
    for outs in single:
        assert [o["output_ids"] for o in outs] == [expected[p] for p in PROMPTS]

    accept: dict[str, float] = {"single, repeats": _accept(single[1])}
    workers = [servers["a"].base_url, servers["b"].base_url]
    for policy in ("cache_aware", "round_robin"):
        router = Router(replica_router_args(workers, policy), tmp_path / f"router-{policy}.log")
        try:
            rounds = [[router.generate(_payload(p)) for p in PROMPTS] for _round in range(2)]
        finally:
            router.stop()
        for outs in rounds:
            assert [o["output_ids"] for o in outs] == [expected[p] for p in PROMPTS], policy
        accept[f"{policy}, repeats"] = _accept(rounds[1])

    # the replicas' snapshots are written while they serve: one more step once due
    time.sleep(1.5)
    for name in ("a", "b"):
        _greedy(servers[name], "x")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        (shared / f"{n}.snap").exists() for n in ("a", "b")
    ):
        time.sleep(0.5)
    assert sorted(p.name for p in shared.iterdir() if p.suffix == ".snap") == ["a.snap", "b.snap"]

    # a new replica, started from its peers' snapshots, against a cold one
    fresh = start_module_server.start_all(
        {
            "c": ServerConfig(tiny_model_dir, SUFFIX_ARGS, _snapshot_env(shared, "c"), {}),
            "cold": ServerConfig(tiny_model_dir, SUFFIX_ARGS, {}, {}),
        }
    )
    warm_c = [_greedy(fresh["c"], p) for p in PROMPTS]
    cold = [_greedy(fresh["cold"], p) for p in PROMPTS]
    assert [o["output_ids"] for o in warm_c] == [expected[p] for p in PROMPTS]
    accept["new replica from peers, first round"] = _accept(warm_c)
    accept["cold server, first round"] = _accept(cold)
    accept["single, first round"] = _accept(single[0])
    print(f"accept lengths: {accept}")
    log = fresh["c"].log_path.read_text(errors="replace")
    assert "SUFFIX snapshot peers: loaded" in log and "2 of 2 peer files" in log

    assert accept["cache_aware, repeats"] >= 0.9 * accept["single, repeats"], accept
    assert accept["new replica from peers, first round"] >= 0.9 * accept["single, repeats"], accept
    assert accept["new replica from peers, first round"] > accept["cold server, first round"]
    shutil.rmtree(shared, ignore_errors=True)
