#!/usr/bin/env python
"""How often a served top-k table predicts the target's next token, by key
(benchmarks/results/recycle_context_probe.json).

Token recycling drafts the next token after ``x`` from the target's top-k at the last
position whose token was ``x``. A server cannot have the row of the position it drafts
from: under greedy decoding the request's last token (the previous verify's bonus token)
is never a node of the previous tree (a drafted node equal to it would have been
accepted), so its row is computed by the very verify being drafted for. This probe
measures, on the committed top-k traces (``benchmarks/traces/recycle/``, written by
``benchmarks/make_topk_traces.py``; each set one table carried across its requests, as
one server), how often the target's next token is the table's top successor, and how
often it is among its ``k``, where the table is keyed

* ``token``: by the last token (what the worker keeps, ``suffix/recycling.py``);
* ``bigram`` / ``trigram``: by the last two / three tokens, falling back to the shorter key
  where the longer one was never seen;

each row stored after its position is drafted for (a served feed: no row of the position
itself). It bounds what a recycled first draft level can give; deeper levels multiply.
``first-time-held-out`` was never used to choose anything.

    python benchmarks/recycle_context_probe.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sglang_spec_ext.machine import machine_info, package_versions  # noqa: E402

KEYS = ("token", "bigram", "trigram")


def probe(records: list[dict]) -> dict:
    """Hit rates of the top successor and of the top-k, per key kind, for one set."""
    tables: dict[str, dict] = {k: {} for k in KEYS}
    hits1 = dict.fromkeys(KEYS, 0)
    hitsk = dict.fromkeys(KEYS, 0)
    seen = dict.fromkeys(KEYS, 0)
    n = 0
    for rec in records:
        toks = list(rec["prompt_ids"][-2:]) + list(rec["output_ids"])
        off = len(toks) - len(rec["output_ids"])
        rows = rec["target_topk"]
        for p in range(len(rec["output_ids"]) - 1):
            i = off + p
            keys = {"token": (toks[i],), "bigram": tuple(toks[i - 1 : i + 1]),
                    "trigram": tuple(toks[i - 2 : i + 1])}  # fmt: skip
            nxt = toks[i + 1]
            n += 1
            row = None
            for kind in KEYS:  # the longest key seen, else the shorter ones
                own = tables[kind].get(keys[kind])
                if own is not None:
                    seen[kind] += 1
                row = own or row
                if row is not None:
                    hits1[kind] += int(row[0] == nxt)
                    hitsk[kind] += int(nxt in row)
            for kind in KEYS:  # fed after drafting: the served order
                tables[kind][keys[kind]] = rows[p]
    return {
        "positions": n,
        "top1": {k: round(hits1[k] / n, 4) for k in KEYS},
        "in_topk": {k: round(hitsk[k] / n, 4) for k in KEYS},
        "key_seen_before": {k: round(seen[k] / n, 4) for k in KEYS},
        "table_entries": {k: len(tables[k]) for k in KEYS},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--traces-dir", type=Path, default=HERE / "traces" / "recycle")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "recycle_context_probe.json")
    args = ap.parse_args(argv)
    sets = sorted(p.stem for p in args.traces_dir.glob("*.jsonl"))
    t0 = time.perf_counter()
    results = {}
    for name in sets:
        with open(args.traces_dir / f"{name}.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
        results[name] = probe(records)
    record = {
        "tool": "benchmarks/recycle_context_probe.py",
        "what": "hit rate of the target's next token against a served top-k table, by key",
        "parameters": {
            "traces_dir": str(args.traces_dir.relative_to(HERE.parent)),
            "k": len(records[0]["target_topk"][0]) if sets else None,
        },  # fmt: skip
        "results": results,
        "wall_s": round(time.perf_counter() - t0, 2),
        "machine": machine_info(),
        "versions": package_versions(),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    head = f"{'set':22s} {'positions':>9s}  " + "  ".join(
        f"top1 {k:7s}" for k in KEYS
    ) + "  " + "  ".join(f"top-k {k:7s}" for k in KEYS)  # fmt: skip
    print(head)
    for name, r in results.items():
        print(f"{name:22s} {r['positions']:9d}  "
              + "  ".join(f"{r['top1'][k]:12.3f}" for k in KEYS) + "  "
              + "  ".join(f"{r['in_topk'][k]:13.3f}" for k in KEYS))  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
