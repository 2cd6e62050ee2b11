"""LoRA with SUFFIX and HYBRID through the host's real argument pipeline
(prepare_server_args -> resolve_once -> check_server_args, where the host's
``check_lora_speculative_compatibility`` runs), and the CPU engine's LoRA fallbacks
(sglang_spec_ext/sglang/cpu/fallbacks/lora.py) installed by the real ``load_plugins``."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.server_args import prepare_server_args

from sglang_spec_ext.plugin import register
from sglang_spec_ext.sglang.cpu.fallbacks.lora import (
    LORA_ARGS_TARGET,
    LORA_TARGETS,
    NoPinnedMemory,
)
from sglang_spec_ext.sglang.serving.lora_support import TARGET
from tests.harness.subproc import snippet_result


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A real model directory: with --model-path dummy the host skips speculative validation.
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture(scope="module")
def adapter_dir(model_dir, tmp_path_factory):
    from sglang_spec_ext.models.testing.lora import build_lora_adapter

    return str(build_lora_adapter(model_dir, tmp_path_factory.mktemp("lora") / "a", seed=1))


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    logging.getLogger("sglang").setLevel(logging.ERROR)
    register()


def resolve(model_dir, adapter_dir, algorithm, *extra, lora=True):
    lora_args = ["--lora-paths", f"A={adapter_dir}", "--lora-backend", "torch_native"]
    sa = prepare_server_args(
        ["--model-path", model_dir, "--device", "cpu", "--attention-backend", "torch_native",
         "--speculative-algorithm", algorithm, *(lora_args if lora else ()), *extra]
    )  # fmt: skip
    sa.resolve_once()
    sa.check_server_args()
    return resolved_view(sa)


def _draft(model_dir):
    return ("--speculative-draft-model-path", model_dir)


def _lora_names(view) -> list[str]:
    return [getattr(ref, "lora_name", None) for ref in view.lora_paths]


def test_the_hook_is_on_the_host_check():
    import sglang.srt.arg_groups.lora_hook as lora_hook

    assert getattr(lora_hook.check_lora_speculative_compatibility, "__wrapped__", None)
    assert TARGET == f"{lora_hook.__name__}.check_lora_speculative_compatibility"


@pytest.mark.parametrize("algorithm", ["suffix", "SUFFIX"])
def test_suffix_with_lora_resolves_like_ngram(model_dir, adapter_dir, algorithm):
    v = resolve(model_dir, adapter_dir, algorithm, "--speculative-num-draft-tokens", "8")
    assert v.speculative_algorithm == "SUFFIX"
    assert v.enable_lora is True  # --lora-paths turns LoRA on (the host's own rule)
    assert _lora_names(v) == ["A"]
    assert v.speculative_num_draft_tokens == 8


def test_suffix_with_lora_enabled_at_run_time_only(model_dir, adapter_dir):
    """--enable-lora with no initial adapter (all loaded via /load_lora_adapter)."""
    v = resolve(model_dir, adapter_dir, "SUFFIX", "--enable-lora", "--max-lora-rank", "8",
                "--lora-target-modules", "all", lora=False)  # fmt: skip
    assert v.enable_lora is True and v.lora_paths == []


def test_hybrid_with_lora_resolves_like_eagle(model_dir, adapter_dir):
    v = resolve(model_dir, adapter_dir, "hybrid", *_draft(model_dir))
    assert v.speculative_algorithm == "HYBRID"
    assert v.enable_lora is True and _lora_names(v) == ["A"]
    assert (v.speculative_num_steps, v.speculative_eagle_topk) == (3, 1)


def test_hybrid_refuses_what_the_host_refuses_for_eagle(model_dir, adapter_dir, monkeypatch):
    # The host's EAGLE rule for LoRA, reached through our hook with HYBRID's name.
    monkeypatch.setenv("SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "1")
    with pytest.raises(ValueError) as err:
        resolve(model_dir, adapter_dir, "HYBRID", *_draft(model_dir))
    text = str(err.value)
    assert "SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1" in text
    assert "HYBRID follows the host's EAGLE rules" in text
    # SUFFIX follows NGRAM's, which the host does not restrict.
    assert resolve(model_dir, adapter_dir, "SUFFIX").speculative_algorithm == "SUFFIX"


@pytest.mark.parametrize("algorithm", ["SUFFIX", "HYBRID"])
def test_speculative_adaptive_is_refused_with_the_flag_named(model_dir, adapter_dir, algorithm):
    extra = _draft(model_dir) if algorithm == "HYBRID" else ()
    with pytest.raises(ValueError, match="--speculative-adaptive"):
        resolve(model_dir, adapter_dir, algorithm, *extra, "--speculative-adaptive")


def test_the_host_eagle_rule_itself_names_hybrid(model_dir, adapter_dir):
    """Our validation refuses --speculative-adaptive before the LoRA check runs; the
    hook alone (the host's function, hooked) gives the host's reason for HYBRID."""
    import sglang.srt.arg_groups.lora_hook as lora_hook

    sa = prepare_server_args(["--model-path", model_dir, "--speculative-algorithm", "HYBRID",
                              "--speculative-adaptive", "--lora-paths", f"A={adapter_dir}"])  # fmt: skip
    with pytest.raises(ValueError, match="HYBRID follows.*does not support --speculative-adaptive"):
        lora_hook.check_lora_speculative_compatibility(sa)


@pytest.mark.parametrize("algorithm", ["SUFFIX", "HYBRID"])
def test_our_adaptive_controller_is_refused_with_lora(
    model_dir, adapter_dir, algorithm, monkeypatch
):
    monkeypatch.setenv("SGLANG_SPEC_EXT_ADAPTIVE", "1")
    extra = _draft(model_dir) if algorithm == "HYBRID" else ()
    with pytest.raises(ValueError, match="SGLANG_SPEC_EXT_ADAPTIVE=1") as err:
        resolve(model_dir, adapter_dir, algorithm, *extra)
    assert "--enable-lora" in str(err.value)
    # Without LoRA the controller is fine.
    v = resolve(model_dir, adapter_dir, algorithm, *extra, lora=False)
    assert v.speculative_algorithm == algorithm and not v.enable_lora


def test_the_hosts_own_algorithms_keep_the_hosts_rules(model_dir, adapter_dir):
    # NGRAM passes, STANDALONE is refused with the host's own message.
    assert resolve(model_dir, adapter_dir, "NGRAM").speculative_algorithm == "NGRAM"
    with pytest.raises(ValueError, match="LoRA is only compatible with NGRAM, EAGLE"):
        resolve(model_dir, adapter_dir, "STANDALONE", *_draft(model_dir))


def test_no_pinned_memory_mode_drops_pinning_only_inside():
    with NoPinnedMemory():
        a = torch.tensor([1, 2], dtype=torch.int32, pin_memory=True)
        b = torch.zeros(3).pin_memory()
        c = torch.empty((2,), pin_memory=True)
    assert a.tolist() == [1, 2] and b.tolist() == [0.0] * 3 and c.shape == (2,)
    if not torch.cuda.is_available():  # outside the mode the host's calls fail here
        with pytest.raises(RuntimeError):
            torch.zeros(3).pin_memory()


CPU_ENGINE = """
import json, os, torch
from types import SimpleNamespace
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
res = {"patched": sorted(HookRegistry._patched)}
def backend(*flags):
    sa = prepare_server_args(["--model-path", MODEL, "--device", "cpu", "--attention-backend",
        "torch_native", "--lora-paths", "A=" + ADAPTER, *flags])
    sa.resolve_once()
    try:
        sa.check_server_args()
    except ValueError as e:
        return "refused: " + str(e)
    return resolved_view(sa).lora_backend
res["default"] = backend()
res["explicit"] = backend("--lora-backend", "torch_native")
res["triton"] = backend("--lora-backend", "triton")
res["suffix"] = backend("--speculative-algorithm", "SUFFIX")
# The torch_native backend's per-batch layout (pinned staging tensors in the host).
from sglang.srt.lora.backend.torch_backend import TorchNativeLoRABackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
be = TorchNativeLoRABackend(max_loras_per_batch=3, device=torch.device("cpu"))
fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=3,
                     spec_info=SimpleNamespace(draft_token_num=4))
be.prepare_lora_batch(fb, [1, 1, 2], [0, 8, 8], [0.0, 2.0, 2.0], False)
res["layout"] = [be.batch_info.seg_lens_cpu.tolist(), be.batch_info.weight_indices_cpu.tolist()]
# Graph runners (CPU graph emulation / CUDA graphs): metadata for 4 requests x 3 tokens.
be.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=4, num_tokens_per_req=3)
fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=2,
                     spec_info=SimpleNamespace(draft_token_num=3))
be.prepare_lora_batch(fb, [1, 2], [0, 8, 8], [0.0, 2.0, 2.0], True)
res["graph"] = [be.batch_info.weight_indices[:6].tolist(), be.batch_info.num_segments,
                be.batch_info.weight_indices.numel()]
print("RESULT " + json.dumps(res))
"""


def test_cpu_engine_lora_fallbacks_through_load_plugins(model_dir, adapter_dir):
    code = f"MODEL = {model_dir!r}\nADAPTER = {adapter_dir!r}\n" + CPU_ENGINE
    res = snippet_result(code, cpu_engine=True)
    assert {LORA_ARGS_TARGET, TARGET, *LORA_TARGETS} <= set(res["patched"])
    assert res["default"] == res["explicit"] == res["suffix"] == "torch_native"
    assert res["triton"].startswith("refused: --lora-backend triton does not run on the CPU")
    # A verify batch: every request gets draft_token_num rows; consecutive requests of
    # one adapter share a segment.
    assert res["layout"] == [[8, 4], [1, 2]]
    # Graph metadata is per token (the host sizes it per request and fails to capture).
    assert res["graph"] == [[1, 1, 1, 2, 2, 2], 6, 12]


OFF_CPU_ENGINE = """
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.plugins.hook_registry import HookRegistry
print("RESULT " + json.dumps(sorted(HookRegistry._patched)))
"""


def test_only_the_speculative_check_is_hooked_off_the_cpu_engine():
    patched = set(snippet_result(OFF_CPU_ENGINE, cpu_engine=False))
    assert TARGET in patched
    assert not {LORA_ARGS_TARGET, *LORA_TARGETS} & patched
