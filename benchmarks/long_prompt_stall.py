#!/usr/bin/env python
"""Worst drafter step as a long prompt joins a batch (benchmarks/results/long_prompt_stall.json).

Drives SuffixDrafter the way the SUFFIX worker does: each decode step, new
requests ``start_request`` with their prompt, every running request
``extend_request`` with the tokens it committed, then one ``speculate_batch``
for the whole batch. `--live` requests decode (repetitive streams); at step
`--arrive` a `--long`-token prompt joins. The time of each whole step's drafter
calls is recorded. Modes:

* ``incremental``: the defaults (prompt queued, at most step_insert_tokens
  inserted per step; per-request window and global prompt cap);
* ``all-at-once``: the pre-issue-15 behaviour (everything inserted at the
  first step: step budget, window and prompt cap set to 2**28).

    python benchmarks/long_prompt_stall.py               # ~1 min on 2 cores
    python benchmarks/long_prompt_stall.py --long 131072 --live 32 --steps 120
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_spec_ext.machine import machine_info
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter

HERE = Path(__file__).resolve().parent
BIG = 1 << 28


def stream(rng: np.random.Generator, base: np.ndarray, n: int) -> list[int]:
    """Copies of stretches of `base` with edits: repetitive, like agentic text."""
    out: list[int] = []
    while len(out) < n:
        if rng.random() < 0.8:
            s = int(rng.integers(0, len(base) - 64))
            out += base[s : s + int(rng.integers(8, 64))].tolist()
        else:
            out += rng.integers(0, 32000, size=8).tolist()
    return out[:n]


def run(mode: str, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    base = rng.integers(0, 32000, size=20000)
    if mode == "incremental":
        cfg = SuffixConfig(max_depth=args.depth)
    else:
        cfg = SuffixConfig(
            max_depth=args.depth,
            max_request_tokens=BIG,
            global_prompt_cap=BIG,
            step_insert_tokens=1 << 30,
        )
    d = SuffixDrafter(cfg, backend=args.backend)
    outs: dict[str, list[int]] = {}
    # Warm-up: the live requests start and are fully inserted before timing.
    for i in range(args.live):
        rid = f"live{i}"
        d.start_request(rid, stream(rng, base, args.prompt))
        outs[rid] = stream(rng, base, 100000)
    d.flush()
    d.speculate_batch(list(outs), args.width - 1)
    long_prompt = stream(rng, base, args.long)
    long_output = stream(rng, base, 100000)
    times = []
    pos = dict.fromkeys(outs, 0)
    for step in tqdm(range(args.steps), desc=mode, leave=False):
        t0 = time.perf_counter()
        if step == args.arrive:
            d.start_request("long", long_prompt)
            outs["long"] = long_output
            pos["long"] = 0
        for rid in outs:
            k = 1 + step % 3
            d.extend_request(rid, outs[rid][pos[rid] : pos[rid] + k])
            pos[rid] += k
        d.speculate_batch(list(outs), args.width - 1)
        times.append(time.perf_counter() - t0)
    before = times[: args.arrive]
    after = times[args.arrive :]
    s = d.stats()
    t0 = time.perf_counter()
    d.finish_request("long")
    finish_ms = (time.perf_counter() - t0) * 1e3
    return {
        "mode": mode,
        "config": cfg.as_dict(),
        "worst_step_ms": max(after) * 1e3,
        "median_step_ms_before_arrival": statistics.median(before) * 1e3,
        "median_step_ms_after_arrival": statistics.median(after) * 1e3,
        "finish_long_ms": finish_ms,
        "step_ms": [round(t * 1e3, 4) for t in times],
        "final_stats": s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", type=int, default=131072, help="tokens of the long prompt")
    ap.add_argument("--live", type=int, default=32, help="requests decoding meanwhile")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens of live requests")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--arrive", type=int, default=20, help="step at which the long prompt joins")
    ap.add_argument("--width", type=int, default=8, help="verify width (draft nodes + 1)")
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--backend", default="native", choices=("native", "python", "auto"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "long_prompt_stall.json")
    args = ap.parse_args()
    if not 0 < args.arrive < args.steps:
        ap.error("--arrive must be inside (0, --steps)")
    rows = [run(mode, args) for mode in ("all-at-once", "incremental")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(
        json.dumps({"machine": machine_info(), "parameters": params, "runs": rows}, indent=1)
    )
    print(f"wrote {args.out}")
    print(
        f"\n{args.long}-token prompt joins {args.live} decoding requests at step {args.arrive}"
        f" (per-step drafter time: start + extends + speculate_batch)"
    )
    print(f"{'mode':<14}{'worst step ms':>15}{'median before':>15}{'median after':>14}")
    for r in rows:
        print(
            f"{r['mode']:<14}{r['worst_step_ms']:>15.2f}"
            f"{r['median_step_ms_before_arrival']:>15.3f}{r['median_step_ms_after_arrival']:>14.3f}"
        )


if __name__ == "__main__":
    main()
