"""Ragged verify served on SmolLM2-135M on CPU (benchmarks/results/ragged_smollm2.json).

SmolLM2-135M-Instruct, SGLang CPU engine, greedy, the mixed workload of
``bench/demo_workloads.py`` (code edits, agent loops and a repeated question beside chat and
random-token prompts). Servers of one build, one after another: plain decoding; SUFFIX at
width 16 as it was before ragged verify (``SGLANG_SPEC_EXT_RAGGED_VERIFY=0``: padded verify,
the draft gate deciding per step); adaptive SUFFIX (the width controller, padded); and
SUFFIX at width 16 with ragged verify (each request's own draft, cut per request by the
draft gate's goodput lengths: the default now). Each serves the same requests at each
concurrency level; goodput is output tokens per wall-clock second of the level, measured
here; outputs are compared with plain decoding token for token; verify tokens per step
(with and without the padding) come from the SUFFIX servers' stats lines.

    .venv/bin/python benchmarks/ragged_smollm2.py [--levels 1,4,16,64] [--rounds 2] [--cold]

By default a server serves the levels in order, so later levels meet text its trees saw
at earlier ones (warm trees, a fitted step cost). ``--cold`` starts every server afresh for
each level (results/ragged_smollm2_cold.json): each level is a new server's first traffic,
the mix as a user first meets it (empty trees, the step cost still the prior's).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from adaptive_smollm2 import run_level  # noqa: E402
from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402

WIDTH = 16
SUFFIX = ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
CONFIGS = {
    "plain": ([], {}),
    "SUFFIX padded": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_RAGGED_VERIFY": "0"}),
    "adaptive padded": (
        SUFFIX,
        {**STATS, "SGLANG_SPEC_EXT_ADAPTIVE": "1", "SGLANG_SPEC_EXT_RAGGED_VERIFY": "0"},
    ),
    "SUFFIX ragged": (SUFFIX, STATS),
    # With the target's recycled top-k beside the trees (opt-in, issue 57).
    "SUFFIX ragged recycling": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_RECYCLE_TOPK": "8"}),
    # The gate's node probabilities as calibrated, not weighed by what verified drafts
    # realised of what was expected (SGLANG_SPEC_EXT_DRAFT_GATE_REALISED=0).
    "SUFFIX ragged unscaled": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_DRAFT_GATE_REALISED": "0"}),
    # Without the draft gate: every draft verified whole (not in the default run).
    "SUFFIX padded ungated": (
        SUFFIX,
        {**STATS, "SGLANG_SPEC_EXT_RAGGED_VERIFY": "0", "SGLANG_SPEC_EXT_DRAFT_GATE": "0"},
    ),
    "SUFFIX ragged ungated": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_DRAFT_GATE": "0"}),
    # Overlap scheduling on the speculative server as on the plain one (the CPU engine
    # overlaps plain decoding only; SGLANG_SPEC_EXT_CPU_OVERLAP is the GPU path's emulation).
    "SUFFIX ragged overlap": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_CPU_OVERLAP": "1"}),
    # The floor: SUFFIX drafting (matches, trees) with every draft budget cut to zero, so
    # every step is the worker's plain decode step (a diagnostic, not in the default run).
    "SUFFIX no drafts": (
        SUFFIX,
        {**STATS, "SGLANG_SPEC_EXT_SPEC_FACTOR": "0", "SGLANG_SPEC_EXT_SPEC_OFFSET": "-64"},
    ),
}
DEFAULT_CONFIGS = ("plain", "SUFFIX padded", "adaptive padded", "SUFFIX ragged")


def last_stats(log_path: Path) -> dict:
    from sglang_spec_ext.sglang.workers.suffix_sessions import STATS_LOG_MARK

    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if STATS_LOG_MARK in ln]
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1]) if lines else {}


def verify_tokens(before: dict, after: dict) -> dict | None:
    """Verify tokens per verify step over one level (the stats line's running totals)."""
    keys = ("verify_steps", "verify_tokens_per_step", "padded_verify_tokens_per_step")
    if not all(k in after for k in keys):
        return None
    steps0 = before.get("verify_steps", 0)
    steps = after["verify_steps"] - steps0
    if steps <= 0:
        return None

    def total(stats: dict, key: str) -> float:
        return stats.get(key, 0.0) * max(stats.get("verify_steps", 0), 1)

    return {
        "verify_steps": steps,
        "verified": round((total(after, keys[1]) - total(before, keys[1])) / steps, 2),
        "padded": round((total(after, keys[2]) - total(before, keys[2])) / steps, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--min-requests", type=int, default=16, help="requests per level (>= c)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"comma-separated, of: {', '.join(CONFIGS)}")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every server again this many times, alternating (the machine's "
                    "noise between servers); figures are means over rounds")  # fmt: skip
    ap.add_argument("--cold", action="store_true",
                    help="a fresh server for every level (default: one per round, levels in "
                    "order)")  # fmt: skip
    ap.add_argument("--json", default=None, help="default: results/ragged_smollm2[_cold].json")
    args = ap.parse_args(argv)
    if args.json is None:
        name = "ragged_smollm2_cold.json" if args.cold else "ragged_smollm2.json"
        args.json = str(REPO / "benchmarks/results" / name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    levels = [int(x) for x in args.levels.split(",")]
    names = [n for n in args.configs.split(",") if n]
    if "plain" not in names:
        names.insert(0, "plain")

    from transformers import AutoTokenizer

    from sglang_spec_ext.bench.demo_workloads import mixed_prompts
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model = ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model)
    per_level = {c: [ids for _, ids in mixed_prompts(tok, max(args.min_requests, c), seed=c)]
                 for c in levels}  # fmt: skip
    room = ["--max-running-requests", str(max(levels)), "--max-total-tokens", "65536"]
    results: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in levels} for n in names}
    tokens_per_step: dict[str, dict] = {n: {} for n in names}
    bar = tqdm(total=args.rounds * len(names) * len(levels), desc="rounds x servers x levels",
               file=sys.stderr)  # fmt: skip
    groups = [[c] for c in levels] if args.cold else [levels]  # the levels one server serves
    for _round in range(args.rounds):
        for name in names:
            extra, env = CONFIGS[name]
            for group in groups:
                server = serve(model, [*extra, *room], name.replace(" ", "-"))
                server.env.update(env)
                with server:
                    run(server, [per_level[group[0]][0][:8]], 4)  # warm-up
                    for c in group:
                        bar.set_postfix_str(f"{name} c={c}")
                        before = last_stats(server.log_path)
                        results[name][c].append(run_level(server, per_level[c], c,
                                                          args.max_new_tokens))  # fmt: skip
                        after = last_stats(server.log_path)
                        tokens_per_step[name][c] = verify_tokens(before, after)
                        if after:
                            tokens_per_step[name].setdefault("stats_by_level", {})[c] = after
                        bar.update(1)
                    final_stats = last_stats(server.log_path)
                    if final_stats:
                        tokens_per_step[name]["final_stats"] = final_stats
    bar.close()

    def mean(rows: list[dict], key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return sum(vals) / len(vals) if vals else None

    summary: dict[str, dict] = {}
    for name, by_level in results.items():
        summary[name] = {}
        for c, rounds in by_level.items():
            base = results["plain"][c]
            same = all(a["output_ids"] == b["output_ids"]
                       for lv in rounds for a, b in zip(lv["rows"], base[0]["rows"], strict=True))  # fmt: skip
            accept = mean(rounds, "accept_length")
            summary[name][c] = {
                "goodput_tok_s": round(mean(rounds, "goodput_tok_s"), 2),
                "vs_plain": round(mean(rounds, "goodput_tok_s") / mean(base, "goodput_tok_s"), 3),
                "vs_plain_per_round": [
                    round(a["goodput_tok_s"] / b["goodput_tok_s"], 3)
                    for a, b in zip(rounds, base, strict=True)
                ],  # fmt: skip
                "accept_length": accept and round(accept, 3),
                "identical_to_plain": same,
                "verify_tokens_per_step": tokens_per_step[name].get(c),
                "wall_s": round(sum(r["wall_s"] for r in rounds), 2),
            }
    report = {
        "what": "SmolLM2-135M-Instruct, SGLang CPU engine (fp32, torch_native), greedy, mixed "
        "workload (bench/demo_workloads.mixed_prompts); goodput = output tokens / wall seconds "
        "per level, measured on this machine, servers run one after another (each round "
        "restarts every server; figures are means over rounds, ratios of means); "
        + (
            "every level on a fresh server (cold trees, the step cost the prior's)"
            if args.cold
            else "a server serves the levels in order, so later levels meet text its trees saw "
            "earlier"
        ),
        "machine": machine_info(),
        "parameters": {
            "width": WIDTH,
            "levels": levels,
            "max_new_tokens": args.max_new_tokens,
            "rounds": args.rounds,
            "cold": args.cold,
            "requests_per_level": {c: len(p) for c, p in per_level.items()},
            "configs": {n: CONFIGS[n] for n in names},
        },  # fmt: skip
        "results": summary,
        "suffix_stats": {n: tokens_per_step[n].get("final_stats") for n in names},
        "suffix_stats_by_level": {n: tokens_per_step[n].get("stats_by_level") for n in names},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("goodput, output tokens/s (x plain) [accept length] {verify tokens/step: verified of"
          f" padded}}; measured on this machine, mean of {args.rounds} round(s)")  # fmt: skip
    for c in levels:
        print(f"-- concurrency {c}")
        for name in names:
            v = summary[name][c]
            vt = v["verify_tokens_per_step"]
            vts = f"{vt['verified']:.1f} of {vt['padded']:.1f}" if vt else "-"
            print(f"  {name:<23}{v['goodput_tok_s']:>9.1f} ({v['vs_plain']:.2f}x) "
                  f"[{(v['accept_length'] or 1):.2f}] {{{vts}}} "
                  f"{'identical' if v['identical_to_plain'] else 'DIFFERENT'}")  # fmt: skip
    print(f"JSON: {args.json}")
    return 0 if all(v["identical_to_plain"] for lv in summary.values() for v in lv.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
