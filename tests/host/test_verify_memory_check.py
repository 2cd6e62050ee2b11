"""The start-up check of verify-width buffers (sglang/verify/memory_check.py) on the host.

In a fresh interpreter (the host's HookRegistry is process-wide): the plugin is
registered the way SGLang's ``load_plugins`` does (``plugin.register``, which installs
the runtime hooks), the host's config is published with the issue's settings
(SUFFIX, ``--speculative-num-draft-tokens 64``, ``--cuda-graph-max-bs-decode 48``,
``--context-length 131072``), and the host's real ``capture_cuda_graphs`` (what
``ModelRunner.init_cuda_graphs`` runs after the KV pools and attention backends are
built) is called for the target runner. The capture batch sizes come from the host's
real ``get_batch_sizes_to_capture``.

Stand-ins, because the real ones need a GPU: the model runner (attributes a
flashinfer target runner of a 128k-context, 128,256-token-vocabulary model has; a real
ModelRunner loads a model onto a CUDA device) and the host's
``get_available_gpu_memory`` (which asks the CUDA driver), returning the free memory
the scenario sets. The published config's CUDA-graph settings are set the way the
host's resolution leaves them for a GPU (decode graphs on, its default batch list).
"""

from __future__ import annotations

from tests.harness.subproc import snippet_result

SCENARIO = """
import json, sys, types
import sglang.srt.utils as host_utils
from sglang_spec_ext.plugin import register

res = {"registered": register()}
from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import (
    capture_cuda_graphs,
)
from sglang.srt.runtime_context import get_context, get_server_args

ALGO, FREE_GIB = sys.argv[1], float(sys.argv[2])
get_context().override_server_args(
    speculative_algorithm=ALGO, speculative_num_draft_tokens=64, speculative_eagle_topk=8,
    speculative_num_steps=8, cuda_graph_max_bs_decode=48, context_length=131072,
    mem_fraction_static=0.9, page_size=1,
).install()
get_context().override("test: resolved for a GPU", cuda_graph_config=CudaGraphConfig.from_dict(
    {"decode": {"backend": "full", "bs": [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]}}))

asked = []
def free_memory(device, gpu_id, distributed=False, empty_cache=True, cpu_group=None):
    asked.append([str(device), gpu_id, distributed])
    return FREE_GIB
host_utils.get_available_gpu_memory = free_memory  # stand-in: asks the CUDA driver

runner = types.SimpleNamespace(  # stand-in for the target's ModelRunner
    is_draft_worker=False, device="cuda", gpu_id=0, server_args=get_server_args(),
    model_config=types.SimpleNamespace(context_len=131072, vocab_size=128256),
    req_to_token_pool=types.SimpleNamespace(size=48),
    decode_attention_backend_str="flashinfer", prefill_attention_backend_str="flashinfer",
    attn_backend=types.SimpleNamespace(num_wrappers=1), pre_model_load_memory=79.0,
    max_shared_logits_buffer_rows=lambda: 0,
)
try:
    capture_cuda_graphs(model_runner=runner)
    res["outcome"] = "returned"
except Exception as e:  # the stand-in runner cannot go further than the check
    res["outcome"], res["message"] = type(e).__name__, str(e)
res["asked"] = asked
print("RESULT", json.dumps(res))
"""


def _run(algo: str, free_gib: float, env: dict[str, str] | None = None) -> dict:
    code = SCENARIO.replace("sys.argv[1], float(sys.argv[2])", f"{algo!r}, {free_gib!r}")
    return snippet_result(code, env=env)


def test_a_verify_width_that_does_not_fit_is_refused_before_graph_capture():
    res = _run("SUFFIX", 3.0)  # 1.88 GiB graph buffers + 1.47 GiB logits > 3 GiB
    assert res["outcome"] == "VerifyMemoryError", res
    msg = res["message"]
    for flag in (
        "--speculative-num-draft-tokens 64",
        "--cuda-graph-max-bs-decode",
        "--context-length 131072",
        "--mem-fraction-static 0.9",
    ):
        assert flag in msg, msg
    assert "3.34 GiB" in msg and "max batch 48" in msg and "widths [64]" in msg, msg
    assert res["asked"] == [["cuda", 0, False]], res


def test_a_width_that_fits_and_other_algorithms_go_on_to_the_hosts_capture():
    for algo, free_gib in (("SUFFIX", 40.0), ("NGRAM", 3.0)):
        res = _run(algo, free_gib)
        # past the check, the host's own capture starts (and stops at the stand-in)
        assert res["outcome"] not in ("VerifyMemoryError", "returned"), res
        assert "sglang-spec-ext" not in res.get("message", ""), res
        assert res["asked"] == ([["cuda", 0, False]] if algo == "SUFFIX" else []), res


def test_adaptive_suffix_counts_a_verify_graph_per_width_it_can_choose():
    """With the controller on, SUFFIX captures the target's verify graphs at every width
    it can choose (adaptive_worker.verify_graph_widths): the check sizes all of them."""
    from sglang_spec_ext.sglang.workers.adaptive_worker import verify_graph_widths

    res = _run("SUFFIX", 3.0, env={"SGLANG_SPEC_EXT_ADAPTIVE": "1"})
    assert res["outcome"] == "VerifyMemoryError", res
    widths = [64, *(w for w in verify_graph_widths(64) if w != 64)]
    assert len(widths) > 2
    assert f"{len(widths)} graph runner(s) of widths {widths}" in res["message"], res["message"]


def test_verify_graph_widths_bounds_the_widths_sized(monkeypatch):
    """SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS=2: graphs at the startup width and the two
    narrowest widths the controller can choose (the rest verify eagerly); the check sizes
    exactly those."""
    from sglang_spec_ext.sglang.workers.adaptive_worker import (
        verify_graph_widths,
        verify_graph_widths_all,
    )

    env = {"SGLANG_SPEC_EXT_ADAPTIVE": "1", "SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    every = verify_graph_widths_all(64)
    assert verify_graph_widths(64) == (*every[:2], 64)
    res = _run("SUFFIX", 3.0, env=env)
    assert res["outcome"] == "VerifyMemoryError", res
    widths = [64, *every[:2]]
    assert f"3 graph runner(s) of widths {widths}" in res["message"], res["message"]
    monkeypatch.setenv("SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS", "-1")
    assert verify_graph_widths(64) == every and len(every) > 3
