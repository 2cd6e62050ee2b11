"""TEST ONLY: count a speculative worker's host reads of tensors in its decode steps.

Put this directory on a server's PYTHONPATH after the CPU-serving site directory (whose
``sitecustomize`` runs the next one on the path, this one) and set
``SPEC_EXT_TEST_COUNT_HOST_READS=1``. Inside every call of the host's V2 model-draft
worker's ``forward_batch_generation`` on a decode batch (STANDALONE, EAGLE and HYBRID
all run it), each tensor read that would wait for the device on a GPU is counted:
``Tensor.cpu``, ``tolist``, ``item``, ``numpy`` (not of the host tensor a counted
``cpu()`` just returned), and ``bool``/``int``/``float``/``index`` of a tensor. On the
CPU engine every tensor is a host tensor, so the count includes reads of tensors that
live on the host on a GPU too: compare servers (the host's own worker against ours),
not absolute numbers. Each read is also attributed to the plugin when the code that made
it is in ``sglang_spec_ext`` (the caller's module: for ``bool(t)`` in an ``if`` that is
the function with the ``if``), except the plugin's CPU stand-ins for the host's GPU code
(``_STAND_INS``: on a GPU the host's kernels run there), listed apart. Every ``EVERY`` decode steps the totals go to stderr (the
server log) in one line after :data:`MARK`.
"""

import json
import os
import sys

MARK = "sglang-spec-ext test host reads:"
EVERY = 10
TARGET = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
#: Plugin modules that stand in for the host's GPU code on the CPU engine (attention,
#: tree kernels, graph emulation): their reads count as the host's, not the plugin's.
_STAND_INS = ("sglang_spec_ext.sglang.cpu.",)
_METHODS = ("cpu", "tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _install() -> None:
    import torch
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    state = {"active": 0, "steps": 0, "last_cpu": None}
    counts = dict.fromkeys(_METHODS, 0)
    plugin = dict.fromkeys(_METHODS, 0)  # those made by the plugin's own code
    stand_ins: dict[str, int] = {}  # by the plugin's CPU stand-ins for host GPU code
    mods: dict[str, int] = {}  # the plugin's own, by module

    def wrap(name, fn):
        def call(self, *args, **kwargs):
            out = fn(self, *args, **kwargs)
            if state["active"]:
                if name == "numpy" and state["last_cpu"] is self:
                    state["last_cpu"] = None  # the host copy of a counted cpu()
                else:
                    counts[name] += 1
                    caller = sys._getframe(1).f_globals.get("__name__", "")
                    if caller.startswith(_STAND_INS):
                        stand_ins[caller] = stand_ins.get(caller, 0) + 1
                    elif caller.startswith("sglang_spec_ext"):
                        plugin[name] += 1
                        mods[caller] = mods.get(caller, 0) + 1
                    if name == "cpu":
                        state["last_cpu"] = out
            return out

        call.__wrapped__ = fn
        return call

    for name in _METHODS:
        setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))

    def around(original, worker, batch, *args, **kwargs):
        mode = batch.forward_mode
        if mode.is_extend() or mode.is_idle() or getattr(batch, "is_extend_in_batch", False):
            return original(worker, batch, *args, **kwargs)
        state["active"] += 1
        try:
            return original(worker, batch, *args, **kwargs)
        finally:
            state["active"] -= 1
            state["steps"] += 1
            state["last_cpu"] = None
            if state["steps"] % EVERY == 0:
                detail = " ".join(f"{k}={v}" for k, v in counts.items())
                mine = " ".join(f"plugin_{k}={v}" for k, v in plugin.items() if v)
                print(f"{MARK} steps={state['steps']} reads={sum(counts.values())} "
                      f"plugin_reads={sum(plugin.values())} {detail} {mine} "
                      f"plugin_modules={json.dumps(mods)} stand_ins={json.dumps(stand_ins)}",
                      file=sys.stderr, flush=True)  # fmt: skip

    HookRegistry.register(TARGET, around, HookType.AROUND)


if os.environ.get("SPEC_EXT_TEST_COUNT_HOST_READS") == "1":
    _install()
