"""A model family's own MTP layer as the draft on the CPU engine: DeepSeek-V3 (MLA, MoE)
with its NextN layer (``build_tiny_deepseek_v3(nextn=True)``) and Qwen3-Next (Gated
DeltaNet hybrid, MoE) with its MTP layer (``build_tiny_qwen3_next(mtp=True)``); nothing
downloaded.

Served by the real host against a plain server of the same checkpoint: the host's NEXTN
(its EAGLE path with ``DeepseekV3ForCausalLMNextN`` as the draft), NEXTN under our
goodput controller (``SGLANG_SPEC_EXT_ADAPTIVE=1``: it attaches to the host's model
draft and chooses draft steps), and HYBRID with no draft path (the NextN layer as its
model draft, suffix drafts beside it), eagerly and with overlap plus the graph emulation
(the host's verify, draft and draft-extend graph runners replayed; DeepSeek only: the
plugin refuses overlap and the graph emulation for Mamba-state models on the CPU engine).
Six prompts, greedy, one at a time and then together: the plain server's output token for
token.

Each MTP layer copies a target layer with the token half of its input projection passed
through, so its drafts are sometimes right; on these random targets they seldom are
(accept lengths near 1 for NEXTN), and the suffix side of HYBRID takes the repetitive
prompts.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest

from sglang_spec_ext.models.testing.families import (
    build_tiny_deepseek_v3,
    build_tiny_qwen3_next,
)
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
#: Family -> (the checkpoint with its MTP layer, the host's draft class, its servers).
FAMILIES_MTP = {
    "deepseek_v3": (
        lambda d: build_tiny_deepseek_v3(d, nextn=True),
        "DeepseekV3ForCausalLMNextN",
        tuple(SERVERS),
    ),
    "qwen3_next": (
        lambda d: build_tiny_qwen3_next(d, mtp=True),
        "Qwen3NextForCausalLMMTP",
        ("NEXTN", "NEXTN adaptive", "HYBRID"),
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES_MTP))
def family_mtp(request, tmp_path_factory, start_module_server):
    """One family's plain server and its MTP servers, side by side (the previous family's
    stopped first); yields ``(family, servers, prompts, the plain server's outputs, the
    model directory)``."""
    from transformers import AutoTokenizer

    family = request.param
    build, _draft, names = FAMILIES_MTP[family]
    began = time.monotonic()
    model = build(tmp_path_factory.mktemp("mtp") / family)
    configs = {"plain": ServerConfig(model, (), family_env(family, EAGER))}
    for name in names:
        args, env = SERVERS[name]
        configs[name] = ServerConfig(model, args, family_env(family, env))
    servers = start_module_server.start_all(configs)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = [_greedy(servers["plain"], ids)["output_ids"] for ids in prompts]
    print(f"\n{family} + MTP: {len(servers)} servers up in {time.monotonic() - began:.0f} s")
    yield family, servers, prompts, expected, model
    for server in servers.values():
        server.stop(term_wait=3)


def _greedy(server, ids: list[int]) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                           ignore_eos=True)  # fmt: skip


def test_mtp_draft_greedy_parity_with_plain(family_mtp):
    """Every MTP server of the family: plain's greedy output sequentially and together,
    a verify step per request, the family's own MTP draft class loaded."""
    family, servers, prompts, expected, model = family_mtp
    for name in FAMILIES_MTP[family][2]:
        _check(family, name, servers[name], prompts, expected)
    if family == "deepseek_v3":
        _check_mla_against_transformers(model, prompts, expected)


def _check(family: str, name: str, server, prompts, expected) -> None:
    got = [_greedy(server, ids) for ids in prompts]
    firsts = [_first_difference(g["output_ids"], w) for g, w in zip(got, expected, strict=True)]
    accept = [round(float(g["meta_info"].get("spec_accept_length") or 0.0), 2) for g in got]
    print(f"\n{family} {name}: accept length per prompt {accept}")
    assert firsts == [None] * len(prompts), f"{name}: first differing token per prompt {firsts}"
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda ids: _greedy(server, ids)["output_ids"], prompts))
    assert together == expected, f"{name}: concurrent output differs from plain"
    assert all(a >= 1.0 for a in accept), f"{name}: a request ran no verify step: {accept}"
    log = server.log_path.read_text(errors="replace")
    assert FAMILIES_MTP[family][1] in log, server.log_tail()  # the family's own MTP draft
    if name.startswith("HYBRID"):
        assert max(accept) > 1.0, f"{name}: no draft token accepted: {accept}"
    if name.endswith("graphs"):
        assert REPLAY_MESSAGE in log, f"{name}: no graph was replayed"
    if name.endswith("adaptive"):
        assert _steps_used(server), f"{name}: the controller logged no step choice"


def _check_mla_against_transformers(model, prompts, expected) -> None:
    """The absorbed MLA method the plugin picks for ``torch_native`` (``cpu/mla.py``)
    against transformers' own DeepSeek-V3 (its MHA form over the decompressed latent),
    greedy, on the same weights (transformers ignores the NextN layer): the plain server
    every comparison here and in the model matrix is made against is itself right.
    (transformers' attention needs as many KV heads as query heads here.)"""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    config.num_key_value_heads = config.num_attention_heads
    reference = AutoModelForCausalLM.from_pretrained(model, config=config, dtype=torch.float32)
    for ids, want in zip(prompts[:3], expected[:3], strict=True):
        out = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False)  # fmt: skip
        got = out[0, len(ids) :].tolist()
        assert got == want, f"first difference at {_first_difference(got, want)}"
