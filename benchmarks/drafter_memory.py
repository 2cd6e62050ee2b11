#!/usr/bin/env python
"""Long-run memory of the SUFFIX drafter (benchmarks/results/drafter_memory.json and .png).

Flat once the global bound is reached. Drives SuffixDrafter the way the SUFFIX worker does,
for `--tokens` committed tokens: `--live` requests at a time, each ``start_request`` with a
prompt, ``extend_request`` with 1-3 tokens per decode step, one ``speculate_batch`` per
step, ``finish_request`` at the end, new requests replacing finished ones. Token streams
repeat stretches of a shared base text with edits (agentic-like: the suffix trees see both
repeats and new text). Sampled over the run: global tree tokens, ``stats()["memory_bytes"]``
and the process RSS.

    python benchmarks/drafter_memory.py                    # 10**6 tokens, ~1 min
    python benchmarks/drafter_memory.py --tokens 3000000 --bound 200000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from sglang_spec_ext.machine import machine_info
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter

HERE = Path(__file__).resolve().parent


def _stream(rng: np.random.Generator, base: np.ndarray, n: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        if rng.random() < 0.75:
            s = int(rng.integers(0, len(base) - 64))
            out += base[s : s + int(rng.integers(8, 64))].tolist()
        else:
            out += rng.integers(0, 32000, size=8).tolist()
    return out[:n]


def drive(
    tokens: int,
    bound: int,
    live: int = 32,
    samples: int = 100,
    seed: int = 0,
    backend: str = "auto",
    progress: bool = False,
) -> dict:
    """Run the workload; returns the config and samples (tokens, cached, memory, rss)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 32000, size=50000)
    cfg = SuffixConfig(max_cached_tokens=bound)
    d = SuffixDrafter(cfg, backend=backend)
    proc = psutil.Process()
    reqs: dict[str, list[int]] = {}
    n_req = done = 0
    every = max(1, tokens // samples)
    next_sample = 0
    rows = []
    bar = tqdm(total=tokens, unit="tok", disable=not progress)
    while done < tokens:
        while len(reqs) < live:
            rid = f"r{n_req}"
            n_req += 1
            d.start_request(rid, _stream(rng, base, int(rng.integers(100, 2000))))
            reqs[rid] = _stream(rng, base, int(rng.integers(50, 1000)))
        d.speculate_batch(list(reqs), 15)
        for rid in list(reqs):
            out = reqs[rid]
            k = int(rng.integers(1, 4))
            d.extend_request(rid, out[:k])
            done += min(k, len(out))
            bar.update(min(k, len(out)))
            reqs[rid] = out[k:]
            if not reqs[rid]:
                d.finish_request(rid)
                del reqs[rid]
        if done >= next_sample:
            s = d.stats()
            rows.append(
                {
                    "tokens": done,
                    "cached_tokens": s["cached_tokens"],
                    "pinned_tokens": s["pinned_tokens"],
                    "global_nodes": s["global_nodes"],
                    "memory_bytes": s["memory_bytes"],
                    "rss_bytes": proc.memory_info().rss,
                }
            )
            next_sample += every
    bar.close()
    return {"config": cfg.as_dict(), "backend": d.backend, "requests": n_req, "samples": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1_000_000, help="committed tokens in all")
    ap.add_argument("--bound", type=int, default=200_000, help="max_cached_tokens")
    ap.add_argument("--live", type=int, default=32, help="concurrent requests")
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="native", choices=("native", "python", "auto"))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "drafter_memory.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = drive(args.tokens, args.bound, args.live, args.samples, args.seed, args.backend, True)
    wall = time.perf_counter() - t0
    rows = res["samples"]
    full = [r for r in rows if r["cached_tokens"] >= 0.9 * args.bound]
    half = full[len(full) // 2 :] if full else rows
    summary = {
        "max_cached_tokens_seen": max(r["cached_tokens"] for r in rows),
        "memory_bytes_at_bound_first": full[0]["memory_bytes"] if full else None,
        "memory_bytes_max": max(r["memory_bytes"] for r in rows),
        "memory_bytes_per_cached_token": (
            half[-1]["memory_bytes"] / max(1, half[-1]["cached_tokens"] + 1)
        ),
        "rss_bytes_at_bound_first": full[0]["rss_bytes"] if full else None,
        "rss_bytes_last": rows[-1]["rss_bytes"],
        "rss_bytes_max": max(r["rss_bytes"] for r in rows),
        "wall_s": wall,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.write_text(
        json.dumps(
            {"machine": machine_info(), "parameters": params, "summary": summary, **res}, indent=1
        )
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        x = [r["tokens"] / 1e6 for r in rows]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(x, [r["memory_bytes"] / 2**20 for r in rows], label="stats() memory_bytes")
        ax.plot(x, [r["rss_bytes"] / 2**20 for r in rows], label="process RSS")
        ax.plot(x, [r["cached_tokens"] * 100 / 2**20 for r in rows], label="global tokens x 100 B")
        ax.set_xlabel("committed tokens (millions)")
        ax.set_ylabel("MiB")
        ax.set_title(f"SUFFIX drafter memory, max_cached_tokens={args.bound}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out.with_suffix(".png"), dpi=100)
    except ImportError:
        pass
    print(f"wrote {args.out}")
    mib = 1 << 20
    print(f"\n{args.tokens} tokens, {res['requests']} requests, bound {args.bound} tokens")
    print(f"{'tokens':>10}{'global tokens':>15}{'pinned':>8}{'memory MiB':>12}{'RSS MiB':>10}")
    for r in rows[:: max(1, len(rows) // 10)] + [rows[-1]]:
        print(
            f"{r['tokens']:>10}{r['cached_tokens']:>15}{r['pinned_tokens']:>8}"
            f"{r['memory_bytes'] / mib:>12.1f}{r['rss_bytes'] / mib:>10.1f}"
        )


if __name__ == "__main__":
    main()
