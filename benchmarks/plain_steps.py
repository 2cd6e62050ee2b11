"""Speculation off must cost nothing, served (benchmarks/results/plain_steps*.json).

Speculative servers with nothing to verify against plain decoding, SmolLM2-135M-Instruct
on the SGLang CPU engine, one run of one build.

Servers (all alive at once; rounds alternate between them so drifts of this noisy
machine fall on every server alike):

* ``plain``: no speculation;
* ``zero, host path``: STANDALONE (the 14 + 8-layer weak draft, 3 steps, topk 1) pinned
  at zero draft steps (``SGLANG_SPEC_EXT_ADAPTIVE_CANDIDATE_KS=0``) with the host's
  zero-step path (``SGLANG_SPEC_EXT_PLAIN_STEPS=0``, the draft extend skipped by
  ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``): the floor before plain steps;
* ``zero, plain steps``: the same pinned server with plain decode steps (the default)
  and the draft-KV repair (``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1``: no draft forward at zero
  steps, the prefill's draft extend included);
* ``zero, overlap``: the same with the host's overlap scheduling kept on
  (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``, the GPU default path's scheduling), as the plain
  server runs;
* ``controller``: our goodput controller, steps 0..3, plain steps and the repair;
* ``SUFFIX`` (width 8) with and without plain steps (both with the draft gate off,
  ``SGLANG_SPEC_EXT_DRAFT_GATE=0``), and with the defaults: plain steps and the draft gate
  (``sglang_spec_ext/suffix/gate.py``), on a workload where the drafter
  finds almost nothing (random-token prompts, sampled at temperature 1: greedy output on
  random tokens loops, which suffix drafts catch) and on the committed chat set (greedy;
  fresh prompts every round, so repeats do not turn it into a cache-hit test);
* ``plain, no overlap``: plain decoding with ``--disable-overlap-schedule``, the
  scheduling the speculative servers run on the CPU engine (SGLang turns overlap off
  for speculative decoding there): on this 2-core machine the overlap loop's scheduler
  thread competes with the forward for the cores, so both baselines are reported.

The model-draft servers serve the mixed chat / code-edit workload of
``benchmarks/hybrid_smollm2.py`` at concurrency 1, 4 and 16, greedy. Goodput is output
tokens per wall-clock second, summed over the rounds; next to it, each server's CPU
seconds per output token (user + system of its whole process tree, read with psutil
around every job), which other load on a shared machine disturbs far less than wall
time (waiting for a core is not counted); greedy outputs are compared with the plain
server's; the verify steps (``spec_verify_ct``) give the accept length.

    .venv/bin/python benchmarks/plain_steps.py [--rounds 2] [--max-new-tokens 64]
        [--suffix-only | --model-drafts-only | --paired]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import requests
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hybrid_smollm2 import workload  # noqa: E402
from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.workers.plain_step import STATS_LOG_MARK  # noqa: E402
from sglang_spec_ext.soak.runner import DRAFTER_STATS_MARK as DRAFTER_MARK  # noqa: E402

LEVELS = (1, 4, 16)
PINNED = {"SGLANG_SPEC_EXT_ADAPTIVE": "1", "SGLANG_SPEC_EXT_ADAPTIVE_CANDIDATE_KS": "0"}
REPAIR = {"SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1"}
HOST_PATH = {"SGLANG_SPEC_EXT_PLAIN_STEPS": "0", "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}


def cpu_seconds(server) -> float:
    """User + system CPU seconds of the server's whole process tree (launcher, tokenizer,
    scheduler, detokenizer) so far."""
    import psutil

    root = psutil.Process(server.proc.pid)
    total = 0.0
    for proc in (root, *root.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def level(server, prompts: list[list[int]], concurrency: int, max_new: int, temp: float) -> dict:
    def one(ids: list[int]) -> dict:
        payload = {"input_ids": ids, "sampling_params": {
            "max_new_tokens": max_new, "temperature": temp, "ignore_eos": True}}  # fmt: skip
        r = requests.post(server.url + "/generate", json=payload, timeout=600)
        r.raise_for_status()
        return r.json()

    cpu0, t0 = cpu_seconds(server), time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(one, prompts))
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds(server) - cpu0,
            "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
            "steps": sum(o["meta_info"].get("spec_verify_ct") or 0 for o in outs),
            "outputs": [o["output_ids"] for o in outs]}  # fmt: skip


def plain_counts(log_path: Path) -> str | None:
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if STATS_LOG_MARK in ln]
    return lines[-1].split(STATS_LOG_MARK, 1)[1].strip() if lines else None


def gate_counts(log_path: Path) -> dict | None:
    """The draft gate's counters from the server's last drafter-stats line."""
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if DRAFTER_MARK in ln]
    if not lines:
        return None
    stats = json.loads(lines[-1].split(DRAFTER_MARK, 1)[1])
    return {k: v for k, v in stats.items() if k.startswith("gate_")} or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8, help="requests per level (16 at c=16)")
    ap.add_argument("--json", default=None, help="default: benchmarks/results/plain_steps"
                    "[_suffix].json")  # fmt: skip
    ap.add_argument("--suffix-only", action="store_true",
                    help="only plain and SUFFIX (plain steps, draft gate) on the random and "
                    "chat sets")  # fmt: skip
    ap.add_argument("--model-drafts-only", action="store_true",
                    help="only plain, pinned at zero steps (plain steps) and the controller on "
                    "the mixed workload")  # fmt: skip
    ap.add_argument("--paired", action="store_true",
                    help="only plain and pinned at zero steps (plain steps) on the mixed "
                    "workload, back to back in ABBA order per level and round (drifts of a "
                    "noisy machine cancel within each quartet)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.suffix_only + args.model_drafts_only + args.paired > 1:
        raise SystemExit("--suffix-only, --model-drafts-only and --paired exclude each other")
    if args.json is None:
        name = "plain_steps.json"
        if args.suffix_only:
            name = "plain_steps_suffix.json"
        elif args.model_drafts_only:
            name = "plain_steps_model_drafts.json"
        elif args.paired:
            name = "plain_steps_paired.json"
        args.json = str(REPO / "benchmarks/results" / name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft
    from sglang_spec_ext.replay.trace import read_trace

    model = ensure_smollm2_dir()
    weak = ensure_smollm2_draft()
    tok = AutoTokenizer.from_pretrained(model)
    pool = [ids for _, ids in workload(tok, 8)]
    mixed = {c: [pool[i % len(pool)] for i in range(max(args.requests, c))] for c in LEVELS}
    rng = random.Random(0)
    vocab = tok.vocab_size
    per_round = 8
    rand = [[rng.randrange(100, vocab) for _ in range(128)] for _ in range(per_round)]
    chat_all = [list(r.prompt_ids) for r in read_trace(REPO / "benchmarks/traces/chat.jsonl")]
    if len(chat_all) < per_round * args.rounds:
        raise SystemExit(
            f"chat.jsonl has {len(chat_all)} prompts; {per_round * args.rounds} needed"
        )
    # workload -> (prompts of round r, concurrency, temperature)
    suffix_sets = {
        "random": (lambda r: rand, 4, 1.0),
        "chat": (lambda r: chat_all[r * per_round : (r + 1) * per_round], 4, 0.0),
    }

    draft = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(weak),
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]  # fmt: skip
    suffix = ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", "8"]
    configs = {
        "plain": ([], {}),
        "plain, no overlap": (["--disable-overlap-schedule"], {}),
        "zero, host path": (draft, {**PINNED, **HOST_PATH}),
        "zero, plain steps": (draft, {**PINNED, **REPAIR}),
        "zero, overlap": (draft, {**PINNED, **REPAIR, "SGLANG_SPEC_EXT_CPU_OVERLAP": "1"}),
        "controller": (draft, {"SGLANG_SPEC_EXT_ADAPTIVE": "1", **REPAIR}),
        "SUFFIX, host path": (suffix, {"SGLANG_SPEC_EXT_PLAIN_STEPS": "0"}),
        "SUFFIX, plain steps": (suffix, {"SGLANG_SPEC_EXT_DRAFT_GATE": "0"}),
        "SUFFIX, gate": (suffix, {}),  # the default
    }
    model_servers = [
        "plain",
        "plain, no overlap",
        "zero, host path",
        "zero, plain steps",
        "zero, overlap",
        "controller",
    ]
    suffix_servers = ["plain", "plain, no overlap", "SUFFIX, host path", "SUFFIX, plain steps",
                      "SUFFIX, gate"]  # fmt: skip
    if args.suffix_only:
        model_servers = []
        suffix_servers = [n for n in suffix_servers if n != "SUFFIX, host path"]
        configs = {n: configs[n] for n in suffix_servers}
    if args.model_drafts_only:
        model_servers = [n for n in model_servers if n != "zero, host path"]
        suffix_servers = []
        configs = {n: configs[n] for n in model_servers}
    if args.paired:
        model_servers, suffix_servers = ["plain", "zero, plain steps"], []
        configs = {n: configs[n] for n in model_servers}
    jobs = [(n, "mixed", c) for n in model_servers for c in LEVELS]
    jobs += [(n, wl, spec[1]) for n in suffix_servers for wl, spec in suffix_sets.items()]

    def jobs_of_round(rnd: int) -> list[tuple]:
        if not args.paired:
            return jobs
        a, b = model_servers if rnd % 2 == 0 else model_servers[::-1]  # ABBA, then BAAB
        return [(n, "mixed", c) for c in LEVELS for n in (a, b, b, a)]

    totals: dict[tuple, dict] = {}
    with ExitStack() as stack:
        servers = {}
        for name, (extra, env) in tqdm(configs.items(), desc="starting servers", file=sys.stderr):
            server = serve(model, extra, "plain-steps-" + name.replace(", ", "-").replace(" ", "-"))
            server.env.update({**env, "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "5"})
            servers[name] = stack.enter_context(server)
            run(servers[name], [pool[0][:8]], 4)  # warm-up
        total_jobs = sum(len(jobs_of_round(r)) for r in range(args.rounds))
        bar = tqdm(total=total_jobs, desc="rounds x jobs", file=sys.stderr)
        for rnd in range(args.rounds):
            for name, wl, c in jobs_of_round(rnd):
                temperature = 0.0
                if wl == "mixed":
                    prompts = mixed[c]
                else:
                    make, _, temperature = suffix_sets[wl]
                    prompts = make(rnd)
                bar.set_postfix_str(f"{name} {wl} c={c}")
                got = level(servers[name], prompts, c, args.max_new_tokens, temperature)
                acc = totals.setdefault(
                    (name, wl, c),
                    {"wall_s": 0.0, "cpu_s": 0.0, "tokens": 0, "steps": 0, "outputs": []},
                )
                acc["wall_s"] += got["wall_s"]
                acc["cpu_s"] += got["cpu_s"]
                acc["tokens"] += got["tokens"]
                acc["steps"] += got["steps"]
                acc["outputs"] += got["outputs"] if temperature == 0 else []
                bar.update(1)
        bar.close()
        counts = {name: plain_counts(s.log_path) for name, s in servers.items()}
        gates = {name: gate_counts(s.log_path) for name, s in servers.items() if "gate" in name}

    results = []
    for (name, wl, c), acc in totals.items():
        row = {"server": name, "workload": wl, "concurrency": c,
               "goodput_tok_s": round(acc["tokens"] / acc["wall_s"], 2),
               "accept_length": round(acc["tokens"] / acc["steps"], 3) if acc["steps"] else None,
               "tokens": acc["tokens"], "wall_s": round(acc["wall_s"], 2),
               "cpu_ms_per_token": round(1000 * acc["cpu_s"] / acc["tokens"], 3)}  # fmt: skip
        for base_name in ("plain", "plain, no overlap"):
            if (base_name, wl, c) not in totals:
                continue
            base = totals[(base_name, wl, c)]
            key = "vs_plain" if base_name == "plain" else "vs_plain_no_overlap"
            row[key] = round(row["goodput_tok_s"] / (base["tokens"] / base["wall_s"]), 3)
            if base_name == "plain":  # plain's CPU seconds per token over this server's
                row["cpu_vs_plain"] = round(
                    (base["cpu_s"] / base["tokens"]) / (acc["cpu_s"] / acc["tokens"]), 3
                )
        # greedy workloads: every output equals the plain server's (sampled: not comparable)
        row["identical_to_plain"] = (
            acc["outputs"] == totals[("plain", wl, c)]["outputs"] if acc["outputs"] else None
        )
        results.append(row)
    report = {
        "what": "goodput (output tokens / wall second, summed over rounds) and CPU seconds per "
        "token (server process tree, user + system) of speculative servers with nothing to "
        "verify against plain decoding; SmolLM2-135M-Instruct, weak 14+8-layer STANDALONE "
        "draft, SGLang CPU engine (eager), greedy; measured",
        "machine": machine_info(),
        "parameters": {"rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                       "levels": list(LEVELS), "mixed_requests": {c: len(p) for c, p in mixed.items()},
                       "suffix_sets": {k: {"prompts_per_round": per_round, "concurrency": v[1],
                                           "temperature": v[2]} for k, v in suffix_sets.items()},
                       "servers": {n: {"args": a, "env": e} for n, (a, e) in configs.items()}},
        "plain_step_counters": counts,
        "draft_gate_counters": gates,
        "results": results,
    }  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"plain-step counters (last log line per server): {counts}")
    print(f"draft gate counters: {gates}")
    print(f"JSON: {args.json}")
    print("goodput, output tokens/s; x plain (overlap loop) and x plain without overlap;")
    print("accept length = tokens / verify steps; cpu x plain = plain's CPU seconds per token")
    print("over this server's (the whole server process tree, user + system; less sensitive")
    print("than wall time to other load on the machine); measured here, CPU engine, eager")
    print(f"{'server':<22}{'workload':<9}{'c':>4}{'tok/s':>8}{'x plain':>9}{'x no-ovl':>9}"
          f"{'cpu x plain':>12}{'accept':>8}{'identical':>11}")  # fmt: skip
    for r in results:
        same = {True: "yes", False: "NO", None: "sampled"}[r["identical_to_plain"]]
        acc = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        print(f"{r['server']:<22}{r['workload']:<9}{r['concurrency']:>4}{r['goodput_tok_s']:>8.1f}"
              f"{r['vs_plain']:>9.3f}{r.get('vs_plain_no_overlap', float('nan')):>9.3f}"
              f"{r['cpu_vs_plain']:>12.3f}{acc:>8}"
              f"{same:>11}")  # fmt: skip
    return 0 if all(r["identical_to_plain"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
