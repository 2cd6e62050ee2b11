#!/usr/bin/env python
"""Suffix chains against suffix trees by exact offline replay (results/chain_vs_tree.json).

The host's FA3 and trtllm_mha backends verify a ragged layout causally, so on a GPU SUFFIX
verifies each request at its own length only with chain drafts
(``SGLANG_SPEC_EXT_USE_TREE=0``, ``sglang/verify/ragged_backends.py``); trees there are
verified padded to the width. What chains give up: for each committed trace and verify
width, the suffix drafter replays the trace once drafting trees and once drafting chains
(fresh state each), and this prints accept length (tokens per verify step, bonus
included), draft nodes per step, and accepted tokens per verified token: ragged (root plus
the draft, what a ragged verify puts through the target) and padded (the width). Replay is
exact (the recorded outputs are what a greedy target commits); no server, no timing.

    python benchmarks/chain_vs_tree.py [--widths 8,16] [--sets chat,code-edit,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.machine import machine_info, package_versions  # noqa: E402
from sglang_spec_ext.replay import DrafterOptions, make_drafter, read_trace, replay  # noqa: E402

TRACES = REPO / "benchmarks" / "traces"
OUT = REPO / "benchmarks" / "results" / "chain_vs_tree.json"
SETS = ("chat", "code-gen", "code-edit", "agentic", "repeat")


def cell(trace: str, width: int, chain: bool) -> dict:
    opts = DrafterOptions(width=width, use_tree=not chain)
    stats = replay(read_trace(TRACES / f"{trace}.jsonl"), make_drafter("suffix", opts), width)
    s = stats.overall.summary()
    steps = max(s["steps"], 1)
    committed = s["accept_len"] * steps
    return {
        "accept_len": round(s["accept_len"], 3),
        "drafted_per_step": round(s["drafted_per_step"], 3),
        "tokens_per_verified_token_ragged": round(
            committed / (steps * (1 + s["drafted_per_step"])), 4
        ),
        "tokens_per_verified_token_padded": round(committed / (steps * width), 4),
        "steps": s["steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="8,16")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    sets = args.sets.split(",")
    jobs = [(t, w, c) for t in sets for w in widths for c in (False, True)]
    results: dict = {}
    for trace, width, chain in tqdm(jobs, desc="replay", file=sys.stderr):
        results.setdefault(trace, {}).setdefault(str(width), {})["chain" if chain else "tree"] = (
            cell(trace, width, chain)
        )
    report = {
        "what": "suffix drafter, exact offline replay of the committed traces, trees vs chains "
        "(SuffixConfig defaults otherwise); tokens per verified token = committed decode tokens "
        "over tokens a ragged (root + draft) or padded (width) verify puts through the target",
        "machine": machine_info(),
        "versions": package_versions(),
        "parameters": {"widths": widths, "sets": sets},
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    header = f"{'set':<10} {'W':>3} {'tree acc':>8} {'chain acc':>9} {'chain/tree':>10} "
    header += f"{'tree tok/vt ragged':>18} {'chain tok/vt ragged':>19} {'tree tok/vt padded':>18}"
    print(f"wrote {args.out}\n\n{header}\n{'-' * len(header)}")
    for trace in sets:
        for width in widths:
            r = results[trace][str(width)]
            t, c = r["tree"], r["chain"]
            print(f"{trace:<10} {width:>3} {t['accept_len']:>8.2f} {c['accept_len']:>9.2f} "
                  f"{c['accept_len'] / t['accept_len']:>10.3f} "
                  f"{t['tokens_per_verified_token_ragged']:>18.3f} "
                  f"{c['tokens_per_verified_token_ragged']:>19.3f} "
                  f"{t['tokens_per_verified_token_padded']:>18.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
