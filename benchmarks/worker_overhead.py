#!/usr/bin/env python
"""Worker overhead, host time per step outside forwards (benchmarks/results/worker_overhead.json).

Host-side time per decode step outside the model forwards: SUFFIX, HYBRID, the host's NGRAM
and the host's STANDALONE side by side in one run, at verify width 16, on the SGLang CPU
engine (eager, no overlap: forwards run to completion before they return, so a step's time
minus its forwards' time is the worker's host-side time). Each server runs with
``benchmarks/overhead_site`` on its PYTHONPATH, which times every decode call of the
worker's ``forward_batch_generation`` and every ``ModelRunner.forward`` inside it (target
verify, draft steps, draft extend) per batch size. The model is the tests' tiny random Llama
(2 layers, hidden 64, built locally): overhead outside the forwards does not depend on the
model's size, and batch 256 at width 16 stays cheap. STANDALONE and HYBRID draft with its
first layer (3 steps, topk 4: a tree of up to 16 tokens, as SUFFIX's and NGRAM's at width
16).

At each batch size ``bs`` (1, 16, 64, 256) ``bs`` greedy requests are sent together
(prompts mixing repeated code and prose, so the suffix drafter and NGRAM find matches;
``--max-new-tokens`` each) after a warm-up round at that size (8 new tokens each, other
prompts: the host's draft path compiles its top-k selection with ``torch.compile`` at its
first batch sizes, once, inside a decode step); steps that ran with 3/4 of ``bs`` to
``bs`` requests count.
The tables give milliseconds per decode step outside the forwards, as the scheduler
thread's CPU time (little disturbed by other load on the machine) and as wall time, and
the ratio to NGRAM. On the CPU engine this includes the plugin's CPU stand-ins for the
host's GPU kernels (tree building, verify sampling, attention metadata): the model-draft
servers (STANDALONE, HYBRID) run more of them than NGRAM and SUFFIX, and a GPU runs them
as kernels; so HYBRID against STANDALONE shows what HYBRID adds.

    .venv/bin/python benchmarks/worker_overhead.py [--max-new-tokens 32] [--sizes 1,16,64,256]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import requests
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults  # noqa: E402

SITE = REPO / "benchmarks" / "overhead_site"
MARK = "sglang-spec-ext bench step times:"
WIDTH = 16
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
        "--speculative-num-draft-tokens", str(WIDTH)]  # fmt: skip
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 2,
    "The quick brown fox jumps over the lazy dog. The dog sleeps. " * 2,
    ", ".join(str(i) for i in range(24)),
    "Please summarise the following notes: the build failed, the test passed, the build",
]


def configs(draft: Path) -> dict[str, list[str]]:
    model_draft = ["--speculative-draft-model-path", str(draft), *TREE]
    return {
        "NGRAM": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(WIDTH)],
        "SUFFIX": ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens",
                   str(WIDTH)],
        "STANDALONE": ["--speculative-algorithm", "STANDALONE", *model_draft],
        "HYBRID": ["--speculative-algorithm", "HYBRID", *model_draft],
        # SUFFIX with and without the target's recycled top-k (SGLANG_SPEC_EXT_RECYCLE_TOPK,
        # CONFIG_ENV): what the recycled source adds to SUFFIX's host time
        "SUFFIX-norecycle": ["--speculative-algorithm", "SUFFIX",
                             "--speculative-num-draft-tokens", str(WIDTH)],
        "SUFFIX-recycle": ["--speculative-algorithm", "SUFFIX",
                           "--speculative-num-draft-tokens", str(WIDTH)],
    }  # fmt: skip


#: Environment of a config beyond the common one.
CONFIG_ENV = {
    "SUFFIX-norecycle": {"SGLANG_SPEC_EXT_RECYCLE_TOPK": "0"},
    "SUFFIX-recycle": {"SGLANG_SPEC_EXT_RECYCLE_TOPK": "8"},
}
ALGORITHMS = ("NGRAM", "SUFFIX", "STANDALONE", "HYBRID", "SUFFIX-norecycle", "SUFFIX-recycle")


def step_times(log_path: Path) -> dict[int, list[float]]:
    """bs -> [steps, step s, forward s, step thread-CPU s, forward thread-CPU s] from the
    last line of the log."""
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if MARK in ln]
    if not lines:
        return {}
    return {int(k): v for k, v in json.loads(lines[-1].split(MARK, 1)[1]).items()}


def figures(before: dict, after: dict, bs: int) -> dict:
    """Per decode step of the run between two counter readings, over the steps that ran
    with at least 3/4 of ``bs`` requests (prefills arrive in chunks and requests finish
    at different steps, so a batch is rarely exactly ``bs`` for long)."""
    lo = max(1, -(-3 * bs // 4))
    total = [0.0] * 5
    for size, row in after.items():
        if lo <= size <= bs:
            old = before.get(size, [0.0] * 5)
            total = [t + a - b for t, a, b in zip(total, row, old, strict=True)]
    steps, step_s, fwd_s, step_cpu, fwd_cpu = total
    if not steps:
        return {"steps": 0}
    return {
        "steps": int(steps),
        "batch_sizes": [lo, bs],
        "step_ms": 1e3 * step_s / steps,
        "forward_ms": 1e3 * fwd_s / steps,
        "overhead_ms": 1e3 * (step_s - fwd_s) / steps,
        "overhead_cpu_ms": 1e3 * (step_cpu - fwd_cpu) / steps,
    }


def send(server: LaunchedServer, prompts: list[list[int]], max_new: int) -> None:
    def one(ids: list[int]) -> None:
        payload = {"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}  # fmt: skip
        requests.post(server.url + "/generate", json=payload, timeout=1800).raise_for_status()

    with cf.ThreadPoolExecutor(len(prompts)) as pool:  # all at once: a batch of bs
        list(pool.map(one, prompts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--sizes", default="1,16,64,256")
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/worker_overhead.json"))
    ap.add_argument("--algorithms", default="NGRAM,SUFFIX,STANDALONE,HYBRID",
                    help="comma list (NGRAM first: the ratios' reference)")  # fmt: skip
    ap.add_argument("--profile-dir", type=Path, default=None,
                    help="cProfile each server's decode steps to DIR/<algorithm>.prof "
                    "(pstats; slows the steps: not for the figures)")  # fmt: skip
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or max(sizes) > 512:
        ap.error(f"--sizes {args.sizes!r}: batch sizes from 1 to 512")
    unknown = set(args.algorithms.split(",")) - set(ALGORITHMS)
    if unknown:
        ap.error(f"--algorithms: unknown {sorted(unknown)}; of {', '.join(ALGORITHMS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.testing.llama import build_tiny_llama, build_truncated_draft

    work = Path(tempfile.mkdtemp(prefix="worker-overhead-"))
    model = build_tiny_llama(work / "tiny", seed=0)
    draft = build_truncated_draft(model, work / "draft", 1)
    tok = AutoTokenizer.from_pretrained(model)
    base = [tok(t)["input_ids"] for t in TEXTS]
    total = max(sizes) * (max(len(b) for b in base) + args.max_new_tokens + 2 * WIDTH + 8)
    common = ["--max-running-requests", str(max(sizes)), "--max-total-tokens", str(total + 4096),
              "--random-seed", "0"]  # fmt: skip
    env = {**cpu_serving_env(), "SPEC_EXT_BENCH_STEP_TIMES": "1",
           "SPEC_EXT_BENCH_STEP_TIMES_EVERY": "1",
           "SGLANG_SPEC_EXT_CPU_OVERLAP": "0", "SGLANG_SPEC_EXT_CPU_GRAPHS": "0"}  # fmt: skip
    results: dict[str, dict[str, dict]] = {}
    chosen = {n: c for n, c in configs(draft).items() if n in args.algorithms.split(",")}
    jobs = [(name, bs) for name in chosen for bs in sizes]
    bar = tqdm(total=len(jobs), desc="worker overhead", unit="job")
    for name, extra in chosen.items():
        server_env = {**env, **CONFIG_ENV.get(name, {})}
        if args.profile_dir is not None:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            server_env["SPEC_EXT_BENCH_PROFILE"] = str(args.profile_dir / f"{name}.prof")
        server = LaunchedServer(str(model), with_cpu_defaults([*common, *extra]), env=server_env,
                                pythonpath=[str(SITE)], name=f"overhead-{name.lower()}")  # fmt: skip
        # the CPU-serving site directory must come first (it runs ours next)
        server.env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(SITE)])
        results[name] = {}
        with server:
            send(server, [base[0][:8]], 4)  # warm-up
            for bs in sizes:
                prompts = [base[i % len(base)] + [100 + i % 50] for i in range(bs)]
                # warm-up at this batch size: the host's draft path compiles
                # (torch.compile) its top-k selection at its first batch sizes, tens of
                # seconds inside a decode step that would otherwise count as overhead
                send(server, [[200 + i % 50, *p] for i, p in enumerate(prompts)], 8)
                before = step_times(server.log_path)
                send(server, prompts, args.max_new_tokens)
                after = step_times(server.log_path)
                results[name][str(bs)] = figures(before, after, bs)
                bar.update()
    bar.close()
    out = {
        "what": "host-side time per decode step outside the model forwards (step time minus "
        "ModelRunner.forward time inside it; scheduler-thread CPU time and wall time), SGLang "
        f"CPU engine, eager, no overlap; tiny random Llama target, 1-layer draft; verify width "
        f"{WIDTH}; greedy, bs requests sent together, steps with 3/4 bs to bs requests counted; "
        "includes the CPU stand-ins for the host's GPU kernels (tree build, verify sampling), "
        "which a GPU runs as kernels",
        "machine": machine_info(),
        "parameters": {
            "sizes": sizes,
            "max_new_tokens": args.max_new_tokens,
            "width": WIDTH,
            "model_draft_shape": TREE,
        },  # fmt: skip
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for key, label in (("overhead_cpu_ms", "scheduler-thread CPU ms"), ("overhead_ms", "wall ms")):
        print(f"\n{label} per decode step outside the model forwards (x NGRAM)")
        print(f"{'bs':>5}" + "".join(f"{n:>20}" for n in results))
        for bs in sizes:
            ref = results.get("NGRAM", {}).get(str(bs), {}).get(key)
            cells = []
            for name in results:
                v = results[name][str(bs)].get(key)
                cells.append(
                    "-" if v is None else f"{v:8.2f} ({v / ref:4.2f}x)" if ref else f"{v:8.2f}"
                )
            print(f"{bs:>5}" + "".join(f"{c:>20}" for c in cells))
    print(f"({out['what']})")
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
