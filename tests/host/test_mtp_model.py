"""The tiny MiMo-shaped model (sglang_spec_ext/models/testing/mtp.py) against the real host code:
argument resolution of NEXTN / EAGLE with and without a draft path, the host's model
config naming the draft ``MiMoMTP``, and both host loaders filling every parameter.

The loaders run in a fresh interpreter (distributed groups and the runtime context are
process-wide)."""

from __future__ import annotations

import pytest
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.server_args import prepare_server_args

from sglang_spec_ext.plugin import register
from tests.harness.subproc import snippet_result

STEPS1 = ["--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    return str(build_tiny_mimo_mtp(tmp_path_factory.mktemp("mimo") / "m", seed=0))


def _resolve(model_dir, *extra):
    register()
    sa = prepare_server_args(["--model-path", model_dir, "--device", "cpu",
                              "--attention-backend", "torch_native", *extra])  # fmt: skip
    sa.resolve_once()
    sa.check_server_args()
    return resolved_view(sa)


FIELDS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_num_draft_tokens", "disable_overlap_schedule")  # fmt: skip


def test_nextn_and_eagle_resolve_alike_with_and_without_a_draft_path(mimo):
    got = {}
    for algo in ("NEXTN", "EAGLE", "nextn"):
        for path in ((), ("--speculative-draft-model-path", mimo)):
            v = _resolve(mimo, "--speculative-algorithm", algo, *path, *STEPS1)
            got[algo, bool(path)] = {f: getattr(v, f) for f in FIELDS}
    for (algo, has_path), fields in got.items():
        assert fields["speculative_algorithm"] == "EAGLE", (algo, fields)
        # MiMo is not among the architectures the host points at their own checkpoint:
        # without a path the draft worker's model config falls back to --model-path
        assert fields["speculative_draft_model_path"] == (mimo if has_path else None)
        assert fields == got["NEXTN", has_path]
    assert got["NEXTN", False]["disable_overlap_schedule"] is True  # CPU: no spec overlap


LOAD = """
from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders
cpu_placeholders.install()
import json, tempfile, torch
from safetensors.torch import load_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.runtime_context import get_context, get_parallel

model_dir = {model_dir!r}
target_cfg = ModelConfig(model_path=model_dir)
draft_cfg = ModelConfig(model_path=model_dir, is_draft_model=True)
get_context().override_server_args(device="cpu").install()
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                             distributed_init_method="file://" + tempfile.mktemp())
initialize_model_parallel(backend="gloo")
get_parallel().override_permanently(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0,
                                    attn_cp_rank=0, moe_ep_rank=0, moe_tp_rank=0, moe_dp_rank=0)
from sglang.srt.models.mimo import MiMoForCausalLM
from sglang.srt.models.mimo_mtp import MiMoMTP

weights = load_file(model_dir + "/model.safetensors")
res = {{"archs": [target_cfg.hf_config.architectures, draft_cfg.hf_config.architectures]}}
models = {{}}
for cls, cfg in ((MiMoForCausalLM, target_cfg.hf_config), (MiMoMTP, draft_cfg.hf_config)):
    model = cls(cfg)
    for p in model.parameters():
        p.data.fill_(float("nan"))
    model.load_weights(iter(weights.items()))
    models[cls.__name__] = dict(model.named_parameters())
    res[cls.__name__] = sorted(n for n, p in model.named_parameters() if torch.isnan(p).any())
t, d = models["MiMoForCausalLM"], models["MiMoMTP"]
res["shared_layer"] = all(
    torch.equal(d["model.mtp_block." + n.removeprefix("model.layers.0.")], p)
    for n, p in t.items() if n.startswith("model.layers.0.")
)
res["mtp_params"] = sorted(d)
print("RESULT " + json.dumps(res))
"""


def test_host_resolves_mimo_mtp_and_loads_every_parameter(mimo):
    res = snippet_result(LOAD.format(model_dir=mimo), cpu_engine=True)
    assert res["archs"] == [["MiMoForCausalLM"], ["MiMoMTP"]]
    assert res["MiMoForCausalLM"] == [] and res["MiMoMTP"] == []  # nothing left unloaded
    assert res["shared_layer"]
    assert "model.input_proj.weight" in res["mtp_params"]
    assert "model.mtp_block.self_attn.qkv_proj.bias" in res["mtp_params"]
