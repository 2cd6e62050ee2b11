#!/usr/bin/env python
"""Token recycling by exact offline replay (benchmarks/results/recycle_replay.json and .png).

Replays every set of ``benchmarks/traces/recycle/`` (traces with the target's top-k,
written by ``benchmarks/make_topk_traces.py``) through three drafters at verify widths 8
and 16 (drafts of at most width - 1 nodes):

* ``suffix``: SUFFIX with its current defaults;
* ``suffix-recycle``: the same suffix draft merged with the target's recycled top-k, fed
  and drafted exactly as the serving worker does (``sglang_spec_ext.replay.recycle``);
* ``recycle-only``: the recycled top-k alone (the suffix draft empty).

Each set runs through a fresh drafter (one server per set; the table, the rank rates and
the suffix trees carry across its requests). The first-time chat sets are reported apart:
``first-time-tuning`` may be used to choose settings, ``first-time-held-out`` never is
(``sglang_spec_ext.bench.first_time_chat``). Under greedy decoding the outputs do not
depend on the drafts, so accept lengths are exact for this drafting (rows of the committed
positions fed, as the worker feeds them; the draft gate's trimming is not replayed).

Prints the table last (set, width, drafter, accept length = tokens committed per verify
step, bonus included, and its ratio to ``suffix``), writes the JSON (figures, the
recycler's learned rank rates, parameters, machine, versions) and a plot next to it.

    python benchmarks/recycle_replay.py
    python benchmarks/recycle_replay.py --sets first-time-tuning --widths 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from sglang_spec_ext.machine import machine_info, package_versions
from sglang_spec_ext.replay import DrafterOptions, make_drafter, read_trace, replay
from sglang_spec_ext.replay.drafters import recycle_config
from sglang_spec_ext.replay.report import format_table

HERE = Path(__file__).resolve().parent
DRAFTERS = ("suffix", "suffix-recycle", "recycle-only")
SET_ORDER = (
    "first-time-tuning",
    "first-time-held-out",
    "chat",
    "prose",
    "code-edit",
    "agentic",
    "repeat",
)


def trace_sets(traces_dir: Path, wanted: list[str] | None) -> list[str]:
    """The sets to replay: ``wanted``, else every ``*.jsonl`` there (known sets first)."""
    present = sorted(p.stem for p in traces_dir.glob("*.jsonl"))
    if wanted:
        missing = [s for s in wanted if s not in present]
        if missing:
            raise SystemExit(
                f"no traces for {missing} in {traces_dir}; run benchmarks/make_topk_traces.py"
            )
        return wanted
    known = [s for s in SET_ORDER if s in present]
    return known + [s for s in present if s not in known]


def run(args: argparse.Namespace) -> dict:
    """results[set][width][drafter] = the replay summary (+ the recycler's figures)."""
    from tqdm import tqdm

    records = {s: read_trace(args.traces_dir / f"{s}.jsonl") for s in args.sets}
    results: dict[str, dict] = {}
    jobs = [(s, w, d) for s in args.sets for w in args.widths for d in args.drafters]
    for s, w, d in tqdm(jobs, desc="replay", unit="run", file=sys.stderr, disable=args.quiet):
        drafter = make_drafter(d, DrafterOptions(width=w))
        t0 = time.perf_counter()
        res = replay(records[s], drafter, w)
        summary = res.overall.summary()
        summary["wall_s"] = round(time.perf_counter() - t0, 2)
        stats = getattr(drafter, "stats", None)
        if d != "suffix" and callable(stats):
            summary["recycle"] = stats()
        results.setdefault(s, {}).setdefault(str(w), {})[d] = summary
    return results


def rows(results: dict, drafters: list[str]) -> list[list[object]]:
    out = []
    for s, by_width in results.items():
        for w, by_drafter in by_width.items():
            base = by_drafter.get("suffix", {}).get("accept_len")
            for d in drafters:
                r = by_drafter[d]
                ratio = round(r["accept_len"] / base, 3) if base else None
                recycled = r.get("recycle", {})
                nodes = recycled.get("recycle_nodes_drafted") or 0
                share = recycled.get("recycle_recycled_nodes_drafted", 0) / nodes if nodes else 0.0
                out.append([s, int(w), d, round(r["accept_len"], 3), ratio,
                            round(r["drafted_per_step"], 2), f"{share:.0%}"])  # fmt: skip
    return out


def table(results: dict, drafters: list[str]) -> str:
    headers = ["set", "width", "drafter", "accept_len", "vs suffix", "drafted/step", "recycled"]
    return format_table(headers, rows(results, drafters))


def _plot(results: dict, drafters: list[str], widths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results)
    fig, axes = plt.subplots(1, len(widths), figsize=(1.4 * len(sets) + 3, 4.2), squeeze=False)
    bar_w = 0.8 / max(len(drafters), 1)
    for ax, w in zip(axes[0], widths, strict=True):
        for j, d in enumerate(drafters):
            vals = [results[s][str(w)][d]["accept_len"] for s in sets]
            xs = [i + (j - (len(drafters) - 1) / 2) * bar_w for i in range(len(sets))]
            ax.bar(xs, vals, width=bar_w, label=d)
        ax.set_xticks(range(len(sets)), sets, rotation=30, ha="right", fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"verify width {w}")
        ax.set_ylabel("accept length (tokens/step, bonus incl.)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Token recycling by exact replay: SmolLM2-135M greedy traces with top-8")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces-dir", type=Path, default=HERE / "traces" / "recycle")
    ap.add_argument("--sets", nargs="+", default=None, help="default: every set there")
    ap.add_argument("--widths", nargs="+", type=int, default=[8, 16])
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=list(DRAFTERS))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "recycle_replay.json")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if min(args.widths) < 2:
        ap.error("--widths must be at least 2 (the root and one draft node)")
    args.sets = trace_sets(args.traces_dir, args.sets)

    t0 = time.time()
    results = run(args)
    wall = time.time() - t0
    manifest = args.traces_dir / "manifest.json"
    opts = DrafterOptions()
    report = {
        "tool": "benchmarks/recycle_replay.py",
        "command": " ".join(
            ["python", "benchmarks/recycle_replay.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "parameters": {
            "widths": args.widths,
            "sets": args.sets,
            "drafters": args.drafters,
            "suffix_options": {k: v for k, v in opts.as_dict().items() if k != "width"},
            "recycle": {**dataclasses.asdict(recycle_config(opts)), "scope": ""},
        },
        "traces": json.loads(manifest.read_text()) if manifest.exists() else None,
        "results": results,
        "notes": "accept_len: tokens committed per verify step, bonus included (replay.engine's "
        "definition); drafts hold at most width - 1 nodes. One fresh drafter per set and "
        "width. first-time-held-out is never used to choose settings. Rows fed: the root's "
        "and the accepted drafts' of each step, as the worker feeds them; the draft gate's "
        "trimming is not replayed.",
        "wall_s": round(wall, 1),
        "machine": machine_info(),
        "versions": package_versions(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    if not args.no_plot:
        png = args.out.with_suffix(".png")
        _plot(results, args.drafters, args.widths, png)
        print(f"wrote {png}", file=sys.stderr)
    print(f"# replay {wall:.0f} s; accept_len = tokens per verify step (bonus incl.)")
    print(table(results, args.drafters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
