"""SUFFIX through the host's real argument pipeline:
prepare_server_args -> resolve_once -> check_server_args."""

from __future__ import annotations

import logging

import pytest
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.server_args import prepare_server_args

from sglang_spec_ext.config import ConfigError
from sglang_spec_ext.plugin import register


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A real model directory: with --model-path dummy the host skips speculative validation.
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    logging.getLogger("sglang").setLevel(logging.ERROR)
    register()


def resolve(model_dir, *extra):
    sa = prepare_server_args(
        [
            "--model-path",
            model_dir,
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--speculative-algorithm",
            "suffix",
            *extra,
        ]
    )
    sa.resolve_once()
    sa.check_server_args()
    return resolved_view(sa)


def test_defaults_resolve(model_dir):
    v = resolve(model_dir)
    assert v.speculative_algorithm == "SUFFIX"
    assert v.speculative_num_draft_tokens == 16
    assert v.speculative_eagle_topk == 8
    assert v.speculative_num_steps == 2
    assert v.enable_mixed_chunk is False
    assert v.max_running_requests == 48
    assert v.disable_overlap_schedule is True  # CPU: the host has no spec overlap there


def test_user_choices_are_kept(model_dir):
    v = resolve(
        model_dir,
        "--speculative-num-draft-tokens",
        "8",
        "--max-running-requests",
        "4",
        "--enable-mixed-chunk",
    )
    assert v.speculative_num_draft_tokens == 8
    assert v.speculative_eagle_topk == 7
    assert v.max_running_requests == 4
    assert v.enable_mixed_chunk is False


def test_chain_drafts_use_topk_one(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_USE_TREE", "0")
    v = resolve(model_dir, "--speculative-num-draft-tokens", "6")
    assert v.speculative_eagle_topk == 1 and v.speculative_num_steps == 6


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pp-size", "2"], "--pp-size 2: SUFFIX does not support pipeline parallelism"),
        (["--enable-watermark"], "--enable-watermark"),
        (["--speculative-adaptive"], "SGLANG_SPEC_EXT_ADAPTIVE=1"),
        (["--speculative-num-draft-tokens", "1000"], r"must be in \[2, 128\]"),
        (["--speculative-num-draft-tokens", "1"], r"must be in \[2, 128\]"),
        (["--speculative-draft-model-path", "{model_dir}"], "model-free"),
        (["--speculative-use-block-verification"], "block-verification"),
    ],
)
def test_incompatible_flags_are_rejected_with_the_flag_named(model_dir, flags, message):
    flags = [f.format(model_dir=model_dir) for f in flags]
    with pytest.raises(Exception, match=message):
        resolve(model_dir, *flags)


def test_decode_server_of_a_pd_pair_resolves(model_dir):
    v = resolve(model_dir, "--disaggregation-mode", "decode",
                "--disaggregation-transfer-backend", "mooncake")  # fmt: skip
    assert v.disaggregation_mode == "decode" and v.speculative_algorithm == "SUFFIX"
    assert v.speculative_num_draft_tokens == 16


@pytest.mark.parametrize(
    ("algo", "flags", "message"),
    [
        ("suffix", ["--disaggregation-mode", "prefill"],
         "--disaggregation-mode prefill: SUFFIX drafts only on the decode server"),
        ("suffix", ["--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"],
         r"--disaggregation-decode-enable-radix-cache is incompatible with speculative"),
        ("hybrid", ["--disaggregation-mode", "decode"],
         "--disaggregation-mode decode: HYBRID's model draft would need its state"),
        ("hybrid", ["--disaggregation-mode", "prefill"], "--disaggregation-mode prefill: HYBRID"),
    ],
)  # fmt: skip
def test_pd_roles_that_cannot_work_are_refused_with_the_reason(model_dir, algo, flags, message):
    run = resolve_hybrid if algo == "hybrid" else resolve
    extra = ["--speculative-draft-model-path", model_dir] if algo == "hybrid" else []
    with pytest.raises(Exception, match=message):
        run(model_dir, *extra, *flags, "--disaggregation-transfer-backend", "mooncake")


@pytest.mark.parametrize(
    "flags",
    [("--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"),
     ("--attn-dp-size", "2", "--tp-size", "2")],
)  # fmt: skip
def test_dp_attention_refuses_hybrid_under_both_spellings(model_dir, flags):
    """Through the host's real pipeline on the CPU engine, which serves DP attention
    (cpu/dp_attention.py): the host turns ``--enable-dp-attention`` into
    ``--attn-dp-size 2`` and the flag reads False after that, so the check reads both.
    SUFFIX resolves (its ranks exchange real verify token counts: workers/dp_tokens.py);
    HYBRID is refused with the algorithm to use instead."""
    resolve(model_dir, *flags)
    with pytest.raises(
        Exception,
        match=r"--attn-dp-size 2: HYBRID does not support DP.*"
        r"--speculative-algorithm SUFFIX",
    ):
        resolve_hybrid(model_dir, "--speculative-draft-model-path", model_dir, *flags)


def test_bad_config_value_stops_resolution(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_MIN_TOKEN_PROB", "1.5")
    with pytest.raises(ConfigError, match=r"SGLANG_SPEC_EXT_MIN_TOKEN_PROB='1.5' is invalid"):
        resolve(model_dir)


def test_unknown_config_variable_stops_resolution(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_EXT_MAX_DEPHT", "3")
    with pytest.raises(ConfigError, match="unknown variable.*SGLANG_SPEC_EXT_MAX_DEPHT"):
        resolve(model_dir)


def resolve_hybrid(model_dir, *extra):
    sa = prepare_server_args(
        ["--model-path", model_dir, "--device", "cpu", "--attention-backend", "torch_native",
         "--speculative-algorithm", "hybrid", *extra]
    )  # fmt: skip
    sa.resolve_once()
    sa.check_server_args()
    return resolved_view(sa)


def test_hybrid_resolves_the_host_model_draft_settings(model_dir):
    import os

    from sglang_spec_ext.sglang.serving.server_args import HYBRID_KIND_ENV

    v = resolve_hybrid(model_dir, "--speculative-draft-model-path", model_dir)
    assert v.speculative_algorithm == "HYBRID"
    assert (v.speculative_num_steps, v.speculative_eagle_topk) == (3, 1)
    assert v.speculative_num_draft_tokens == 4  # a topk-1 chain: steps + 1
    assert v.disable_overlap_schedule is True and v.enable_mixed_chunk is False  # CPU engine
    assert os.environ[HYBRID_KIND_ENV] == "standalone"  # a plain causal LM draft
    v = resolve_hybrid(model_dir, "--speculative-draft-model-path", model_dir,
                       "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                       "--speculative-num-draft-tokens", "6")  # fmt: skip
    assert (v.speculative_num_steps, v.speculative_eagle_topk) == (2, 2)
    assert v.speculative_num_draft_tokens == 6


def test_hybrid_keeps_overlap_scheduling_on_a_gpu_and_on_cpu_when_asked(monkeypatch):
    """The host's hook for HYBRID: overlap stays on (the GPU default for its V2 model-draft
    workers); on the CPU engine only with the overlap emulation switched on."""
    from types import SimpleNamespace

    from sglang_spec_ext.sglang.cpu.overlap import ENV
    from sglang_spec_ext.sglang.serving.server_args import handle_hybrid_server_args

    def handled(device: str):
        args = SimpleNamespace(device=device, disable_overlap_schedule=False,
                               speculative_num_steps=None, speculative_eagle_topk=None,
                               speculative_num_draft_tokens=None, max_running_requests=8,
                               enable_mixed_chunk=False, page_size=1, attention_backend=None)  # fmt: skip
        handle_hybrid_server_args("HYBRID", args)
        return args.disable_overlap_schedule

    monkeypatch.delenv(ENV, raising=False)
    assert handled("cuda") is False
    assert handled("cpu") is True
    monkeypatch.setenv(ENV, "1")
    assert handled("cpu") is False


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((), "--speculative-draft-model-path is missing"),
        (("--speculative-use-rejection-sampling",), "--speculative-use-rejection-sampling"),
        (("--speculative-eagle-topk", "9"), "--speculative-eagle-topk 9"),
    ],
)
def test_hybrid_bad_flags_are_rejected_with_the_flag_named(model_dir, flags, message):
    extra = () if not flags else ("--speculative-draft-model-path", model_dir)
    with pytest.raises(Exception, match=message):
        resolve_hybrid(model_dir, *extra, *flags)


#: Draft configs by kind: the tiny target's own config under each architecture (EAGLE-2
#: heads are ``LlamaForCausalLMEagle``, EAGLE3 heads ``LlamaForCausalLMEagle3`` in the host).
DRAFT_ARCHITECTURES = {"standalone": "LlamaForCausalLM", "eagle": "LlamaForCausalLMEagle",
                       "eagle3": "LlamaForCausalLMEagle3"}  # fmt: skip


def _draft_config(model_dir, out_dir, architecture: str):
    import json
    from pathlib import Path

    config = json.loads((Path(model_dir) / "config.json").read_text())
    config["architectures"] = [architecture] if architecture else []
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "config.json").write_text(json.dumps(config))
    return str(out_dir)


@pytest.mark.parametrize("kind", [*DRAFT_ARCHITECTURES, "no architectures"])
def test_hybrid_draft_kind_by_path_through_the_hosts_config(model_dir, tmp_path, kind):
    from sglang_spec_ext.sglang.model_drafts.draft_kind import draft_kind

    path = _draft_config(model_dir, tmp_path / "draft", DRAFT_ARCHITECTURES.get(kind, ""))
    if kind in DRAFT_ARCHITECTURES:
        assert draft_kind(path) == kind
    else:  # the host's config resolution itself fails on it: say so, do not guess
        with pytest.raises(ValueError, match="cannot read the draft model's config"):
            draft_kind(path)
    assert draft_kind(path, "eagle") == "eagle"  # the setting overrides detection
    with pytest.raises(ValueError, match="hybrid_draft"):
        draft_kind(path, "medusa")


#: Resolves hub ids in a fresh interpreter: the hub client reads its cache location and
#: offline switch from the environment when it is imported.
_BY_ID = """
import json, sys
from sglang_spec_ext.sglang.model_drafts.draft_kind import draft_kind
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = draft_kind(name, revision="main")
    except ValueError as exc:
        out[name] = "error: " + str(exc)
print(json.dumps(out))
"""


def test_hybrid_draft_kind_by_hub_id_from_the_hub_cache(model_dir, tmp_path):
    """A hub id resolves the way the host resolves it (its ``get_config``: the hub cache
    here, offline, laid out as the hub client writes it), so an EAGLE or EAGLE3 head
    given by id runs on the host's EAGLE path; an id nothing can resolve is a clear
    error naming the flag and the override, not a guess."""
    import json
    import subprocess
    import sys

    cache = tmp_path / "hub"
    revision = "0123456789abcdef0123456789abcdef01234567"
    ids = {}
    for kind, architecture in DRAFT_ARCHITECTURES.items():
        repo = cache / f"models--spec-ext-test--{kind}-draft"
        _draft_config(model_dir, repo / "snapshots" / revision, architecture)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        ids[f"spec-ext-test/{kind}-draft"] = kind
    from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env

    env = cpu_serving_env(extra={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
                                 "HF_HOME": str(tmp_path / "hf-home")})  # fmt: skip
    missing = "spec-ext-test/not-in-the-cache"
    run = subprocess.run(
        [sys.executable, "-c", _BY_ID, *ids, missing],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert {name: got[name] for name in ids} == ids
    assert got[missing].startswith("error: HYBRID: cannot read the draft model's config")
    assert "--speculative-draft-model-path 'spec-ext-test/not-in-the-cache'" in got[missing]
    assert "SGLANG_SPEC_EXT_HYBRID_DRAFT=standalone|eagle|eagle3" in got[missing]


# HYBRID on a target with MTP layers (the tiny MiMo of testing_mtp.py): with no draft
# path the target itself is the draft checkpoint, loaded by the host as its MTP class on
# the EAGLE path, as NEXTN serves it.


@pytest.fixture(scope="module")
def mimo_dir(tmp_path_factory):
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    return str(build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "m", seed=0))


def test_hybrid_on_an_mtp_target_drafts_with_its_mtp_layers(mimo_dir):
    import os

    from sglang_spec_ext.sglang.serving.server_args import HYBRID_KIND_ENV

    logged: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logged.append(record.getMessage())
    log = logging.getLogger("sglang_spec_ext")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        v = resolve_hybrid(mimo_dir)  # no --speculative-draft-model-path
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert v.speculative_algorithm == "HYBRID"
    assert v.speculative_draft_model_path == mimo_dir  # the target's own checkpoint
    assert os.environ[HYBRID_KIND_ENV] == "eagle"  # MiMoMTP runs on the host's EAGLE path
    assert (v.speculative_num_steps, v.speculative_eagle_topk) == (3, 1)
    assert v.speculative_num_draft_tokens == 4
    assert any("the target's own MTP layers draft (MiMoForCausalLM as MiMoMTP" in m
               for m in logged), logged  # fmt: skip
    # the model directory given as the draft path: the same server
    os.environ.pop(HYBRID_KIND_ENV)
    w = resolve_hybrid(mimo_dir, "--speculative-draft-model-path", mimo_dir)
    assert os.environ[HYBRID_KIND_ENV] == "eagle"
    fields = ("speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens", "disable_overlap_schedule")  # fmt: skip
    assert {f: getattr(w, f) for f in fields} == {f: getattr(v, f) for f in fields}


def test_hybrid_without_a_draft_path_or_mtp_layers_names_the_flag(model_dir):
    with pytest.raises(Exception) as err:
        resolve_hybrid(model_dir, "--speculative-num-steps", "3")
    message = str(err.value)
    assert "--speculative-draft-model-path is missing" in message
    assert "unless the target carries MTP layers" in message
    assert f"{model_dir!r} (LlamaForCausalLM) has none" in message


def test_hybrid_draft_kind_of_an_mtp_checkpoint_is_eagle(mimo_dir, model_dir):
    from sglang.srt.utils.hf_transformers_utils import get_config

    from sglang_spec_ext.sglang.model_drafts.draft_kind import (
        declared_mtp_layers,
        draft_kind,
        host_draft_architecture,
        mtp_draft_architecture,
        target_mtp_draft,
    )

    assert draft_kind(mimo_dir) == "eagle"  # not a plain causal LM: the host loads MiMoMTP
    assert draft_kind(model_dir) == "standalone"
    assert target_mtp_draft(mimo_dir) == ("MiMoMTP", "MiMoForCausalLM")
    assert target_mtp_draft(model_dir) == (None, "LlamaForCausalLM")
    mimo = get_config(mimo_dir, trust_remote_code=False)
    assert declared_mtp_layers(mimo) == 1
    assert host_draft_architecture(mimo) == "MiMoMTP"
    assert mimo.architectures == ["MiMoForCausalLM"]  # the host's mapping ran on a copy
    # The host's mapping, pinned on configs of other architectures (names only):
    llama = get_config(model_dir, trust_remote_code=False)
    assert host_draft_architecture(llama) == "LlamaForCausalLM"
    deepseek = llama.__class__.from_dict({**llama.to_dict(), "num_nextn_predict_layers": 1,
                                          "architectures": ["DeepseekV3ForCausalLM"]})  # fmt: skip
    assert mtp_draft_architecture(deepseek) == "DeepseekV3ForCausalLMNextN"
    # mapped by the host, but no MTP layers declared (most Qwen3-MoE checkpoints): no draft
    qwen3_moe = llama.__class__.from_dict({**llama.to_dict(),
                                           "architectures": ["Qwen3MoeForCausalLM"]})  # fmt: skip
    assert host_draft_architecture(qwen3_moe) == "Qwen3MoeForCausalLMMTP"
    assert mtp_draft_architecture(qwen3_moe) is None
    no_layers = llama.__class__.from_dict({**mimo.to_dict(), "num_nextn_predict_layers": 0})
    assert mtp_draft_architecture(no_layers) is None
