"""Grammar batches with and without overlap scheduling: host CPU time per decode step
(benchmarks/results/grammar_overlap.json).

SmolLM2-135M-Instruct on the SGLang CPU engine (fp32), the host's xgrammar backend, greedy,
the structured workload of ``bench/structured_workloads.py`` (tool calls under a JSON schema,
regex answers, JSON mode, unconstrained chat side by side). SUFFIX at width 16 with
grammar-aware drafts, served with the overlap loop (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``, the
GPU default path's emulation):

* ``grammar synced``: ``SGLANG_SPEC_EXT_GRAMMAR_OVERLAP=0``, the host's rule for NGRAM-shaped
  algorithms: a grammar batch makes the scheduler process step N's results before it
  launches step N+1;
* ``grammar overlapped``: the default; the scheduler launches step N+1 first and the worker
  advances the grammar FSM through the scheduler's barrier.

Plain constrained decoding is the reference for the outputs. Each scheduler runs
``gpu/probe_site`` (the GPU kit's probe, here on the CPU): per decode step the thread CPU
time of the worker's step outside the model forwards, of the host's result processing, and
of the whole scheduler loop from one decode launch to the next, and how many launches found
the previous result still unprocessed (overlapped). On the CPU engine a forward finishes
before it returns, so nothing actually runs concurrently here; what overlap would hide on a
GPU (result processing and scheduling running while the GPU verifies) is a projection from
these measured host times, labelled so.

    .venv/bin/python benchmarks/grammar_overlap.py [--levels 1,8] [--requests 16]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from grammar_smollm2 import SUFFIX, ask, level_summary, run_level  # noqa: E402
from model_draft_smollm2 import serve  # noqa: E402
from ragged_smollm2 import last_stats  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402

PROBE = REPO / "gpu" / "probe_site"
OVERLAP = {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
CONFIGS = {
    "plain": ([], {}),
    "grammar synced": (SUFFIX, {**OVERLAP, "SGLANG_SPEC_EXT_GRAMMAR_OVERLAP": "0"}),
    "grammar overlapped": (SUFFIX, {**OVERLAP, "SGLANG_SPEC_EXT_GRAMMAR_OVERLAP": "1"}),
}


def probe_figures(out: str, label: str) -> dict:
    """The probe's rows for ``label``, summed over batch sizes."""
    total: dict[str, float] = {}
    for path in glob.glob(f"{out}.*"):
        if path.endswith(".tmp"):
            continue
        for row in json.loads(Path(path).read_text())["figures"].get(label, {}).values():
            for k, v in row.items():
                if isinstance(v, (int, float)):
                    total[k] = total.get(k, 0) + v
    return total


def host_times(f: dict) -> dict:
    """Per decode step, ms of scheduler-thread CPU time (measured) and the projection."""
    if not f.get("steps") or not f.get("loops") or not f.get("results"):
        return {}
    n = f["loops"]  # decode-to-decode intervals with no other batch between
    worker = 1e3 * (f["loop_step_cpu_s"] - f["loop_fwd_cpu_s"]) / n
    result = 1e3 * f["loop_result_cpu_s"] / n
    loop_host = 1e3 * (f["loop_cpu_s"] - f["loop_fwd_cpu_s"]) / n
    rest = loop_host - worker - result
    overlapped = f["launched_overlapped"] / f["steps"]
    return {
        "decode_steps": int(f["steps"]),
        "decode_to_decode_intervals": int(n),
        "launched_overlapped": round(overlapped, 3),
        "worker_outside_forwards_cpu_ms": round(worker, 3),
        "result_processing_cpu_ms": round(result, 3),
        "rest_of_loop_cpu_ms": round(rest, 3),
        "loop_outside_forwards_cpu_ms": round(loop_host, 3),
        # PROJECTION: with the launch overlapped, result processing and scheduling run
        # while the GPU verifies (the worker's own part stays: SUFFIX drafts from step
        # N's tokens); synchronous launches expose the whole loop's host time
        "projected_exposed_host_ms_on_gpu": round(
            overlapped * worker + (1 - overlapped) * loop_host, 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level (>= c)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/grammar_overlap.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    levels = [int(x) for x in args.levels.split(",")]

    from transformers import AutoTokenizer

    from sglang_spec_ext.bench.structured_workloads import structured_requests
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model = ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model)
    per_level = {c: structured_requests(tok, max(args.requests, c), seed=c) for c in levels}
    room = ["--max-running-requests", str(max(levels)), "--max-total-tokens", "65536"]
    tmp = Path(tempfile.mkdtemp(prefix="grammar-overlap-"))
    results: dict[str, dict[int, dict]] = {n: {} for n in CONFIGS}
    probes: dict[str, dict[int, dict]] = {n: {} for n in CONFIGS}
    stats: dict[str, dict | None] = {}
    bar = tqdm(total=len(CONFIGS) * len(levels), desc="servers x levels", file=sys.stderr)
    for name, (extra, env) in CONFIGS.items():
        slug = name.replace(" ", "-")
        ctl, out = tmp / f"{slug}.ctl", str(tmp / f"{slug}.probe")
        ctl.write_text("off")
        server = serve(model, [*extra, *room], slug)
        server.env.update(env)
        server.env.update({"GPU_KIT_PROBE_OUT": out, "GPU_KIT_PROBE_CTL": str(ctl)})
        server.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (server.env.get("PYTHONPATH", ""), str(PROBE)) if p
        )
        with server:
            ask(server, per_level[levels[0]][0][1][:8], {}, 4)  # warm-up
            for c in levels:
                bar.set_postfix_str(f"{name} c={c}")
                ctl.write_text(f"time:c{c}")
                results[name][c] = run_level(server, per_level[c], c, args.max_new_tokens)
                ctl.write_text("off")
                ask(server, per_level[c][0][1][:8], {}, 4)  # a decode step: the probe dumps
                probes[name][c] = host_times(probe_figures(out, f"time:c{c}"))
                bar.update(1)
            stats[name] = last_stats(server.log_path) if name != "plain" else None
    bar.close()

    summary: dict[str, dict] = {}
    for name in CONFIGS:
        summary[name] = {}
        for c in levels:
            summary[name][c] = {
                **level_summary(results[name][c], results["plain"][c]),
                "host": probes[name][c],
            }
    keep = ("grammar_barrier_steps", "grammar_stale_skips", "grammar_steps", "relay_repeats",
            "grammar_shape_ms_per_step")  # fmt: skip
    report = {
        "what": "SmolLM2-135M-Instruct, SGLang CPU engine (fp32), xgrammar, greedy, structured "
        "workload; SUFFIX width 16 with grammar-aware drafts under the overlap loop, grammar "
        "batches synced (SGLANG_SPEC_EXT_GRAMMAR_OVERLAP=0) or overlapped (default); host "
        "times are the scheduler thread's CPU time per decode step measured by gpu/probe_site; "
        "projected_exposed_host_ms_on_gpu is a PROJECTION (see host_times in the script)",
        "machine": machine_info(),
        "parameters": {
            "width": 16,
            "levels": levels,
            "max_new_tokens": args.max_new_tokens,
            "requests_per_level": {c: len(r) for c, r in per_level.items()},
            "configs": CONFIGS,
        },  # fmt: skip
        "results": summary,
        "worker_stats": {
            n: {k: v for k, v in (s or {}).items() if k in keep} for n, s in stats.items() if s
        },  # fmt: skip
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("per decode step, scheduler-thread CPU ms (measured on this machine; the last "
          "column a projection for a GPU)")  # fmt: skip
    head = f"  {'config':<20}{'tok/s':>8}{'accept':>8}{'overl.':>7}{'worker':>8}{'result':>8}"
    head += f"{'rest':>8}{'loop':>8}{'exposed*':>10}  output"
    for c in levels:
        print(f"-- concurrency {c}\n{head}")
        for name in CONFIGS:
            v, h = summary[name][c], summary[name][c]["host"]
            cells = [h.get(k, float("nan")) for k in (
                "launched_overlapped", "worker_outside_forwards_cpu_ms",
                "result_processing_cpu_ms", "rest_of_loop_cpu_ms",
                "loop_outside_forwards_cpu_ms", "projected_exposed_host_ms_on_gpu")]  # fmt: skip
            print(f"  {name:<20}{v['goodput_tok_s']:>8.1f}{(v['accept_length_structured'] or 1):>8.2f}"
                  f"{cells[0]:>7.2f}{cells[1]:>8.2f}{cells[2]:>8.2f}{cells[3]:>8.2f}{cells[4]:>8.2f}"
                  f"{cells[5]:>10.2f}  {'identical' if v['identical_to_plain'] else 'DIFFERENT'}")  # fmt: skip
    print("* projection: host time a GPU step would wait on (overlapped launches: the worker's "
          "part only)")  # fmt: skip
    print(f"JSON: {args.json}")
    return 0 if all(v["identical_to_plain"] for lv in summary.values() for v in lv.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
