#!/usr/bin/env python
"""HYBRID with wide steps against SUFFIX alone at width 16 (benchmarks/results/hybrid_wide.json).

HYBRID verifies the model's 3-token chains at width 4; before wide steps a winning suffix
draft was cut to those 3 tokens, so on repetitive text HYBRID accepted less than SUFFIX
alone at width 16. With wide steps (``hybrid/wide.py``, ``SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH``,
default 16) it keeps up to 15. Two parts, on the committed code-edit and repeat traces
(``benchmarks/traces/``; repeat: 20 chat questions, then the same 20 again):

* **replay** (exact, offline; ``benchmarks/traces/hybrid/`` carries the weak draft's
  recorded chains, ``benchmarks/model_drafts.py``): HYBRID (learned choice, chain suffix
  trees as served at topk 1 on the CPU engine; chains, what the GPU backends verify at
  topk 1, too) at suffix width 4 and 16 beside SUFFIX alone at width 16 (tree drafts, the
  default, and chains). A replay takes every wide step (no step cost);
* **served** (SmolLM2-135M on the CPU engine, the server's default mode, one request at a
  time, greedy): plain, SUFFIX at width 16, and HYBRID with the weak STANDALONE draft
  (``build_truncated_draft``: 14 + 8 layers; ``--speculative-num-steps 3 --speculative-
  eagle-topk 1``) at suffix width 4 and 16 on a subset of both traces (``--code-edit N``
  requests, ``--repeat N`` question pairs: the first N and their repeats). Prints whether
  every output equals plain serving, the accept length the host reports (committed tokens
  per verify step), tok/s against plain, and HYBRID's wide-step figures from its log.

    .venv/bin/python benchmarks/hybrid_wide.py [--code-edit 6] [--repeat 6]
        [--max-new-tokens 96] [--concurrency 1] [--skip-served] [--json PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info, package_versions  # noqa: E402

SETS = ("code-edit", "repeat")
DRAFT = "smollm2-l14+8"
STEPS = 3
CHAIN = ["--speculative-num-steps", str(STEPS), "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", str(STEPS + 1)]  # fmt: skip


def replay_part(traces: Path) -> dict:
    from sglang_spec_ext.replay import DrafterOptions, make_drafter, read_trace, replay
    from sglang_spec_ext.replay.hybrid import replay_hybrid

    out: dict[str, dict] = {}
    for name in SETS:
        recs = read_trace(traces / "hybrid" / f"{name}.jsonl")
        row = {}
        for width, tree in ((STEPS + 1, True), (16, True), (16, False)):
            res = replay_hybrid(recs, "learned", steps=STEPS, draft_name=DRAFT,
                                suffix_options=DrafterOptions(width=width, use_tree=tree),
                                suffix_width=width)  # fmt: skip
            label = f"HYBRID suffix width {width}" + ("" if tree else " (chains)")
            row[label] = res.overall.summary()["accept_len"]
        for label, tree in (("SUFFIX w16 (tree)", True), ("SUFFIX w16 (chain)", False)):
            drafter = make_drafter("suffix", DrafterOptions(width=16, use_tree=tree))
            row[label] = replay(recs, drafter, 16).overall.summary()["accept_len"]
        out[name] = row
    return out


def served_prompts(traces: Path, n_edit: int, n_repeat: int) -> list[tuple[str, list[int]]]:
    from sglang_spec_ext.replay import read_trace

    edits = read_trace(traces / "code-edit.jsonl")[:n_edit]
    repeat = read_trace(traces / "repeat.jsonl")
    half = len(repeat) // 2  # the first 20, then the same 20 again
    pairs = repeat[:n_repeat] + repeat[half : half + n_repeat]
    return [("code-edit", list(r.prompt_ids)) for r in edits] + [
        ("repeat", list(r.prompt_ids)) for r in pairs
    ]


def wide_stats(log_path: Path) -> dict | None:
    from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK

    text = log_path.read_text(errors="replace").splitlines()
    lines = [ln for ln in text if STATS_LOG_MARK in ln]
    if not lines:
        return None
    stats = json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])
    return {"wide": stats.get("wide"), "by_source": stats["by_source"]}


def _send(server, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> list[dict]:
    if concurrency <= 1:
        return run(server, prompts, max_new_tokens)
    with cf.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: run(server, [p], max_new_tokens)[0], prompts))


def served_part(cases: list, max_new_tokens: int, concurrency: int = 1) -> dict:
    from tqdm import tqdm

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    model, weak = ensure_smollm2_dir(), ensure_smollm2_draft()
    hybrid = ["--speculative-algorithm", "HYBRID", "--speculative-draft-model-path", str(weak),
              *CHAIN]  # fmt: skip
    stats_env = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
    configs = {
        "plain": ([], {}),
        "SUFFIX w16": (["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens",
                        "16"], {}),  # fmt: skip
        "HYBRID suffix width 4": (hybrid, {**stats_env, "SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH": "4"}),
        "HYBRID suffix width 16": (hybrid, {**stats_env, "SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH": "16"}),
    }  # fmt: skip
    prompts = [ids for _, ids in cases]
    rows: dict[str, list[dict]] = {}
    walls: dict[str, float] = {}
    logs: dict[str, dict | None] = {}
    for name, (extra, env) in tqdm(configs.items(), desc="servers", unit="server"):
        server = serve(model, extra, name.lower().replace(" ", "-"))
        server.env.update(env)
        with server:
            run(server, [prompts[0][:8]], 4)  # warm-up
            start = time.perf_counter()
            rows[name] = _send(server, prompts, max_new_tokens, concurrency)
            walls[name] = time.perf_counter() - start
            if name.startswith("HYBRID"):
                logs[name] = wide_stats(server.log_path)
    base = rows["plain"]
    plain_tps = sum(r["tokens"] for r in base) / walls["plain"]
    out = {}
    for name, rs in rows.items():
        per_set = {}
        for kind in SETS:
            sel = [r for (k, _), r in zip(cases, rs, strict=True) if k == kind]
            tokens, steps = sum(r["tokens"] for r in sel), sum(r["verify_steps"] for r in sel)
            per_set[kind] = tokens / steps if steps else None
        tps = sum(r["tokens"] for r in rs) / walls[name]  # output tokens per wall second
        out[name] = {
            "identical_to_plain": all(
                a["output_ids"] == b["output_ids"] for a, b in zip(rs, base, strict=True)
            ),
            "accept_length": per_set,
            "tok_s": tps,
            "tok_s_vs_plain": tps / plain_tps,
            "log": logs.get(name),
        }
    return out


def table(replayed: dict, served: dict | None) -> str:
    lines = ["", "accept length (committed tokens per verify step)", ""]
    names = list(next(iter(replayed.values())))
    lines.append(f"{'replay':<26}" + "".join(f"{s:>12}" for s in SETS))
    for n in names:
        lines.append(f"{n:<26}" + "".join(f"{replayed[s][n]:>12.2f}" for s in SETS))
    if served:
        lines += ["", f"{'served':<26}" + "".join(f"{s:>12}" for s in SETS)
                  + f"{'tok/s x plain':>15}{'identical':>11}"]  # fmt: skip
        for n, row in served.items():
            accept = "".join(
                f"{row['accept_length'][s]:>12.2f}" if row["accept_length"][s] else f"{'-':>12}"
                for s in SETS
            )
            lines.append(f"{n:<26}{accept}{row['tok_s_vs_plain']:>15.2f}"
                         f"{str(row['identical_to_plain']):>11}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code-edit", type=int, default=6, help="code-edit requests served")
    ap.add_argument("--repeat", type=int, default=6, help="question pairs served")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight (served)")
    ap.add_argument("--skip-served", action="store_true", help="the replay only")
    ap.add_argument("--traces", type=Path, default=REPO / "benchmarks/traces")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/results/hybrid_wide.json")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    replayed = replay_part(args.traces)
    cases = served_prompts(args.traces, args.code_edit, args.repeat)
    served = (None if args.skip_served
              else served_part(cases, args.max_new_tokens, args.concurrency))  # fmt: skip
    result = {
        "benchmark": "hybrid_wide",
        "what": "HYBRID accept length with wide steps (suffix width 16) vs without (4) vs "
        "SUFFIX alone at width 16, replayed on the committed traces and served on SmolLM2 "
        "(CPU engine, one request at a time, greedy)",
        "parameters": {
            "steps": STEPS,
            "draft": DRAFT,
            "code_edit_served": args.code_edit,
            "repeat_pairs_served": args.repeat,
            "concurrency": args.concurrency,
            "max_new_tokens": args.max_new_tokens,
        },  # fmt: skip
        "replay": replayed,
        "served": served,
        "machine": machine_info(),
        "versions": package_versions(),
        "wall_s": round(time.time() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"served: SmolLM2-135M, CPU engine, concurrency {args.concurrency}")
    print(table(replayed, served))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
