"""A model family's own MTP layer as the draft on the CPU engine: DeepSeek-V3 (MLA, MoE)
with its NextN layer (``build_tiny_deepseek_v3(nextn=True)``; nothing downloaded).

Served by the real host against a plain server of the same checkpoint: the host's NEXTN
(its EAGLE path with ``DeepseekV3ForCausalLMNextN`` as the draft), NEXTN under our
goodput controller (``SGLANG_SPEC_EXT_ADAPTIVE=1``: it attaches to the host's model
draft and chooses draft steps), and HYBRID with no draft path (the NextN layer as its
model draft, suffix drafts beside it), eagerly and with overlap plus the graph emulation
(the host's verify, draft and draft-extend graph runners replayed). Six prompts, greedy,
one at a time and then together: the plain server's output token for token.

The NextN layer copies the target's last layer with the token half of ``eh_proj`` passed
through, so its drafts are sometimes right; on this 2-layer random target they seldom
are (accept lengths near 1 for NEXTN), and the suffix side of HYBRID takes the
repetitive prompts.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from sglang_spec_ext.models.testing.families import build_tiny_deepseek_v3
from sglang_spec_ext.sglang.cpu.graphs import REPLAY_MESSAGE
from sglang_spec_ext.sglang.cpu.serving import GPU_PATH_ENV
from tests.e2e.test_model_draft_adaptive_serving import ADAPTIVE_ENV, _steps_used
from tests.e2e.test_model_families import PROMPTS, _first_difference, family_env
from tests.harness.server import ServerConfig

NEW_TOKENS = 32
STEPS3 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4")  # fmt: skip
GRAPHS = ("--cuda-graph-bs-decode", "1", "2", "4", "8")
EAGER = {
    **GPU_PATH_ENV["off"],
    "SGLANG_SPEC_EXT_CPU_OVERLAP": "0",
    "SGLANG_SPEC_EXT_CPU_GRAPHS": "0",
}
#: Server name -> (extra arguments, environment).
SERVERS = {
    "NEXTN": (("--speculative-algorithm", "NEXTN", *STEPS3), EAGER),
    "NEXTN adaptive": (("--speculative-algorithm", "NEXTN", *STEPS3), {**EAGER, **ADAPTIVE_ENV}),
    "HYBRID": (("--speculative-algorithm", "HYBRID", *STEPS3), EAGER),
    "HYBRID overlap+graphs": (
        ("--speculative-algorithm", "HYBRID", *STEPS3, *GRAPHS),
        GPU_PATH_ENV["both"],
    ),
}


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory, start_module_server):
    """The plain server and every server of SERVERS on one NextN checkpoint, side by side;
    yields ``(servers, prompts, the plain server's outputs)``."""
    from transformers import AutoTokenizer

    began = time.monotonic()
    model = build_tiny_deepseek_v3(tmp_path_factory.mktemp("ds-nextn") / "m", nextn=True)
    configs = {"plain": ServerConfig(model, (), family_env("deepseek_v3", EAGER))}
    for name, (args, env) in SERVERS.items():
        configs[name] = ServerConfig(model, args, family_env("deepseek_v3", env))
    servers = start_module_server.start_all(configs)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = [_greedy(servers["plain"], ids)["output_ids"] for ids in prompts]
    print(f"\ndeepseek_v3 + NextN: {len(servers)} servers up in {time.monotonic() - began:.0f} s")
    yield servers, prompts, expected
    for server in servers.values():
        server.stop(term_wait=3)


def _greedy(server, ids: list[int]) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                           ignore_eos=True)  # fmt: skip


@pytest.mark.parametrize("name", list(SERVERS))
def test_nextn_draft_greedy_parity_with_plain(deepseek, name):
    servers, prompts, expected = deepseek
    server = servers[name]
    got = [_greedy(server, ids) for ids in prompts]
    firsts = [_first_difference(g["output_ids"], w) for g, w in zip(got, expected, strict=True)]
    accept = [round(float(g["meta_info"].get("spec_accept_length") or 0.0), 2) for g in got]
    print(f"\ndeepseek_v3 {name}: accept length per prompt {accept}")
    assert firsts == [None] * len(prompts), f"{name}: first differing token per prompt {firsts}"
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ids: _greedy(server, ids)["output_ids"], prompts))
    assert together == expected, f"{name}: concurrent output differs from plain"
    assert all(a >= 1.0 for a in accept), f"{name}: a request ran no verify step: {accept}"
    log = server.log_path.read_text(errors="replace")
    assert "DeepseekV3ForCausalLMNextN" in log or "NextN" in log, server.log_tail()
    if name.startswith("HYBRID"):
        assert max(accept) > 1.0, f"{name}: no draft token accepted: {accept}"
    if name.endswith("graphs"):
        assert REPLAY_MESSAGE in log, f"{name}: no graph was replayed"
    if name.endswith("adaptive"):
        assert _steps_used(server), f"{name}: the controller logged no step choice"
