"""Grammar-aware drafts replayed offline (benchmarks/results/grammar_replay.json).

The trace ``benchmarks/traces/structured_smollm2.jsonl`` holds plain constrained serving's
greedy outputs for the structured workload (SmolLM2-135M-Instruct, CPU engine, xgrammar;
written by ``benchmarks/grammar_smollm2.py --trace``: concurrency 1 then 8, each request
with its constraint). Replayed in file order through the suffix drafter and the host's
NGRAM corpus (``replay/drafters.py``), at width 16, with and without grammar shaping
(``replay/grammar.py``, as ``simulate --tokenizer`` does). Accept lengths are exact for
each drafting (greedy output does not depend on the drafts) but are not serving's: the
serving draft gate, which trims drafts to what pays for its verify cost, is not replayed
(served figures: grammar_smollm2.json).

    .venv/bin/python benchmarks/grammar_replay.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.replay.drafters import make_drafter  # noqa: E402
from sglang_spec_ext.replay.engine import replay  # noqa: E402
from sglang_spec_ext.replay.grammar import GrammarShaped  # noqa: E402
from sglang_spec_ext.replay.trace import read_trace  # noqa: E402

TRACE = REPO / "benchmarks" / "traces" / "structured_smollm2.jsonl"
WIDTH = 16


def constrained_accept(result, level: str) -> float | None:
    """Output tokens per decode step over the constrained requests of one level (the
    served benchmark's figure: its sets are ``<kind> c=<level>``)."""
    tokens = steps = 0
    for name, stats in result.by_set.items():
        kind, _, c = name.partition(" c=")
        if c == level and kind != "chat":
            tokens += stats.decode_tokens
            steps += stats.steps
    return tokens / steps if steps else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/grammar_replay.json"))
    args = ap.parse_args(argv)
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    tokenizer = str(ensure_smollm2_dir())
    records = read_trace(args.trace)
    levels = sorted({r.set.partition(" c=")[2] for r in records}, key=int)
    runs = [(d, g) for d in ("suffix", "ngram") for g in (False, True)]
    results = {}
    for drafter, grammar in tqdm(runs, desc="replays", file=sys.stderr):
        inner = make_drafter(drafter)
        shaped = GrammarShaped(inner, tokenizer) if grammar else None
        res = replay(records, shaped or inner, WIDTH)
        name = f"{drafter}{' + grammar' if grammar else ''}"
        results[name] = {
            "constrained_accept_length": {c: round(constrained_accept(res, c), 3) for c in levels},
            "overall": res.overall.summary()["accept_len"],
            "grammar_drafts": shaped.stats.as_dict() if shaped else None,
        }
    report = {
        "what": "offline replay of plain constrained serving's greedy outputs (SmolLM2-135M, "
        "structured workload) at width 16, with and without grammar shaping; exact accept "
        "lengths for the drafting; the serving draft gate is not replayed",
        "trace": str(args.trace.relative_to(REPO))
        if args.trace.is_relative_to(REPO)
        else str(args.trace),
        "machine": machine_info(),
        "parameters": {"width": WIDTH, "levels": levels, "requests": len(records)},
        "results": results,
    }
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"accept length over the constrained requests (replayed; width {WIDTH})")
    print(f"  {'drafter':<18}" + "".join(f"{'c=' + c:>9}" for c in levels))
    for name, r in results.items():
        cells = "".join(f"{r['constrained_accept_length'][c]:>9.2f}" for c in levels)
        print(f"  {name:<18}{cells}")
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
