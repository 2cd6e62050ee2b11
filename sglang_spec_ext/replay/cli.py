"""``sglang-spec-ext simulate``: replay token traces through a drafter offline.

Prints a per-set table (last on stdout), optionally writes a JSON report and an
acceptance table. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sglang_spec_ext.replay.drafters import (
    DRAFTER_NAMES,
    DrafterOptions,
    DrafterUnavailable,
    drafter_factory,
)
from sglang_spec_ext.replay.engine import ReplayResult, replay
from sglang_spec_ext.replay.recycle import RecycleDrafter
from sglang_spec_ext.replay.report import format_table, machine_info, package_versions
from sglang_spec_ext.replay.table import acceptance_table, write_acceptance_table
from sglang_spec_ext.replay.trace import TraceError, read_trace

SHOWN_DEPTHS = 4
#: Drafters that feed on the trace's target_topk.
RECYCLE_DRAFTERS = ("suffix-recycle", "recycle-only")


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return vals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DrafterOptions()
    parser.add_argument("--trace", required=True, type=Path, help="trace file (JSONL)")
    parser.add_argument("--drafter", default="suffix", choices=DRAFTER_NAMES)
    parser.add_argument(
        "--width",
        type=int,
        default=16,
        help="verify width incl. the root (drafts <= width-1 nodes)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="OUT.json", help="write a JSON report"
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--set", action="append", default=None, dest="sets", help="only these sets")
    parser.add_argument("--check", action="store_true", help="validate every draft tree")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--acceptance-table",
        type=Path,
        default=None,
        metavar="OUT.jsonl",
        help="also write a(p,k) table",
    )
    parser.add_argument("--ks", type=_int_list, default=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 63])
    parser.add_argument(
        "--tokenizer", default=None, metavar="PATH",
        help="the served model's tokenizer (a local path): drafts of requests whose trace "
        "record has a constraint are shaped by its grammar, as SUFFIX serving does "
        "(replay/grammar.py)",
    )  # fmt: skip
    g = parser.add_argument_group("suffix / arctic settings")
    g.add_argument("--max-depth", type=int, default=d.max_depth, help="suffix tree depth")
    g.add_argument(
        "--spec-factor", type=float, default=d.spec_factor, help="budget per matched token"
    )
    g.add_argument("--spec-offset", type=float, default=d.spec_offset, help="budget offset")
    g.add_argument("--min-token-prob", type=float, default=d.min_token_prob)
    g.add_argument(
        "--max-cached-requests", type=int, default=d.max_cached_requests, help="-1: no limit"
    )
    g.add_argument("--chain", action="store_true", help="chain drafts instead of trees")
    g.add_argument(
        "--suffix-backend", choices=("auto", "native", "python"), default=d.suffix_backend,
        help="suffix core: compiled or the pure-Python reference",
    )  # fmt: skip
    g.add_argument(
        "--suffix-opt", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
        help="any other SuffixConfig field (JSON value)",
    )  # fmt: skip
    g = parser.add_argument_group(
        "suffix-recycle / recycle-only settings (the trace's target_topk, replay/recycle.py)"
    )
    g.add_argument("--recycle-k", type=int, default=d.recycle_k, help="successors per token")
    g.add_argument(
        "--recycle-min-prob", type=float, default=d.recycle_min_prob,
        help="recycled nodes below this estimated acceptance are not drafted "
        "(default: --min-token-prob, as the server)",
    )  # fmt: skip
    g.add_argument("--recycle-max-depth", type=int, default=d.recycle_max_depth)
    g = parser.add_argument_group("prompt-lookup settings")
    g.add_argument("--max-ngram", type=int, default=d.max_ngram)
    g.add_argument("--min-ngram", type=int, default=d.min_ngram)
    g = parser.add_argument_group("host NGRAM settings (sglang defaults)")
    g.add_argument("--ngram-max-trie-depth", type=int, default=d.ngram_max_trie_depth)
    g.add_argument("--ngram-min-bfs-breadth", type=int, default=d.ngram_min_bfs_breadth)
    g.add_argument("--ngram-max-bfs-breadth", type=int, default=d.ngram_max_bfs_breadth)
    g.add_argument("--ngram-match-type", choices=("BFS", "PROB"), default=d.ngram_match_type)


def options_from_args(args: argparse.Namespace) -> DrafterOptions:
    return DrafterOptions(
        width=args.width,
        max_depth=args.max_depth,
        spec_factor=args.spec_factor,
        spec_offset=args.spec_offset,
        min_token_prob=args.min_token_prob,
        max_cached_requests=args.max_cached_requests,
        use_tree=not args.chain,
        suffix_backend=args.suffix_backend,
        recycle_k=args.recycle_k,
        recycle_min_prob=args.recycle_min_prob,
        recycle_max_depth=args.recycle_max_depth,
        max_ngram=args.max_ngram,
        min_ngram=args.min_ngram,
        ngram_max_trie_depth=args.ngram_max_trie_depth,
        ngram_min_bfs_breadth=args.ngram_min_bfs_breadth,
        ngram_max_bfs_breadth=args.ngram_max_bfs_breadth,
        ngram_match_type=args.ngram_match_type,
        extra=dict(args.suffix_opt),
    )


def _progress(enabled: bool, desc: str, total: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, total=total, unit="req", file=sys.stderr, leave=False)


def result_table(result: ReplayResult) -> str:
    headers = ["set", "reqs", "steps", "tokens", "accept_len", "drafted/step", "us/token"]
    headers += [f"acc@d{d}" for d in range(1, SHOWN_DEPTHS + 1)]
    rows = []
    entries = sorted(result.by_set.items()) + [("overall", result.overall)]
    for name, stats in entries:
        s = stats.summary()
        rates = (s["accept_rate_by_depth"] + [None] * SHOWN_DEPTHS)[:SHOWN_DEPTHS]
        rows.append(
            [name, s["requests"], s["steps"], s["output_tokens"], s["accept_len"]]
            + [s["drafted_per_step"], s["us_per_token"], *rates]
        )
    return format_table(headers, rows)


def build_report(
    result: ReplayResult, args: argparse.Namespace, opts: DrafterOptions, wall_s: float
) -> dict:
    return {
        "tool": "sglang-spec-ext simulate",
        "trace": str(args.trace),
        "drafter": args.drafter,
        "grammar_tokenizer": args.tokenizer,
        "width": args.width,
        "parameters": opts.as_dict(),
        "overall": result.overall.summary(),
        "sets": {name: st.summary() for name, st in sorted(result.by_set.items())},
        "wall_s": wall_s,
        "machine": machine_info(),
        "versions": package_versions(),
    }


def _grammar_factory(factory: Any, tokenizer: str) -> Any:
    from sglang_spec_ext.replay.grammar import GrammarShaped

    return lambda: GrammarShaped(factory(), tokenizer)


def run(args: argparse.Namespace) -> int:
    if args.width < 1:
        print("error: --width must be at least 1", file=sys.stderr)
        return 2
    try:
        records = read_trace(args.trace, limit=args.limit)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.sets:
        records = [r for r in records if r.set in set(args.sets)]
        if not records:
            print(f"error: no requests in sets {args.sets}", file=sys.stderr)
            return 2
    opts = options_from_args(args)
    factory = drafter_factory(args.drafter, opts)
    constrained = sum(1 for r in records if r.constraint)
    if args.tokenizer:
        factory = _grammar_factory(factory, args.tokenizer)
    elif constrained:
        print(f"note: {constrained} requests have a constraint; pass --tokenizer PATH to replay "
              "grammar-aware drafts (replaying plain drafts)", file=sys.stderr)  # fmt: skip
    if args.drafter in RECYCLE_DRAFTERS and not any(r.target_topk for r in records):
        print(f"note: no request has target_topk; {args.drafter} drafts nothing recycled "
              "(benchmarks/make_topk_traces.py adds it to a trace)", file=sys.stderr)  # fmt: skip
    show = not args.no_progress
    t0 = time.perf_counter()
    try:
        drafter = factory()
        result = replay(
            records, drafter, args.width, check=args.check,
            progress=_progress(show, f"replay {args.drafter} W={args.width}", len(records)),
        )  # fmt: skip
    except (DrafterUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, DrafterUnavailable) else 2
    wall = time.perf_counter() - t0
    if args.acceptance_table is not None:
        rows = acceptance_table(
            records, factory, args.ks, progress=_progress(show, "acceptance table", len(records))
        )
        write_acceptance_table(args.acceptance_table, rows)
        print(f"wrote {args.acceptance_table} ({len(rows)} requests)", file=sys.stderr)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = build_report(result, args, opts, wall)
        shaped = getattr(drafter, "stats", None)  # grammar-aware drafts (replay/grammar.py)
        if args.tokenizer and shaped is not None:
            report["grammar_drafts"] = shaped.as_dict()
        recycled = getattr(drafter, "inner", drafter)
        if isinstance(recycled, RecycleDrafter):
            report["recycle"] = recycled.stats()
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    print(f"drafter={args.drafter} width={args.width} trace={args.trace} requests={len(records)}")
    print(result_table(result))
    return 0
