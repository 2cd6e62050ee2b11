"""The CPU engine's stand-ins for the CUDA of the host's PD code (``sglang/cpu/disaggregation.py``)
against the real host modules, each scenario in a fresh interpreter (the host's
``HookRegistry`` is process-wide). The stand-ins at work in real servers:
``tests/e2e/test_pd_disaggregation.py`` (a plain pair needs all three)."""

from __future__ import annotations

from tests.harness.subproc import snippet_result

INSTALL = """
import json, torch
from sglang_spec_ext.plugin import install_runtime_hooks
res = {"installed": install_runtime_hooks()}
"""


def _run(code: str, cpu_engine: bool = True) -> dict:
    return snippet_result(INSTALL + code + "\nprint('RESULT', json.dumps(res))\n",
                          cpu_engine=cpu_engine)  # fmt: skip


def test_the_plugin_installs_them_on_the_cpu_engine_only():
    on = _run("")["installed"]
    assert {"pd_retraction_backup", "pd_host_index_copy", "pd_sync_event"} <= set(on)
    off = _run("", cpu_engine=False)["installed"]
    assert not any(name.startswith("pd_") for name in off)


def test_retraction_backup_resolves_to_cpu_tensors_unless_the_user_chose():
    res = _run(
        """
from sglang.srt.mem_cache import kv_cache_builder
from sglang.srt.runtime_context import get_context, get_disagg
from sglang_spec_ext.sglang.cpu.disaggregation import retraction_backup_hook

res["wrapped"] = hasattr(kv_cache_builder.resolve_decode_retraction_backup, "__wrapped__")
seen = lambda **kw: get_disagg().disaggregation_decode_retraction_backup
for chosen in (None, "host_pool"):
    with get_context().override_server_args(disaggregation_mode="decode",
                                            disaggregation_decode_retraction_backup=chosen):
        res[str(chosen)] = retraction_backup_hook(seen, tp_worker=None)
"""
    )
    assert res["wrapped"]
    assert res["None"] == "cpu_tensor"  # the host's default (host_pool) registers with CUDA
    assert res["host_pool"] == "host_pool"  # a user's choice is kept


def test_mooncake_senders_take_the_plain_index_path():
    res = _run(
        """
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender
from sglang_spec_ext.sglang.cpu.disaggregation import sender_init_hook

res["host_default"] = MooncakeKVSender.__dict__.get("supports_host_tensor_indices")
res["wrapped"] = hasattr(MooncakeKVSender.__init__, "__wrapped__")
sender = MooncakeKVSender.__new__(MooncakeKVSender)
sender_init_hook(None, sender)
res["instance"] = sender.supports_host_tensor_indices
"""
    )
    # the host's sender asks for pinned index copies (what needs an accelerator)
    assert res["host_default"] is True
    assert res["wrapped"] and res["instance"] is False


def test_cuda_events_are_synchronous_cpu_events_in_a_cpu_only_torch():
    res = _run(
        """
import sglang.srt.disaggregation.prefill as prefill
event = prefill.torch.cuda.Event()
event.record(torch.cpu.current_stream())
event.synchronize()
res["query"] = event.query()
res["cpu_only_torch"] = torch.version.cuda is None
"""
    )
    assert res["cpu_only_torch"] and res["query"] is True
