#!/usr/bin/env python
"""Padded verify rows on a CPU: fresh tensors against the ring (results/padded_rows.json).

A ragged verify hands the host's verify ``bs x W`` rows of logits, its own rows scattered
in and the padding zero (``sglang/verify/padded_rows.py``). This times, on this machine's
CPU with torch's intra-op threads as a server uses them, one step's scatter plus the
argmax the host's greedy verify runs over the rows: into a fresh zeroed tensor each step
(what the plugin did before: a new ``mmap`` and a page fault per 4 KiB page at these
sizes) and into the ring of persistent buffers. SmolLM2's vocabulary (49152), width 16,
the requests' own rows as a cold c=16 / c=64 step verified them (27 and 104 tokens).
A microbenchmark of one step's host work, not served throughput.

    python benchmarks/padded_rows.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.machine import machine_info, package_versions  # noqa: E402
from sglang_spec_ext.sglang.verify.padded_rows import PaddedRows  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "padded_rows.json"
VOCAB, WIDTH = 49152, 16
CASES = {"c=16": (16, 27), "c=64": (64, 104)}  # batch, verified rows


def step_ms(ring: PaddedRows | None, bs: int, kept: int, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    compact = torch.randn(kept, VOCAB, generator=g)
    keep = torch.randperm(bs * WIDTH, generator=g)[:kept].sort().values
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        if ring is None:
            full = compact.new_zeros((bs * WIDTH, VOCAB))
            full.index_copy_(0, keep, compact)
        else:
            full = ring.scatter(compact, keep, bs * WIDTH)
        torch.argmax(full, dim=-1)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times[2:])[len(times[2:]) // 2]  # median, first two warm-ups dropped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    results = {}
    for name, (bs, kept) in CASES.items():
        fresh = step_ms(None, bs, kept, args.repeats)
        ring = step_ms(PaddedRows(), bs, kept, args.repeats)
        results[name] = {"rows": bs * WIDTH, "kept": kept, "fresh_ms": round(fresh, 2),
                         "ring_ms": round(ring, 2), "ring_vs_fresh": round(ring / fresh, 3)}  # fmt: skip
    args.out.write_text(json.dumps({
        "what": "one verify step's padded-logits scatter plus the host's greedy argmax over "
                "them, median ms, CPU, torch intra-op threads as configured",
        "machine": machine_info(), "versions": package_versions(),
        "parameters": {"vocab": VOCAB, "width": WIDTH, "repeats": args.repeats,
                       "threads": torch.get_num_threads()},
        "results": results,
    }, indent=1) + "\n")  # fmt: skip
    print(f"wrote {args.out}\n")
    print(f"{'case':<6} {'rows':>5} {'kept':>5} {'fresh ms':>9} {'ring ms':>8} {'ring/fresh':>10}")
    for name, r in results.items():
        print(f"{name:<6} {r['rows']:>5} {r['kept']:>5} {r['fresh_ms']:>9.1f} {r['ring_ms']:>8.1f} "
              f"{r['ring_vs_fresh']:>10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
