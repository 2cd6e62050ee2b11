"""torch_native draft attention for the host's model-draft workers installs into the real
host's DraftBackendFactory, only on the CPU engine, and refuses GPU-only draft backends
with an error naming the flag (fresh interpreters: the host binds CPU paths at import)."""

from __future__ import annotations

from sglang_spec_ext.sglang.cpu.draft_attention import DECODE_TARGET, EXTEND_TARGET, INSTALLED_NAME
from tests.harness.subproc import snippet_result

SCENARIO = """
import json
from types import SimpleNamespace
from unittest import mock
import sglang.srt.utils as host_utils
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative import draft_utils
from sglang_spec_ext.sglang.cpu import draft_attention as da

res = {}
real_is_cuda = host_utils.is_cuda
host_utils.is_cuda = lambda: True
res["on_cuda"] = da.install_draft_attention()
host_utils.is_cuda = real_is_cuda
res["first"] = da.install_draft_attention()
res["second"] = da.install_draft_attention()
res["hooks"] = sorted(t for t in HookRegistry._hooks if "DraftBackendFactory" in t)
res["hook_counts"] = [len(HookRegistry._hooks[t]) for t in res["hooks"]]

factory = object.__new__(draft_utils.DraftBackendFactory)
factory.topk, factory.speculative_num_steps, factory.qsa_profile = 2, 3, None
pool = SimpleNamespace(req_to_token=None)
factory.draft_model_runner = SimpleNamespace(
    device="cpu", req_to_token_pool=pool, token_to_kv_pool=SimpleNamespace()
)
factory.draft_attn_backend = None
with mock.patch("sglang.srt.runtime_context.attention_backends",
                return_value=("torch_native", "torch_native")), \\
     mock.patch.object(da, "_make_step_backend", lambda runner, masked=False: SimpleNamespace()):
    backend = factory.create_decode_backend()
    res["decode"] = [type(backend).__name__, len(backend.attn_backends),
                     backend.decode_attention_backend_str]
    factory.draft_attn_backend = "triton"
    try:
        factory.create_decode_backend()
        res["refused"] = None
    except ValueError as e:
        res["refused"] = str(e)
print("RESULT " + json.dumps(res))
"""


def _result(code: str, env: dict[str, str] | None = None) -> dict:
    return snippet_result(code, env=env, cpu_engine=True)


def test_installs_on_the_cpu_engine_only_once_and_builds_torch_native_drafts():
    res = _result(SCENARIO)
    assert res["on_cuda"] == []
    assert res["first"] == res["second"] == [INSTALLED_NAME]
    assert res["hooks"] == sorted([DECODE_TARGET, EXTEND_TARGET])
    assert res["hook_counts"] == [1, 1]
    # steps 3 -> two per-step backends, stamped as torch_native like the host's own
    assert res["decode"] == ["TorchNativeMultiStepDraftBackend", 2, "torch_native"]
    assert res["refused"] is not None
    assert "--speculative-draft-attention-backend triton" in res["refused"]
    assert "torch_native" in res["refused"]


def test_the_plugin_installs_it_through_its_runtime_hooks():
    code = (
        "import json\nfrom sglang_spec_ext.plugin import install_runtime_hooks\n"
        "print('RESULT ' + json.dumps(install_runtime_hooks()))\n"
    )
    assert INSTALLED_NAME in _result(code)
    assert INSTALLED_NAME not in _result(code, env={"SGLANG_SPEC_EXT_CPU_FALLBACKS": "0"})
