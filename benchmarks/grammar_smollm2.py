"""Grammar-aware drafts served on SmolLM2-135M on CPU (benchmarks/results/grammar_smollm2.json).

SmolLM2-135M-Instruct, SGLang CPU engine (fp32), the host's xgrammar backend, greedy, the
structured workload of ``bench/structured_workloads.py`` (tool calls under a JSON schema of
three tools with nested objects, enums and arrays; regex answers; JSON mode; unconstrained
chat). Servers of one build, one after another: plain constrained decoding; the host's
NGRAM; SUFFIX as it was (``SGLANG_SPEC_EXT_GRAMMAR_DRAFTS=0``); SUFFIX with grammar-aware
drafts. All at verify width 16. Each serves the same requests at each concurrency level,
levels in order; outputs are compared with plain's token for token. Accept length = output
tokens / verify steps of the structured requests (the host's ``spec_verify_ct``); goodput =
output tokens per wall second of the level, measured here. The grammar servers' stats line
gives the nodes cut and forced.

    .venv/bin/python benchmarks/grammar_smollm2.py [--levels 1,8] [--requests 16]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import signal
import sys
import time
from pathlib import Path

import requests
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from model_draft_smollm2 import serve  # noqa: E402
from ragged_smollm2 import last_stats  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402

WIDTH = 16
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
SUFFIX = ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]
NGRAM = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(WIDTH)]
CONFIGS = {
    "plain": ([], {}),
    "NGRAM": (NGRAM, {}),
    "SUFFIX": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_GRAMMAR_DRAFTS": "0"}),
    "SUFFIX grammar": (SUFFIX, STATS),
}


def ask(server, ids: list[int], constraint: dict, max_new: int) -> dict:
    payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new,
                                                     "temperature": 0, **constraint}}  # fmt: skip
    t0 = time.perf_counter()
    r = requests.post(server.url + "/generate", json=payload, timeout=900)
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    return {"output_ids": out["output_ids"], "tokens": meta["completion_tokens"],
            "seconds": time.perf_counter() - t0,
            "verify_steps": meta.get("spec_verify_ct") or 0,
            "structured": bool(constraint)}  # fmt: skip


def run_level(server, reqs: list[tuple[str, list[int], dict]], c: int, max_new: int) -> dict:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        rows = list(pool.map(lambda r: ask(server, r[1], r[2], max_new), reqs))
    wall = time.perf_counter() - t0
    s_tok = sum(r["tokens"] for r in rows if r["structured"])
    s_steps = sum(r["verify_steps"] for r in rows if r["structured"])
    tokens = sum(r["tokens"] for r in rows)
    steps = sum(r["verify_steps"] for r in rows)
    return {"rows": rows, "wall_s": wall, "tokens": tokens, "goodput_tok_s": tokens / wall,
            "accept_length": tokens / steps if steps else None,
            "structured_accept_length": s_tok / s_steps if s_steps else None}  # fmt: skip


def level_summary(lv: dict, base: dict) -> dict:
    """One server's level against plain's: goodput, accept length, identical outputs."""
    diff = [i for i, (a, b) in enumerate(zip(lv["rows"], base["rows"], strict=True))
            if a["output_ids"] != b["output_ids"]]  # fmt: skip
    acc = lv["structured_accept_length"]
    return {
        "goodput_tok_s": round(lv["goodput_tok_s"], 2),
        "vs_plain": round(lv["goodput_tok_s"] / base["goodput_tok_s"], 3),
        "accept_length_structured": acc and round(acc, 3),
        "identical_to_plain": not diff,
        "differing_requests": diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level (>= c)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/grammar_smollm2.json"))
    ap.add_argument("--trace", default=None, metavar="OUT.jsonl",
                    help="also write plain serving's outputs as a replay trace with each "
                    "request's constraint (simulate --tokenizer replays grammar drafts)")  # fmt: skip
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    levels = [int(x) for x in args.levels.split(",")]
    names = [n for n in args.configs.split(",") if n]
    if "plain" not in names:
        names.insert(0, "plain")

    from transformers import AutoTokenizer

    from sglang_spec_ext.bench.structured_workloads import structured_requests
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model = ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model)
    per_level = {c: structured_requests(tok, max(args.requests, c), seed=c) for c in levels}
    room = ["--max-running-requests", str(max(levels)), "--max-total-tokens", "65536"]
    results: dict[str, dict[int, dict]] = {n: {} for n in names}
    stats: dict[str, dict | None] = {}
    bar = tqdm(total=len(names) * len(levels), desc="servers x levels", file=sys.stderr)
    for name in names:
        extra, env = CONFIGS[name]
        server = serve(model, [*extra, *room], name.replace(" ", "-"))
        server.env.update(env)
        with server:
            ask(server, per_level[levels[0]][0][1][:8], {}, 4)  # warm-up
            for c in levels:
                bar.set_postfix_str(f"{name} c={c}")
                results[name][c] = run_level(server, per_level[c], c, args.max_new_tokens)
                bar.update(1)
            stats[name] = last_stats(server.log_path) if "SUFFIX" in name else None
    bar.close()

    summary: dict[str, dict] = {}
    for name in names:
        summary[name] = {}
        for c in levels:
            lv = results[name][c]
            summary[name][c] = {
                **level_summary(lv, results["plain"][c]),
                "accept_length_all": lv["accept_length"] and round(lv["accept_length"], 3),
                "wall_s": round(lv["wall_s"], 2),
            }
    keep = ("verify_tokens_per_step", "padded_verify_tokens_per_step", "ragged_verify_steps")
    grammar_stats = {n: {k: v for k, v in (s or {}).items() if k.startswith("grammar_") or k in keep}
                     for n, s in stats.items() if s}  # fmt: skip
    report = {
        "what": "SmolLM2-135M-Instruct, SGLang CPU engine (fp32, torch_native), xgrammar, greedy, "
        "structured workload (bench/structured_workloads.py); accept length over the "
        "constrained requests; goodput = output tokens / wall seconds per level, measured on "
        "this machine, servers one after another, levels in order on one server",
        "machine": machine_info(),
        "parameters": {
            "width": WIDTH,
            "levels": levels,
            "max_new_tokens": args.max_new_tokens,
            "requests_per_level": {c: len(r) for c, r in per_level.items()},
            "configs": {n: CONFIGS[n] for n in names},
        },  # fmt: skip
        "results": summary,
        "grammar_stats": grammar_stats,
        # what the target writes under each constraint (plain serving, first level)
        "sample_outputs": [
            {"kind": kind, "constraint": sorted(con), "text": tok.decode(row["output_ids"])}
            for (kind, _, con), row in zip(
                per_level[levels[0]][:8], results["plain"][levels[0]]["rows"][:8], strict=True
            )
        ],  # fmt: skip
    }
    if args.trace:
        from sglang_spec_ext.replay.trace import TraceRecord, write_trace

        records = [
            TraceRecord(tuple(ids), tuple(row["output_ids"]), set=f"{kind} c={c}",
                        constraint=dict(con) or None)
            for c in levels
            for (kind, ids, con), row in zip(per_level[c], results["plain"][c]["rows"], strict=True)
        ]  # fmt: skip
        print(f"trace: {write_trace(args.trace, records)} requests -> {args.trace}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("goodput, output tokens/s (x plain) [accept length, constrained requests]; measured "
          "on this machine")  # fmt: skip
    for c in levels:
        print(f"-- concurrency {c}")
        for name in names:
            v = summary[name][c]
            print(f"  {name:<16}{v['goodput_tok_s']:>9.1f} ({v['vs_plain']:.2f}x) "
                  f"[{(v['accept_length_structured'] or 1):.2f}] "
                  f"{'identical' if v['identical_to_plain'] else 'DIFFERENT'}")  # fmt: skip
    print("grammar stats:", json.dumps(grammar_stats))
    print(f"JSON: {args.json}")
    return 0 if all(v["identical_to_plain"] for lv in summary.values() for v in lv.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
