"""Adaptive draft steps served on SmolLM2-135M on CPU (benchmarks/results/adaptive_smollm2*.json).

SmolLM2-135M-Instruct, SGLang CPU engine: STANDALONE with the 14 + 8-layer draft of
``build_truncated_draft``, chain drafts (topk 1), on seven servers of one build: plain
decoding, fixed 1, 2 and 3 draft steps, the speculative server pinned at zero steps (the
adaptive servers' floor), our goodput controller (``SGLANG_SPEC_EXT_ADAPTIVE=1``, steps
0..3; by default with ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1``, so zero steps is plain
decoding) and the host's EMA policy driving the same runtime states
(``SGLANG_SPEC_EXT_ADAPTIVE_POLICY=host-ema``: SGLang's ``AdaptiveSpeculativeParams`` with
its default tiers capped at 3 steps; the host itself runs it for EAGLE only). Each server
serves the same mixed chat / code-edit workload at concurrency 1, 4 and 16 (greedy); goodput
is output tokens per wall-clock second of each level, measured here; outputs are compared
with plain decoding. The step counts our controller chose per batch-size tier come from its
log.

    .venv/bin/python benchmarks/adaptive_smollm2.py [--requests 8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import json
import signal
import sys
import time
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hybrid_smollm2 import workload  # noqa: E402
from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402

LEVELS = (1, 4, 16)


def shape(steps: int) -> list[str]:
    return ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]  # fmt: skip


def run_level(server, prompts: list[list[int]], concurrency: int, max_new: int) -> dict:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        rows = list(pool.map(lambda p: run(server, [p], max_new)[0], prompts))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in rows)
    steps = sum(r["verify_steps"] for r in rows)
    return {"rows": rows, "wall_s": wall, "tokens": tokens, "goodput_tok_s": tokens / wall,
            "accept_length": tokens / steps if steps else None}  # fmt: skip


def steps_chosen(log_path: Path) -> dict[int, dict[int, int]]:
    from sglang_spec_ext.sglang.model_drafts.step_policy import STEPS_LOG_MARK

    total: dict[int, dict[int, int]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if STEPS_LOG_MARK in line:
            for tier, counts in ast.literal_eval(line.split(STEPS_LOG_MARK, 1)[1].strip()).items():
                for s, n in counts.items():
                    total.setdefault(int(tier), {}).setdefault(int(s), 0)
                    total[int(tier)][int(s)] += n
    return {t: dict(sorted(c.items())) for t, c in sorted(total.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="requests per level (16 at c=16)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--zero-step",
        choices=("skip", "warm", "repair"),
        default="skip",
        help="adaptive servers at zero steps: skip the draft extend "
        "(SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1, zero steps = plain decoding), run it "
        "(the host default: zero steps still pay a draft forward), or skip it and rebuild "
        "the draft KV when a request drafts again (SGLANG_SPEC_EXT_DRAFT_KV_REPAIR=1)",
    )
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/adaptive_smollm2.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    model = ensure_smollm2_dir()
    weak = ensure_smollm2_draft()
    tok = AutoTokenizer.from_pretrained(model)
    pool = [ids for _, ids in workload(tok, 8)]
    per_level = {c: [pool[i % len(pool)] for i in range(max(args.requests, c))] for c in LEVELS}
    draft = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(weak)]
    adaptive = {"SGLANG_SPEC_EXT_ADAPTIVE": "1", "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "5"}
    if args.zero_step == "skip":
        adaptive["SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"] = "1"
    elif args.zero_step == "repair":
        adaptive["SGLANG_SPEC_EXT_DRAFT_KV_REPAIR"] = "1"
    configs = {
        "plain": ([], {}),
        **{f"fixed {s}": ([*draft, *shape(s)], {}) for s in (1, 2, 3)},
        # the speculative server pinned at zero steps: the floor of the adaptive servers
        # (the host's zero-step path against a server without speculation)
        "zero steps": ([*draft, *shape(3)], {**adaptive, "SGLANG_SPEC_EXT_ADAPTIVE_CANDIDATE_KS": "0"}),
        "controller": ([*draft, *shape(3)], adaptive),
        "host EMA": ([*draft, *shape(3)], {**adaptive, "SGLANG_SPEC_EXT_ADAPTIVE_POLICY": "host-ema"}),
    }  # fmt: skip
    results: dict[str, dict] = {}
    chosen = None
    bar = tqdm(total=len(configs) * len(LEVELS), desc="servers x levels", file=sys.stderr)
    for name, (extra, env) in configs.items():
        server = serve(model, extra, name.replace(" ", "-"))
        server.env.update(env)
        with server:
            run(server, [pool[0][:8]], 4)  # warm-up
            results[name] = {}
            for c in LEVELS:
                bar.set_postfix_str(f"{name} c={c}")
                results[name][c] = run_level(server, per_level[c], c, args.max_new_tokens)
                bar.update(1)
            if name == "controller":
                chosen = steps_chosen(server.log_path)
    bar.close()
    summary: dict[str, dict] = {}
    for name, levels in results.items():
        summary[name] = {}
        for c, lv in levels.items():
            base = results["plain"][c]["rows"]
            summary[name][c] = {
                "goodput_tok_s": round(lv["goodput_tok_s"], 2),
                "vs_plain": round(lv["goodput_tok_s"] / results["plain"][c]["goodput_tok_s"], 3),
                "accept_length": lv["accept_length"] and round(lv["accept_length"], 3),
                "identical_to_plain": all(
                    a["output_ids"] == b["output_ids"]
                    for a, b in zip(lv["rows"], base, strict=True)
                ),
                "wall_s": round(lv["wall_s"], 2),
            }
    report = {
        "what": "SmolLM2-135M-Instruct target, 14+8-layer truncated draft (STANDALONE, topk 1), "
        "SGLang CPU engine, greedy; goodput = output tokens / wall seconds per level, measured",
        "machine": machine_info(),
        "parameters": {"requests_per_level": {c: len(p) for c, p in per_level.items()},
                       "max_new_tokens": args.max_new_tokens, "levels": list(LEVELS),
                       "zero_step": args.zero_step},
        "results": summary,
        "controller_steps_chosen": chosen,
    }  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("goodput, output tokens/s (x plain) [accept length]; measured on this machine")
    print(
        f"{'server':<12}" + "".join(f"{'c=' + str(c):>24}" for c in LEVELS) + f"{'identical':>11}"
    )
    for name, levels in summary.items():
        cells = "".join(
            f"{v['goodput_tok_s']:>9.1f} ({v['vs_plain']:.2f}x) [{(v['accept_length'] or 1):.2f}]"
            for v in levels.values()
        )
        same = all(v["identical_to_plain"] for v in levels.values())
        print(f"{name:<12}{cells}{'yes' if same else 'NO':>11}")
    print(f"controller steps chosen per batch-size tier: {chosen}")
    print(f"JSON: {args.json}")
    return 0 if all(v["identical_to_plain"] for lv in summary.values() for v in lv.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
