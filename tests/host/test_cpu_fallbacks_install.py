"""The CPU kernel fallbacks install into the real host through its real HookRegistry.

Host modules bind their CPU kernels at import time and only when the CPU engine is on
(``SGLANG_USE_CPU_ENGINE=1``), so each scenario runs in a fresh interpreter with the
placeholders for ``sgl_kernel`` (sglang_spec_ext/sglang/cpu/placeholders.py) on its path.
"""

from __future__ import annotations

import pytest

from sglang_spec_ext.sglang.cpu.fallbacks.gdn_install import MAMBA_MODULE_OPS, TORCH_OPS
from sglang_spec_ext.sglang.cpu.fallbacks.install import (
    FALLBACKS,
    SAMPLING_VERIFY,
    SAMPLING_VERIFY_TARGET,
    UNSET_FALLBACKS,
    VERIFY_ATTENTION,
    VERIFY_ATTENTION_TARGET,
)
from tests.harness.subproc import snippet_result

ALL_OPS = [f.op for f in FALLBACKS]
UNSET_OPS = [f.op for f in UNSET_FALLBACKS]
#: What the GDN installer covers on this machine (gdn_install.py): every op, the hooks.
GDN_COVERED = sorted([*MAMBA_MODULE_OPS, *TORCH_OPS]) + [
    "mamba_state_scatter_cpu",
    "rms_norm_gated_cpu",
    "gate_sigmoid_mul_cpu",
]
UNSET_TARGETS = sorted(t for f in UNSET_FALLBACKS for t in f.targets)
OUR_TARGETS = [t for f in FALLBACKS for t in f.targets] + [
    VERIFY_ATTENTION_TARGET,
    SAMPLING_VERIFY_TARGET,
]

EXERCISE_HOST = """
import json, torch
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang.kernels.ops.kvcache.cache_move as cm
import sglang.kernels.ops.speculative.cache_locs as cl
import sglang.kernels.ops.speculative.eagle as eg
import sglang.kernels.ops.speculative.spec_tree as st
import sglang.kernels.ops.speculative.reconstruct_tree as rt
import sglang.srt.mem_cache.allocation as al
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

res = {"patched": sorted(HookRegistry._patched)}
buf = torch.arange(12.0).view(4, 3)
ptrs, strides = torch.tensor([buf.data_ptr()], dtype=torch.uint64), torch.tensor([12])
cm.copy_all_layer_kv_cache_func(ptrs, strides, torch.tensor([3]), torch.tensor([0]), 1, 1, {})
res["kv_copy"] = buf[3].tolist()
table = torch.arange(40, dtype=torch.int32).view(2, 20)
al.assign_req_to_token_pool_func(
    torch.tensor([0]), table, torch.tensor([0]), torch.tensor([2]), torch.tensor([100, 101]), 1)
res["req_to_token"] = table[0, :3].tolist()
res["extend_locs"] = cl.assign_extend_cache_locs_func(
    torch.tensor([1]), table, torch.tensor([3]), torch.tensor([6]), 1, 3, "cpu").tolist()
bonus = torch.zeros(2, dtype=torch.int32)
eg.fill_bonus_tokens_func(torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.tensor([2, 3]), bonus, 3, 2)
res["bonus"] = bonus.tolist()
mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).flatten()
pos, idx, nxt, sib = torch.zeros(3, dtype=torch.int64), *torch.zeros(3, 1, 3, dtype=torch.int64)
rt.reconstruct_indices_from_tree_mask_func(mask, torch.tensor([10]), pos, idx, nxt, sib, 1, 3)
res["tree"] = [pos.tolist(), nxt.tolist(), sib.tolist()]
predict, accept = torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32)
count = torch.zeros(1, dtype=torch.int32)
st.verify_tree_greedy_func(predict, accept, count, torch.tensor([[0, 4, 5]]), idx, nxt, sib,
                           torch.tensor([[5, 6, 7]]))
res["verify"] = [predict.tolist(), accept.tolist(), count.tolist()]
res["attention_wrapped"] = hasattr(TorchNativeAttnBackend.forward_extend, "__wrapped__")
import sglang.kernels.ops.sampling.renorm as rn
import sglang.kernels.ops.speculative.verify_sampling as vs
import sglang.srt.speculative.eagle_utils as eu
res["sampling_bound"] = [
    getattr(m, name).__module__
    for m, name in ((vs, "tree_speculative_sampling_target_only"), (rn, "top_k_renorm_prob"),
                    (rn, "top_p_renorm_prob"), (eu, "tree_speculative_sampling_target_only"),
                    (eu, "top_k_renorm_prob"), (eu, "top_p_renorm_prob"))
]
res["renorm"] = eu.top_k_renorm_prob(torch.tensor([[0.5, 0.2, 0.3]]), torch.tensor([2])).tolist()
predict, accept = torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32)
probs = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
eu.tree_speculative_sampling_target_only(
    predict, accept, count, torch.tensor([[0, 2, 0]]), torch.tensor([[0, 1, 2]]),
    torch.tensor([[1, 2, -1]]), torch.tensor([[-1, -1, -1]]), torch.full((1, 3), 0.5),
    torch.tensor([0.5]), probs, torch.zeros_like(probs))
res["sampling_verify"] = [predict.tolist(), accept.tolist(), count.tolist()]
greedy = {}
for flags in ("sampled", "all_greedy", "rejection_sampling"):
    greedy[flags] = eu._verify_uses_greedy(
        is_all_greedy=flags == "all_greedy", is_cpu=True, is_hip=False, is_xpu=False,
        use_rejection_sampling=flags == "rejection_sampling")
res["uses_greedy"] = greedy
print("RESULT " + json.dumps(res))
"""


def _result(code: str, env: dict[str, str] | None = None) -> dict:
    return snippet_result(code, env=env, cpu_engine=True)


def test_load_plugins_installs_every_fallback_into_the_host_modules():
    res = _result("from sglang.srt.plugins import load_plugins\nload_plugins()\n" + EXERCISE_HOST)
    assert set(OUR_TARGETS) <= set(res["patched"])
    assert res["kv_copy"] == [0.0, 1.0, 2.0]
    assert res["req_to_token"] == [100, 101, 2]
    assert res["extend_locs"] == [23, 24, 25]
    assert res["bonus"] == [6, 10]
    # node 0 has children 1 and 2; positions are depth + seq_len
    assert res["tree"] == [[10, 11, 11], [[1, -1, -1]], [[-1, 2, -1]]]
    # target at the root predicts 5: node 2 (token 5) is accepted, then the bonus 7
    assert res["verify"] == [[5, 0, 7], [[0, 2, -1]], [1]]
    assert res["attention_wrapped"] is True
    ours = "sglang_spec_ext.sglang.cpu.fallbacks.sampling"
    assert res["sampling_bound"] == [ours] * 6
    assert res["renorm"] == [pytest.approx([0.5 / 0.8, 0.0, 0.3 / 0.8])]
    # root -> node 1 (token 2, p = 1) -> node 2 (token 0, p = 1) -> bonus from row 2: 1
    assert res["sampling_verify"] == [[2, 0, 1], [[0, 1, 2]], [2]]
    # Sampled requests now take the sampling path; greedy batches and rejection
    # sampling (a Triton kernel) stay greedy.
    assert res["uses_greedy"] == {"sampled": False, "all_greedy": True, "rejection_sampling": True}


SIMULATED_REAL_KERNELS = """
import json, sys, types, torch
lib = torch.library.Library("sgl_kernel", "FRAGMENT")
# A real sgl-kernel CPU build: the op resolves in torch.ops.sgl_kernel with a CPU
# kernel, and the host module binds the library's wrapper, not a placeholder.
lib.define("copy_all_layer_kv_cache_cpu(Tensor ptrs, Tensor strides, Tensor tgt, Tensor src) -> ()")
lib.impl("copy_all_layer_kv_cache_cpu", lambda *args: None, "CPU")
import sglang.kernels.ops.kvcache.cache_move as cm
def real_copy(*args):
    return torch.ops.sgl_kernel.copy_all_layer_kv_cache_cpu(*args)
cm.copy_all_layer_kv_cache_cpu = real_copy
# A schema without a CPU kernel cannot run here: still needs the fallback.
lib.define("fill_bonus_tokens_cpu(Tensor a, Tensor b, Tensor(a!) c, int d) -> ()")
# An op that resolves while the host's binding is a placeholder: still the fallback.
lib.define("verify_tree_greedy_cpu(Tensor(a!) p) -> ()")
lib.impl("verify_tree_greedy_cpu", lambda *args: None, "CPU")
import sglang.kernels.ops.speculative.spec_tree as st
stale = types.ModuleType("stale_binding")
stale.verify = st.sgl_verify_tree_greedy_cpu  # a `from spec_tree import ...` copy
sys.modules["stale_binding"] = stale
# A host that does have a top-k renorm kernel binds it (here and in its importers).
import sglang.kernels.ops.sampling.renorm as rn
import sglang.srt.speculative.eagle_utils as eu
def real_top_k(probs, top_k):
    return probs
rn.top_k_renorm_prob = eu.top_k_renorm_prob = real_top_k

from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_spec_ext.sglang.cpu.fallbacks.install import host_has_op, install_cpu_fallbacks
res = {"has": {op: host_has_op(op) for op in OPS}}
res["first"] = install_cpu_fallbacks()
res["second"] = install_cpu_fallbacks()
res["copy_kept"] = cm.copy_all_layer_kv_cache_cpu is real_copy
res["stale_rebound"] = stale.verify is st.sgl_verify_tree_greedy_cpu
res["stale_placeholder"] = "placeholder" in repr(stale.verify)
res["hooks"] = {t: len(h) for t, h in HookRegistry._hooks.items()}
res["top_k_kept"] = rn.top_k_renorm_prob is real_top_k and eu.top_k_renorm_prob is real_top_k
res["top_p_bound"] = eu.top_p_renorm_prob.__module__
print("RESULT " + json.dumps(res))
"""


def test_real_kernels_are_kept_and_install_is_idempotent():
    res = _result(f"OPS = {ALL_OPS + UNSET_OPS!r}\n" + SIMULATED_REAL_KERNELS)
    real = {"copy_all_layer_kv_cache_cpu", "top_k_renorm_prob"}
    assert res["has"] == {op: op in real for op in ALL_OPS + UNSET_OPS}
    expected = [op for op in ALL_OPS + [VERIFY_ATTENTION] + UNSET_OPS if op not in real]
    assert res["first"] == res["second"] == expected + [SAMPLING_VERIFY] + GDN_COVERED
    assert res["top_k_kept"] is True
    assert res["top_p_bound"] == "sglang_spec_ext.sglang.cpu.fallbacks.sampling"
    assert res["copy_kept"] is True
    assert res["stale_rebound"] is True and res["stale_placeholder"] is False
    assert "sglang.kernels.ops.kvcache.cache_move.copy_all_layer_kv_cache_cpu" not in res["hooks"]
    assert all(res["hooks"][t] == 1 for t in OUR_TARGETS if "cache_move" not in t)


NOTHING_INSTALLED = """
import json
import sglang.srt.utils as host_utils
import sglang.kernels.ops.kvcache.cache_move as cm  # bound while the CPU engine is on
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_spec_ext.sglang.cpu.fallbacks.install import install_cpu_fallbacks
from sglang_spec_ext.plugin import install_runtime_hooks
res = {"is_cpu": host_utils.is_cpu(), "configured_off": install_runtime_hooks()}
real_is_cuda = host_utils.is_cuda
host_utils.is_cuda = lambda: True
res["on_cuda"] = install_cpu_fallbacks()
host_utils.is_cuda, real_is_cpu = real_is_cuda, host_utils.is_cpu
host_utils.is_cpu = lambda: False
res["not_cpu"] = install_cpu_fallbacks()
res["still_placeholder"] = "placeholder" in repr(cm.copy_all_layer_kv_cache_cpu)
res["hooks"] = sorted(HookRegistry._hooks)
import sglang.srt.speculative.eagle_utils as eu
res["sampling_unset"] = [eu.tree_speculative_sampling_target_only, eu.top_k_renorm_prob] == [None] * 2
print("RESULT " + json.dumps(res))
"""


def test_nothing_installed_when_disabled_on_gpu_or_off_the_cpu_engine():
    env = {"SGLANG_SPEC_EXT_CPU_FALLBACKS": "0", "SGLANG_SPEC_EXT_HOST_FIXES": "0"}
    res = _result(NOTHING_INSTALLED, env=env)
    assert res["is_cpu"] is True  # the scenario really is the CPU engine
    # The request guard is not configurable (it is what keeps output lossless); the
    # metrics hooks are inert until the host enables metrics or our algorithms run; the
    # external-corpus hooks act only for SUFFIX servers; plain decode steps act only where
    # a speculative step has nothing to verify (SGLANG_SPEC_EXT_PLAIN_STEPS, default on);
    # HYBRID's confidence tap acts only on a HYBRID server's draft worker.
    assert res["configured_off"] == ["request_guard", "plain_steps", "metrics",
                                     "external_corpus", "hybrid_confidence_tap"]  # fmt: skip
    assert res["on_cuda"] == [] and res["not_cpu"] == []
    assert res["still_placeholder"] is True and res["sampling_unset"] is True
    assert not set(OUR_TARGETS) & set(res["hooks"])


NONE_GUARD = """
import json, sys
import sglang.srt.speculative.eagle_utils, sglang.srt.speculative.ngram_worker
import sglang.srt.layers.sampler, sglang.srt.managers.scheduler
def unset():
    return {f"{name}.{attr}" for name, mod in list(sys.modules.items())
            if mod is not None and name.startswith("sglang.")
            for attr, value in list(getattr(mod, "__dict__", {}).items()) if value is None}
before = unset()
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang_spec_ext.sglang.cpu.fallbacks.install import install_cpu_fallbacks
install_cpu_fallbacks()
print("RESULT " + json.dumps(sorted(before - unset())))
"""


def test_only_the_named_none_bindings_are_set():
    # HookRegistry rebinds every module attribute that `is` a patched original; a
    # None original would hit thousands. Exactly our named targets may change.
    assert _result(NONE_GUARD) == UNSET_TARGETS


@pytest.mark.parametrize("probe", ["is_cpu", "is_cuda"])
def test_in_process_no_install_off_the_cpu_engine(monkeypatch, probe):
    import sglang.srt.utils as host_utils
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_spec_ext.sglang.cpu.fallbacks.install import install_cpu_fallbacks

    monkeypatch.setattr(host_utils, "is_cpu", lambda: probe == "is_cuda")
    monkeypatch.setattr(host_utils, "is_cuda", lambda: probe == "is_cuda")
    before = dict(HookRegistry._hooks)
    assert install_cpu_fallbacks() == []
    assert dict(HookRegistry._hooks) == before
