"""GPU KIT PROBE (gpu/run's host-time stage): host time and host syncs per decode step.

Active only where ``GPU_KIT_PROBE_OUT`` is set (``gpu/run`` sets it for the servers of its
host-time stage); then, in the scheduler process, through the host's ``HookRegistry``:

* every decode ``Scheduler.run_batch`` (the whole step the scheduler launches: the
  speculative worker's drafting, verify preparation, forward launches, relay) is timed,
  wall and thread-CPU, and so is every ``ModelRunner.forward`` inside it; the difference
  is the host time per step outside the forwards (with CUDA graphs a forward's host part
  is the graph replay launch);
* every ``Scheduler.process_batch_result`` of a decode batch is timed too (``result_*``:
  the host's processing of a step's results: output lists, finish checks, the grammar
  FSM advance where the worker did not do it, streaming), and so is the scheduler loop
  from one decode launch to the next where no other batch ran in between (``loop_*``:
  everything the loop does per step; ``loop_step_cpu_s``, ``loop_fwd_cpu_s`` and
  ``loop_result_cpu_s`` are the step, forward and result-processing parts of those same
  intervals, so the rest of the loop is their difference);
  ``launched_overlapped`` counts decode launches made while the previous result was still
  unprocessed (the overlap loop), the others were synchronous (e.g. grammar batches the
  host syncs);
* while the control file's label starts with ``sync``, ``torch.cuda.set_sync_debug_mode``
  is on ("warn") and every synchronizing CUDA operation is counted per decode step, inside
  ``run_batch`` or elsewhere in the scheduler loop, by the innermost sglang or plugin
  source line that called it (stream/event ``synchronize`` calls are not reported by
  torch's sync debug mode).

The control file (``GPU_KIT_PROBE_CTL``) holds a label (``time:bs16``, ``sync:bs16``,
``off``); figures are kept per label and written as JSON to ``GPU_KIT_PROBE_OUT.<pid>``
every 10 decode steps and when the label changes. Runs the ``sitecustomize`` it shadows.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings

_OUT = os.environ.get("GPU_KIT_PROBE_OUT")
_CTL = os.environ.get("GPU_KIT_PROBE_CTL", "")


def _run_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    seen = False
    for entry in sys.path:
        path = os.path.abspath(entry or ".")
        if path == here:
            seen = True
            continue
        cand = os.path.join(path, "sitecustomize.py")
        if seen and os.path.isfile(cand):
            with open(cand) as f:
                code = compile(f.read(), cand, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": cand})
            return


_HOOKS_MODULE = "sglang.srt.plugins.hook_registry"


class _WhenImported:
    """Installs the probe right after the host imports its hook registry (which happens
    before its plugins load and the hooks are applied), so this sitecustomize imports
    nothing of SGLang itself."""

    def find_spec(self, name, path=None, target=None):
        if name != _HOOKS_MODULE:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            try:
                _install(module)
            except Exception as exc:  # noqa: BLE001 - a probe must never stop a server
                print(f"gpu kit probe not installed: {type(exc).__name__}: {exc}", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def _install(hooks) -> None:  # noqa: N806
    HookRegistry, HookType = hooks.HookRegistry, hooks.HookType  # noqa: N806

    state = {"depth": 0, "fwd": 0.0, "fwd_cpu": 0.0, "fwd_depth": 0, "steps": 0,
             "label": "off", "mtime": 0.0, "sync_on": False, "in_step": False}  # fmt: skip
    figures: dict[str, dict] = {}

    def bucket(label: str, bs: int) -> dict:
        per = figures.setdefault(label, {})
        return per.setdefault(str(bs), {"steps": 0, "step_s": 0.0, "fwd_s": 0.0,
                                        "step_cpu_s": 0.0, "fwd_cpu_s": 0.0,
                                        "syncs_in_step": 0, "syncs_elsewhere": 0,
                                        "sites": {}, "results": 0, "result_s": 0.0,
                                        "result_cpu_s": 0.0, "loops": 0, "loop_s": 0.0,
                                        "loop_cpu_s": 0.0, "loop_step_cpu_s": 0.0,
                                        "loop_fwd_cpu_s": 0.0, "loop_result_cpu_s": 0.0,
                                        "launched_overlapped": 0})  # fmt: skip

    def dump() -> None:
        tmp = f"{_OUT}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "figures": figures}, f)
        os.replace(tmp, f"{_OUT}.{os.getpid()}")

    def set_sync(on: bool) -> None:
        import torch

        if on != state["sync_on"] and torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn" if on else "default")
        state["sync_on"] = on

    def poll_ctl() -> None:
        try:
            mtime = os.stat(_CTL).st_mtime
        except OSError:
            return
        if mtime != state["mtime"]:
            state["mtime"] = mtime
            with open(_CTL) as f:
                label = f.read().strip() or "off"
            if label != state["label"]:
                dump()
                state["label"] = label
                set_sync(label.startswith("sync"))

    last_bs = {"bs": 0}

    def on_warning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if "synchroniz" not in text:
            return _show(message, category, filename, lineno, file, line)
        row = bucket(state["label"], last_bs["bs"])
        row["syncs_in_step" if state["in_step"] else "syncs_elsewhere"] += 1
        site = "?"
        for frame in reversed(traceback.extract_stack()[:-1]):
            if "sglang" in frame.filename:
                site = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
                break
        row["sites"][site] = row["sites"].get(site, 0) + 1
        return None

    _show = warnings.showwarning
    warnings.showwarning = on_warning
    warnings.filterwarnings("always", message=".*synchroniz.*")

    def run_batch(original, scheduler, batch, *args, **kwargs):
        mode = batch.forward_mode
        decode = mode.is_decode() if hasattr(mode, "is_decode") else not mode.is_extend()
        if state["depth"] or not decode:
            if not state["depth"]:
                state["launch"] = None  # another batch in between: no decode-to-decode loop
            return original(scheduler, batch, *args, **kwargs)
        poll_ctl()
        bs = len(batch.reqs)
        last_bs["bs"] = bs
        state.update(depth=1, fwd=0.0, fwd_cpu=0.0, in_step=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        # the previous decode launch: [label, bs, wall, cpu, its step cpu, its forwards'
        # cpu, result-processing cpu since]
        prev = state.get("launch")
        if prev is not None and prev[0] == state["label"] and prev[4] is not None:
            row = bucket(prev[0], prev[1])
            row["loops"] += 1
            row["loop_s"] += t0 - prev[2]
            row["loop_cpu_s"] += c0 - prev[3]
            row["loop_step_cpu_s"] += prev[4]
            row["loop_fwd_cpu_s"] += prev[5]
            row["loop_result_cpu_s"] += prev[6]
        launch = [state["label"], bs, t0, c0, None, 0.0, 0.0]
        state["launch"] = launch
        if getattr(scheduler, "result_queue", None):
            bucket(state["label"], bs)["launched_overlapped"] += 1
        try:
            return original(scheduler, batch, *args, **kwargs)
        finally:
            row = bucket(state["label"], bs)
            row["steps"] += 1
            row["step_s"] += time.perf_counter() - t0
            row["step_cpu_s"] += time.thread_time() - c0
            row["fwd_s"] += state["fwd"]
            row["fwd_cpu_s"] += state["fwd_cpu"]
            launch[4], launch[5] = time.thread_time() - c0, state["fwd_cpu"]
            state.update(depth=0, in_step=False)
            state["steps"] += 1
            if state["steps"] % 10 == 0:
                dump()

    def forward(original, runner, *args, **kwargs):
        if not state["depth"] or state["fwd_depth"]:
            return original(runner, *args, **kwargs)
        state["fwd_depth"] = 1
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return original(runner, *args, **kwargs)
        finally:
            state["fwd"] += time.perf_counter() - t0
            state["fwd_cpu"] += time.thread_time() - c0
            state["fwd_depth"] = 0

    def process_batch_result(original, scheduler, batch, *args, **kwargs):
        mode = getattr(batch, "forward_mode", None)
        if mode is None or not mode.is_decode() or not getattr(batch, "reqs", None):
            return original(scheduler, batch, *args, **kwargs)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return original(scheduler, batch, *args, **kwargs)
        finally:
            cpu = time.thread_time() - c0
            row = bucket(state["label"], len(batch.reqs))
            row["results"] += 1
            row["result_s"] += time.perf_counter() - t0
            row["result_cpu_s"] += cpu
            if state.get("launch") is not None:
                state["launch"][6] += cpu

    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.run_batch", run_batch, HookType.AROUND
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
        process_batch_result,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner.forward", forward, HookType.AROUND
    )


if _OUT:
    sys.meta_path.insert(0, _WhenImported())
_run_next_sitecustomize()
