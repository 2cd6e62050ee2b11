"""SUFFIX with the target's own top-k recycled beside its trees (``suffix_sources.py``),
served by the real SGLang server on CPU (tiny model).

On text nobody sent before the suffix trees know little; the recycled table knows what the
target said after each token at its last verify. A random-weight model's next token depends
mostly on the current one, so the recycled drafts are accepted far more than the suffix
drafts there: the test checks that the source is fed and drafts (the stats line), that it
raises the accept length over the same server with the source off, and that greedy output
equals plain serving's, in eager mode and under the GPU path's emulation (overlap
scheduling and CUDA graphs), with a tenant's table kept from another tenant.
"""

from __future__ import annotations

import json

import pytest

from sglang_spec_ext.sglang.workers.suffix_sessions import STATS_LOG_MARK

WIDTH = 8
NEW_TOKENS = 40
SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
ON = {"SGLANG_SPEC_EXT_RECYCLE_TOPK": "8"}  # opt-in
FRESH = [
    "The museum opened a new wing for maritime history",
    "Explain how a thermostat keeps a room warm",
    "List three reasons people keep a garden",
    "What makes a bridge stay up under heavy trucks",
    "Write a note thanking a neighbour for the help",
    "Describe the smell of rain on dry ground",
]


def _stats(server) -> dict:
    lines = [ln for ln in server.log_path.read_text(errors="replace").splitlines()
             if STATS_LOG_MARK in ln]  # fmt: skip
    assert lines, server.log_tail()
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tiny_baseline_server, start_module_server):
    from tests.harness.server import ServerConfig

    gpu_path = {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "1"}
    started = start_module_server.start_all(
        {
            "on": ServerConfig(tiny_model_dir, SUFFIX_ARGS, {**STATS, **ON}, {}),
            "off": ServerConfig(
                tiny_model_dir, SUFFIX_ARGS, {**STATS, "SGLANG_SPEC_EXT_RECYCLE_TOPK": "0"}, {}
            ),
            "gpu-path": ServerConfig(tiny_model_dir, SUFFIX_ARGS, {**STATS, **ON, **gpu_path}, {}),
        }
    )
    return tiny_baseline_server, started


def _greedy(server, ids, **kw):
    return server.generate(
        input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, **kw
    )


def test_recycled_drafts_raise_acceptance_on_fresh_text_and_keep_greedy_output(servers, tok):
    base, spec = servers
    prompts = [tok(p)["input_ids"] for p in FRESH]
    expected = [_greedy(base, ids)["output_ids"] for ids in prompts]
    accept: dict[str, float] = {}
    for name in ("on", "off", "gpu-path"):
        tokens = steps = 0
        for ids, want in zip(prompts, expected, strict=True):
            out = _greedy(spec[name], ids)
            assert out["output_ids"] == want, name
            meta = out["meta_info"]
            tokens += meta["completion_tokens"]
            steps += meta.get("spec_verify_ct") or 0
        accept[name] = tokens / max(steps, 1)
    print(f"accept length on fresh text: {accept}")
    on = _stats(spec["on"])
    assert on["recycle_rows_fed"] > 0 and on["recycle_recycled_nodes_drafted"] > 0
    assert on["recycle_steps_skipped"] == 0
    assert _stats(spec["off"])["recycle_k"] == 0
    assert accept["on"] > accept["off"] + 0.1, accept
    gpu = _stats(spec["gpu-path"])
    assert gpu["recycle_rows_fed"] > 0 and gpu["recycle_steps_skipped"] == 0
    assert accept["gpu-path"] > accept["off"] + 0.1, accept


def test_a_tenants_table_is_its_own(servers, tok):
    """Requests under another ``cache_salt`` draft from their own scope's table: the first
    request of a new tenant gets no recycled draft from another tenant's rows."""
    _base, spec = servers
    server = spec["on"]
    ids = tok(FRESH[0])["input_ids"]
    before = _stats(server)["recycle_scopes"]
    out = _greedy(server, ids, fields={"cache_salt": "tenant-recycle-probe"})
    assert _stats(server)["recycle_scopes"] == before + 1
    assert out["meta_info"]["completion_tokens"] == NEW_TOKENS
