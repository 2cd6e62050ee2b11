#!/usr/bin/env python
"""SUFFIX global tree: bytes and nodes per token (benchmarks/results/drafter_bytes_per_token.json).

For random and repetitive text: feeds `--tokens` committed tokens through SuffixDrafter the
way the SUFFIX worker does (requests of 1000 tokens: ``start_request``, ``extend_request``,
``finish_request``), with the global bound above the total so nothing is evicted, and reads
the core's own count (``stats()["memory_bytes"]``, ``global_nodes``) and the process RSS
before and after. Two texts: uniform random tokens (the most distinct suffixes) and
stretches of a shared base text with edits (repetitive, as agent traces are).
docs/operations.md quotes it.

    python benchmarks/drafter_bytes_per_token.py            # 10**6 tokens each, ~1 min
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from sglang_spec_ext.machine import machine_info
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.suffix.memory import worst_bytes_per_token

HERE = Path(__file__).resolve().parent
REQUEST_TOKENS = 1000


def _text(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "random":
        return rng.integers(0, 32000, size=n)
    base = rng.integers(0, 32000, size=50_000)
    parts: list[np.ndarray] = []
    total = 0
    while total < n:
        if rng.random() < 0.75:
            s = int(rng.integers(0, len(base) - 64))
            part = base[s : s + int(rng.integers(8, 64))]
        else:
            part = rng.integers(0, 32000, size=8)
        parts.append(part)
        total += len(part)
    return np.concatenate(parts)[:n]


def measure(kind: str, tokens: int, seed: int, backend: str) -> dict:
    """One tree over ``tokens`` tokens of ``kind`` text; sizes per token."""
    text = _text(kind, tokens, np.random.default_rng(seed)).tolist()
    gc.collect()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    drafter = SuffixDrafter(SuffixConfig(max_cached_tokens=2 * tokens), backend=backend)
    for i in tqdm(range(0, tokens, REQUEST_TOKENS), desc=kind, unit="req"):
        rid = f"r{i}"
        drafter.start_request(rid, [])
        drafter.extend_request(rid, text[i : i + REQUEST_TOKENS])
        drafter.finish_request(rid)
    stats = drafter.stats()
    rss1 = proc.memory_info().rss
    cached = max(1, stats["cached_tokens"])
    return {
        "text": kind,
        "backend": drafter.backend,
        "cached_tokens": stats["cached_tokens"],
        "global_nodes": stats["global_nodes"],
        "memory_bytes": stats["memory_bytes"],
        "nodes_per_token": stats["global_nodes"] / cached,
        "bytes_per_token": stats["memory_bytes"] / cached,
        "rss_delta_bytes_per_token": (rss1 - rss0) / cached,
        "assumed_worst_bytes_per_token": worst_bytes_per_token(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="native", choices=("native", "python", "auto"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "drafter_bytes_per_token.json")
    args = ap.parse_args()
    rows = [
        measure(kind, args.tokens, args.seed, args.backend) for kind in ("random", "repetitive")
    ]
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine_info(), "parameters": params, "results": rows}, indent=1)
        + "\n"
    )
    print(f"wrote {args.out}\n")
    print("| text | tokens | nodes/token | bytes/token (core) | RSS delta bytes/token |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['text']} | {r['cached_tokens']} | {r['nodes_per_token']:.2f} | "
            f"{r['bytes_per_token']:.0f} | {r['rss_delta_bytes_per_token']:.0f} |"
        )


if __name__ == "__main__":
    main()
