"""Grammar-aware SUFFIX drafts (``sglang/workers/suffix_grammar.py``) served on the CPU
engine with the host's xgrammar backend.

Structured requests (a tool call under a JSON schema with nested objects, enums and an
array; a regex; JSON mode) beside an unconstrained one, sent together, twice (the second
round drafts from the first's answers). Greedy output must equal plain constrained decoding
token for token on every server: eager; the GPU default path's emulation (graphs + overlap),
where grammar batches keep overlap scheduling (the worker takes the host's grammar barrier:
its stats count the steps); overlap with grammar overlap off (the host syncs every grammar
batch: no barrier step); and a server with grammar drafts off. The grammar servers' stats
must show shaped drafts (nodes cut and forced nodes drafted); the control's none. Sampled
constrained requests must still follow their grammar.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re

import pytest

from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
from tests.e2e.test_ragged_verify import _last_stats
from tests.harness.server import ServerConfig

WIDTH = 8
NEW_TOKENS = 48
SUFFIX = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
SERVED = {
    "grammar": ((), {}),
    "grammar-graphs+overlap": (
        ("--cuda-graph-bs-decode", "1", "2", "4"),
        {GRAPHS_ENV: "1", OVERLAP_ENV: "1"},
    ),
    "grammar-overlap-synced": ((), {OVERLAP_ENV: "1", "SGLANG_SPEC_EXT_GRAMMAR_OVERLAP": "0"}),
    "control": ((), {"SGLANG_SPEC_EXT_GRAMMAR_DRAFTS": "0"}),
}

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search_web", "send_email"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1, "maximum": 7},
                    "maxItems": 2,
                },
            },
            "required": ["city", "unit", "days"],
        },
    },
    "required": ["name", "arguments"],
}
REGEX = r"(yes|no), because [a-z ]{1,20}\."
CONSTRAINTS = [
    {"json_schema": json.dumps(TOOL_SCHEMA)},
    {"regex": REGEX},
    {"json_schema": json.dumps({"type": "object"})},  # JSON mode
    {},  # unconstrained, in the same batch
]
PROMPTS = [
    "Call a tool to get the weather in Paris for the next days.",
    "Is the sky blue? Answer yes or no with a reason.",
    "Describe a cat as a JSON object.",
    "Tell me a short story about a robot.",
]


@pytest.fixture(scope="module")
def servers(tiny_model_dir, start_module_server):
    return start_module_server.start_all({
        name: ServerConfig(tiny_model_dir, (*SUFFIX, *args), {**STATS, **env})
        for name, (args, env) in SERVED.items()
    })  # fmt: skip


def _ask(server, tok, prompt: str, constraint: dict, **sampling) -> list[int]:
    ids = tok(prompt)["input_ids"]
    sampling.setdefault("max_new_tokens", NEW_TOKENS)
    out = server.generate(input_ids=ids, **constraint, **sampling)
    return out["output_ids"]


def _batch(server, tok, **sampling) -> list[list[int]]:
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda pc: _ask(server, tok, *pc, **sampling),
                             zip(PROMPTS, CONSTRAINTS, strict=True)))  # fmt: skip


@pytest.mark.parametrize("name", list(SERVED))
def test_greedy_parity_with_plain_constrained_decoding(servers, tiny_baseline_server, tok, name):
    expected = [_ask(tiny_baseline_server, tok, p, c, temperature=0)
                for p, c in zip(PROMPTS, CONSTRAINTS, strict=True)]  # fmt: skip
    server = servers[name]
    for _ in range(2):
        got = _batch(server, tok, temperature=0)
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert a == b, f"{name}: request {i} ({CONSTRAINTS[i] or 'free'}) differs from plain"
    stats = _last_stats(server)
    shaped = {k: v for k, v in stats.items() if k.startswith("grammar_")}
    print(name, shaped)
    if name == "control":
        assert stats["grammar_requests"] == 0, shaped
        return
    assert stats["grammar_requests"] > 0 and stats["grammar_forced"] > 0, shaped
    assert stats["grammar_faults"] == 0, shaped
    if name == "grammar-graphs+overlap":  # the host kept overlap for the grammar batches
        assert stats["grammar_barrier_steps"] > 0, shaped
        assert stats["grammar_stale_skips"] <= stats["grammar_barrier_steps"] // 4, shaped
    else:
        assert stats["grammar_barrier_steps"] == 0, shaped


def _follows(tok, constraint: dict, ids: list[int]) -> bool:
    """Every token of ``ids`` is admitted in turn by a fresh xgrammar matcher for the
    request's constraint (a sampled answer may stop at max_new_tokens mid-structure)."""
    import xgrammar as xg

    compiler = xg.GrammarCompiler(xg.TokenizerInfo.from_huggingface(tok))
    if "json_schema" in constraint:
        compiled = compiler.compile_json_schema(constraint["json_schema"])
    else:
        compiled = compiler.compile_regex(constraint["regex"])
    matcher = xg.GrammarMatcher(compiled)
    return all(matcher.accept_token(t) for t in ids)


def test_sampled_constrained_requests_follow_their_grammar(servers, tok):
    server = servers["grammar"]
    for seed in range(3):
        outs = _batch(server, tok, temperature=1.0, top_p=1.0, sampling_seed=seed)
        for out, constraint in zip(outs[:3], CONSTRAINTS[:3], strict=True):
            assert _follows(tok, constraint, out), (constraint, tok.decode(out))
        # the regex is short: its answers end, and end inside the language
        assert re.fullmatch(REGEX, tok.decode(outs[1], skip_special_tokens=True)), outs[1]
    stats = _last_stats(server)
    assert stats["grammar_forced"] > 0 and stats["grammar_faults"] == 0, stats
