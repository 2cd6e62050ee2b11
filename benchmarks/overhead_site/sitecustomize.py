"""BENCHMARK ONLY (benchmarks/worker_overhead.py): time a speculative worker's decode
steps and the model forwards inside them.

Put this directory on a server's PYTHONPATH after the CPU-serving site directory (whose
``sitecustomize`` runs the next one on the path, this one) and set
``SPEC_EXT_BENCH_STEP_TIMES=1``. Every decode call of the speculative worker's
``forward_batch_generation`` (the host's V2 model-draft worker, its NGRAM worker, our
SUFFIX worker; the outermost call only) is timed, and so is every ``ModelRunner.forward``
inside it (target verify, draft steps, draft extend: the model forwards). Per batch
size the scheduler keeps steps, wall seconds and the scheduler thread's CPU seconds of
steps and of forwards, and every ``EVERY`` decode steps
(``SPEC_EXT_BENCH_STEP_TIMES_EVERY``, default 20) writes them to stderr (the server
log) as JSON after :data:`MARK`. On the CPU engine forwards run to completion before
they return, so step time minus forward time is the worker's host-side time: drafting,
choosing, splicing, bookkeeping, the host's own verify preparation, and the CPU
stand-ins for the host's GPU kernels (tree building, verify sampling). Thread CPU time
does not count waiting for a core, so other load on the machine disturbs it little
(torch's intra-op threads are not counted: the forwards' own figure is low).

With ``SPEC_EXT_BENCH_PROFILE=PATH`` the timed decode steps also run under ``cProfile``
and the stats are dumped to PATH (``pstats`` format) with every counter line: where the
host-side time goes (``python -m pstats PATH``).
"""

import json
import os
import sys
import time

MARK = "sglang-spec-ext bench step times:"
EVERY = int(os.environ.get("SPEC_EXT_BENCH_STEP_TIMES_EVERY", "20") or 20)
TARGETS = (
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
    "sglang.srt.speculative.ngram_worker.NGRAMWorker.forward_batch_generation",
    "sglang_spec_ext.sglang.workers.suffix_worker.SuffixWorker.forward_batch_generation",
)
FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    state = {"depth": 0, "fwd_depth": 0, "fwd": 0.0, "fwd_cpu": 0.0, "steps": 0}
    profile_path = os.environ.get("SPEC_EXT_BENCH_PROFILE")
    profiler = None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile()
    # bs -> [steps, step s, forward s, step thread-CPU s, forward thread-CPU s]
    per_bs: dict[int, list[float]] = {}

    def step(original, worker, batch, *args, **kwargs):
        mode = batch.forward_mode
        decode = not (
            mode.is_extend() or mode.is_idle() or getattr(batch, "is_extend_in_batch", False)
        )
        if state["depth"] or not decode:
            return original(worker, batch, *args, **kwargs)
        state["depth"], state["fwd"], state["fwd_cpu"] = 1, 0.0, 0.0
        t0, c0 = time.perf_counter(), time.thread_time()
        if profiler is not None:
            profiler.enable()
        try:
            return original(worker, batch, *args, **kwargs)
        finally:
            if profiler is not None:
                profiler.disable()
            elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
            state["depth"] = 0
            row = per_bs.setdefault(len(batch.reqs), [0, 0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate((1, elapsed, state["fwd"], cpu, state["fwd_cpu"])):
                row[i] += v
            state["steps"] += 1
            if state["steps"] % EVERY == 0:
                print(f"{MARK} {json.dumps(per_bs)}", file=sys.stderr, flush=True)
                if profiler is not None:
                    profiler.dump_stats(profile_path)

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

    for target in TARGETS:
        HookRegistry.register(target, step, HookType.AROUND)
    HookRegistry.register(FORWARD, forward, HookType.AROUND)


if os.environ.get("SPEC_EXT_BENCH_STEP_TIMES") == "1":
    _install()
