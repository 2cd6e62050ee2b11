#!/usr/bin/env python
"""HYBRID by exact offline replay (benchmarks/results/hybrid_replay[_mtp].json and .png).

Suffix draft or model draft, per request and step. Reads the traces with recorded
model-draft proposals (``benchmarks/traces/hybrid/``, written by
``benchmarks/model_drafts.py``) and replays every set (chat, code-edit, agentic, and
``mixed``: chat and code-edit requests alternating) at model draft length K in ``--ks``
(verify width K + 1, the host's width for a top-1 chain; the suffix draft gets the same K
nodes) under each policy of ``sglang_spec_ext.hybrid.choice``:

* ``suffix``: SUFFIX alone; ``model``: the draft model alone;
* ``arctic``: ArcticInference's rule (the suffix draft when its score >= K);
* ``match``: Baseten's rule (the suffix draft when its match is >= 4 tokens);
* ``learned``: HYBRID (expected accepted tokens of each source, learned online);
* ``oracle``: per step the source the target accepts more of, known only in
  hindsight (an upper bound, not a policy a server can run).

Each set runs with a fresh suffix drafter and a fresh HYBRID state (learning starts
from the priors); "overall" adds up chat, code-edit and agentic. Prints the table
last, writes ``benchmarks/results/hybrid_replay.json`` (figures, learned gain tables,
parameters, machine, versions) and a plot next to it.

    python benchmarks/hybrid_replay.py
    python benchmarks/hybrid_replay.py --ks 5 --sets chat
    python benchmarks/hybrid_replay.py --draft smollm2-mtp --ks 1 3 5 \
        --out benchmarks/results/hybrid_replay_mtp.json    # the MTP layer as model draft
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sglang_spec_ext.hybrid.choice import GainEstimator
from sglang_spec_ext.machine import machine_info, package_versions
from sglang_spec_ext.replay import DrafterOptions, read_trace
from sglang_spec_ext.replay.hybrid import ORACLE, HybridStats, interleave, replay_hybrid
from sglang_spec_ext.replay.report import format_table

HERE = Path(__file__).resolve().parent
SETS = ("chat", "code-edit", "agentic")
WEAK_DRAFT = "smollm2-l14+8"  # benchmarks/model_drafts.py's default draft
MIXED = ("chat", "code-edit")  # interleaved into the "mixed" workload
POLICIES = ("suffix", "model", "arctic", "match", "learned", ORACLE)
BASELINES = ("suffix", "model", "arctic", "match")
LABELS = {
    "suffix": "SUFFIX",
    "model": "model",
    "arctic": "arctic rule",
    "match": "match rule",
    "learned": "HYBRID",
    ORACLE: "oracle",
}


def run(args: argparse.Namespace) -> dict:
    """results[K][set][policy] = summary (learned/oracle: plus the state and gain table)."""
    from tqdm import tqdm

    records = {s: read_trace(args.traces_dir / f"{s}.jsonl") for s in args.sets}
    workloads = dict(records)
    if all(s in records for s in MIXED):
        workloads["mixed"] = interleave(*(records[s] for s in MIXED))
    results: dict[str, dict] = {}
    jobs = [(k, w, p) for k in args.ks for w in workloads for p in args.policies]
    overall: dict[tuple[int, str], HybridStats] = {}
    for k, w, p in tqdm(jobs, desc="replay", unit="run", file=sys.stderr, disable=args.quiet):
        opts = DrafterOptions(width=k + 1)
        res = replay_hybrid(workloads[w], p, steps=k, suffix_options=opts, draft_name=args.draft)
        summary = res.overall.summary()
        if p in ("learned", ORACLE):
            summary["state"] = res.state
        if p == "learned":
            summary["gain_table"] = res.estimator
            # the server's default: no model draft where the suffix draft wins before it
            skip = replay_hybrid(workloads[w], p, steps=k, suffix_options=opts,
                                 draft_name=args.draft, skip_model=True)  # fmt: skip
            summary["skip_model"] = skip.overall.summary()
            if w in records:
                overall.setdefault((k, "learned+skip"), HybridStats()).merge(skip.overall)
        results.setdefault(str(k), {}).setdefault(w, {})[p] = summary
        if w in records:
            overall.setdefault((k, p), HybridStats()).merge(res.overall)
        args.draft = res.draft_name
    for (k, p), stats in overall.items():
        if p != "learned+skip":
            results[str(k)].setdefault("overall", {})[p] = stats.summary()
    for (k, p), stats in overall.items():
        if p == "learned+skip":
            results[str(k)]["overall"]["learned"]["skip_model"] = stats.summary()
    return results


def skip_table(results: dict) -> str:
    """HYBRID with and without skipping the model draft where the suffix draft wins
    before it: accept length and the share of steps with no model draft (batch 1)."""
    rows = []
    for k, by_set in results.items():
        for s, r in by_set.items():
            if "learned" in r and "skip_model" in r["learned"]:
                sk = r["learned"]["skip_model"]
                rows.append([s, int(k), round(r["learned"]["accept_len"], 3),
                             round(sk["accept_len"], 3), f"{sk['model_skipped_share']:.1%}"])  # fmt: skip
    headers = ["set", "K", "HYBRID", "HYBRID, model skipped", "steps with no model draft"]
    return format_table(headers, rows)


def bars(results: dict) -> dict:
    """Per K and workload: HYBRID against the best single source and the fixed rules."""
    out: dict = {}
    for k, by_set in results.items():
        for w, r in by_set.items():
            if "learned" not in r:
                continue
            al = {p: v["accept_len"] for p, v in r.items()}
            singles = [al[p] for p in ("suffix", "model") if p in al]
            others = [al[p] for p in BASELINES if p in al]
            row = {
                "hybrid": al["learned"],
                "best_single": max(singles) if singles else None,
                "best_other": max(others) if others else None,
                "hybrid_over_best_other": al["learned"] / max(others) if others else None,
                "bar_ge_best_single": al["learned"] >= max(singles) if singles else None,
                "bar_ge_arctic": al["learned"] >= al["arctic"] if "arctic" in al else None,
            }
            if ORACLE in al:
                row["oracle"] = al[ORACLE]
            out.setdefault(k, {})[w] = row
    return out


def _plot(results: dict, policies: list[str], path: Path, draft: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(results)
    fig, axes = plt.subplots(1, len(ks), figsize=(6.5 * len(ks), 4.2), squeeze=False)
    bar_w = 0.8 / max(len(policies), 1)
    for ax, k in zip(axes[0], ks, strict=True):
        sets = list(results[k])
        for j, p in enumerate(policies):
            vals = [results[k][s][p]["accept_len"] for s in sets]
            xs = [i + (j - (len(policies) - 1) / 2) * bar_w for i in range(len(sets))]
            hatch = "//" if p == ORACLE else None
            ax.bar(xs, vals, width=bar_w, label=LABELS[p], hatch=hatch)
        ax.set_xticks(range(len(sets)), sets)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"K = {k} (verify width {int(k) + 1})")
        ax.set_ylabel("accept length (tokens/step, bonus incl.)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"HYBRID by exact replay: SmolLM2-135M greedy traces, draft {draft}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: dict, policies: list[str]) -> str:
    headers = ["set", "K", *(LABELS[p] for p in policies if p != ORACLE)]
    headers += ["HYBRID/best other", "HYBRID steps suffix/model"]
    if ORACLE in policies:
        headers.append("oracle")
    rows = []
    sets = list(next(iter(results.values())))
    for s in sets:
        for k in results:
            r = results[k][s]
            row: list[object] = [s, int(k)]
            row += [round(r[p]["accept_len"], 3) for p in policies if p != ORACLE]
            others = [r[p]["accept_len"] for p in BASELINES if p in r]
            if "learned" in r and others:
                row.append(round(r["learned"]["accept_len"] / max(others), 3))
                by = r["learned"]["by_source"]
                row.append(f"{by['suffix']['step_share']:.2f}/{by['model']['step_share']:.2f}")
            else:
                row += [None, None]
            if ORACLE in policies:
                row.append(round(r[ORACLE]["accept_len"], 3))
            rows.append(row)
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces-dir", type=Path, default=HERE / "traces" / "hybrid")
    ap.add_argument("--sets", nargs="+", default=list(SETS))
    ap.add_argument("--ks", nargs="+", type=int, default=[3, 5])
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument(
        "--draft",
        default=WEAK_DRAFT,
        help=f"model draft recorded in the traces (default {WEAK_DRAFT}, the weak "
        "truncated draft; smollm2-mtp: the trained MTP layer's chains)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results" / "hybrid_replay.json")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    missing = [s for s in args.sets if not (args.traces_dir / f"{s}.jsonl").exists()]
    if missing:
        print(
            f"no traces for {missing} in {args.traces_dir}; run benchmarks/model_drafts.py",
            file=sys.stderr,
        )
        return 2
    t0 = time.time()
    results = run(args)
    wall = time.time() - t0
    manifest = args.traces_dir / "manifest.json"
    est = GainEstimator()
    report = {
        "tool": "benchmarks/hybrid_replay.py",
        "command": " ".join(["python", "benchmarks/hybrid_replay.py", *(argv or sys.argv[1:])]),
        "parameters": {
            "ks": args.ks,
            "widths": [k + 1 for k in args.ks],
            "sets": args.sets,
            "mixed": list(MIXED),
            "policies": args.policies,
            "draft": args.draft,
            "suffix_options": {
                k: v for k, v in DrafterOptions().as_dict().items() if k != "width"
            },  # fmt: skip
            "gain_estimator": {
                "edges": list(est.edges),
                "prior_weight": est.prior_weight,
                "prior_scale": est.prior_scale,
                "memory": est.memory,
            },
        },
        "traces": json.loads(manifest.read_text()) if manifest.exists() else None,
        "results": results,
        "bars": bars(results),
        "notes": "accept_len: tokens committed per verify step, bonus included (replay.engine's "
        "definition). Both drafts hold at most K nodes (verify width K + 1). Each set: fresh "
        "suffix drafter and HYBRID state; 'overall' sums chat, code-edit and agentic. "
        "'oracle' picks per step the source the target accepts more of, in hindsight: an "
        "upper bound, not a runnable policy. gain_table: the learned (source, raw score "
        "bucket) -> accepted draft tokens map at the end of each learned run.",
        "wall_s": round(wall, 1),
        "machine": machine_info(),
        "versions": package_versions(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    if not args.no_plot:
        png = args.out.with_suffix(".png")
        _plot(results, args.policies, png, args.draft)
        print(f"wrote {png}", file=sys.stderr)
    misses = [
        f"K={k} {w}"
        for k, by in report["bars"].items()
        for w, row in by.items()
        if row["bar_ge_best_single"] is False or row["bar_ge_arctic"] is False
    ]
    print(f"# draft {args.draft}; replay {wall:.0f} s")
    print(
        f"# bar (HYBRID >= best of SUFFIX/model and >= arctic): {'missed on ' + ', '.join(misses) if misses else 'met everywhere'}"
    )  # noqa: E501
    if "learned" in args.policies:
        print(skip_table(results))
    print(table(results, args.policies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
