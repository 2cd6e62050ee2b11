"""The soak harness's short mode (benchmarks/soak.py) as CI runs it: the real CPU server
with SUFFIX at width 16 on the GPU default path's emulation (overlap scheduling and graph
runners, ``--gpu-path both``) against a plain server, a mixed load at concurrency 16 with
prompts at the context limit, SUFFIX's defaults (the draft gate on), disconnecting clients, invalid and guarded requests,
tenants (salted and unsalted) and external-corpus operations.
The long mode (thousands of requests, three algorithms) is for people: README."""

from __future__ import annotations

from tests.e2e.soak_run import run_soak


def test_soak_short_mode(tmp_path, capsys, monkeypatch):
    # the product's defaults (the test bed turns SUFFIX's draft gate off for step counts)
    monkeypatch.delenv("SGLANG_SPEC_EXT_DRAFT_GATE", raising=False)
    run, record = run_soak(tmp_path, capsys, ["--requests", "100", "--gpu-path", "both"],
                           min_parity=40)  # fmt: skip
    kinds = run["per_kind"]
    # Tenants (salted and unsalted requests) keep parity; corpus operations under load
    # are answered or refused, never an error.
    assert kinds["tenant"]["ok"] == kinds["tenant"]["sent"] > 0
    assert kinds["corpus"]["sent"] > 0
    assert (
        kinds["corpus"].get("ok", 0) + kinds["corpus"].get("refused", 0) == kinds["corpus"]["sent"]
    )
    # The drafter reports its statistics and stays within its bound.
    assert run["drafter_stats"] is not None and run["drafter_within_bound"] is True
    # the draft gate (on by default) decided steps with drafts
    gate = run["drafter_stats"]
    assert gate.get("gate_steps_verified", 0) + gate.get("gate_steps_plain", 0) > 0, gate
    assert (
        0
        < run["drafter_peak"]["cached_tokens"]
        <= record["parameters"]["drafter_max_cached_tokens"]
    )
    assert record["machine"] and record["parameters"]["width"] == 16
    # the GPU default path's emulation really ran: the overlap loop with every decode
    # step's inputs through the relay, prefills between decode steps, graphs replayed
    seen = run["gpu_path_seen"]
    trace = seen["overlap_trace"]
    assert seen["overlap"] and int(trace["relayed_steps"]) == int(trace["decode_steps"]) > 0
    assert int(trace["prefills_between_decodes"]) > 0
    assert seen["graphs_captured"] > 0 and seen["graphs_replayed"] > 0
