"""Adaptive draft-width controller, replay benchmark (benchmarks/results/adaptive_replay*.json).

Drives ``sglang_spec_ext.adaptive.AdaptiveController`` with acceptance tables (JSONL,
``{"set", "ks", "accepted"}`` per request) at batch sizes 1..256 and compares it with
every fixed ``k``, plain decoding (``k = 0``) and the host's own EMA policy
(``sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams``, run through
its real Python API; its chosen step count maps to ``k = steps``, a chain).

Step times come from the ANALYTIC step-cost model (``sglang_spec_ext.adaptive.prior``,
default constants: Llama-3-8B bf16 on one H100 SXM). Nothing is measured on a GPU:
the figures are a projection, labelled as such in the output. The simulation charges
the analytic time (the "truth"); the controller's own cost model starts from a
deliberately different prior (``CONTROLLER_PRIOR``) and calibrates online from the
charged times times log-normal noise with 1 % outliers (x3).

Model drafts (``--model-drafts``): chain drafts of a model, k = number of draft
steps. STANDALONE-shaped acceptance comes from the real proposals of a weak SmolLM2
draft stored in ``benchmarks/traces/hybrid/`` (``replay.table.model_draft_table``),
charged as a Llama-3.2-1B draft of the 8B target; EAGLE-shaped acceptance is
synthetic (``adaptive.synthetic`` profile ``eagle-chain``), charged as an EAGLE-3
head. Each draft forward costs its weights and KV once (``adaptive.prior``); at zero
steps the host runs the draft extend (``--zero-step warm``, its default) unless
``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` skips it (``--zero-step skip``; the replay
keeps the trace's acceptance after an upshift, so it leaves out the cold recovery that
costs on a server) or our draft-KV repair skips it and rebuilds the skipped draft KV at
the first drafting step (``--zero-step repair``: that step is charged one prefill-shaped
draft forward over every token committed at zero steps since, uncapped). "plain" is a
server without speculation (no draft model at all).

MTP drafts (``--mtp-drafts [NAME]``, default ``smollm2-mtp``): MTP-shaped acceptance
(NEXTN: the target's own multi-token-prediction layer drafts a chain) from the recorded
proposals ``model_drafts[NAME]`` of every trace in ``--trace-dir`` (default
``benchmarks/traces/hybrid/``), one set per trace file (``mtp:<file stem>``), charged
as an MTP layer of the 8B target (``llama3-8b-h100-mtp``: one decoder layer, input_proj
and the target's full-vocabulary LM head per draft forward); the host runs MTP on its
EAGLE path, so ``--zero-step`` applies as for the other model drafts. Combinable with
``--model-drafts``.

Bars per batch size (``check_bars``): the controller at >= 98 % of the best fixed step
count and of plain decoding, and at or above the host's EMA policy, except where the
EMA's hand-set tier already sits on the optimum (its goodput within 0.5 % of the best of
plain and every fixed step count): there within 0.5 % of it counts as level.

    python benchmarks/adaptive_replay.py --synthetic          # generated tables
    python benchmarks/adaptive_replay.py                       # benchmarks/results/acceptance/*.jsonl
    python benchmarks/adaptive_replay.py --tables a.jsonl b.jsonl
    python benchmarks/adaptive_replay.py --model-drafts --zero-step skip
    python benchmarks/adaptive_replay.py --model-drafts --zero-step repair
    python benchmarks/adaptive_replay.py --mtp-drafts smollm2-mtp \
        --out benchmarks/results/adaptive_replay_mtp_warm.json
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The parts live in benchmarks/adaptive/; their names stay importable from here.
from benchmarks.adaptive.bars import BAR_FIXED, BAR_PLAIN, EMA_LEVEL, check_bars, summary  # noqa: E402
from benchmarks.adaptive.costs import (  # noqa: E402
    CONTROLLER_DRAFT_PRIOR_SCALE,
    CONTROLLER_PRIOR,
    LABEL,
    SHAPE_PRESETS,
    TRUTH_PRESET,
    controller_config,
    truth_params,
)
from benchmarks.adaptive.host_ema import HostEMAPolicy, host_ema_available  # noqa: E402
from benchmarks.adaptive.report import build_report, format_table, plot  # noqa: E402
from benchmarks.adaptive.run import BATCH_SIZES, run_set  # noqa: E402
from benchmarks.adaptive.sources import (  # noqa: E402
    HYBRID_TRACES,
    MTP_DRAFT,
    SYNTHETIC_SETS,
    TRACE_DRAFT,
    model_draft_tables,
    recorded_draft_tables,
    synthetic_tables,
)
from sglang_spec_ext.adaptive.prior import PRESETS, step_time  # noqa: E402
from sglang_spec_ext.adaptive.simulator import load_tables  # noqa: E402

__all__ = [
    "BAR_FIXED", "BAR_PLAIN", "BATCH_SIZES", "CONTROLLER_DRAFT_PRIOR_SCALE", "CONTROLLER_PRIOR",
    "EMA_LEVEL", "HYBRID_TRACES", "LABEL", "MTP_DRAFT", "PRESETS", "RESULTS", "SHAPE_PRESETS",
    "SYNTHETIC_SETS", "TRACE_DRAFT", "TRUTH_PRESET", "HostEMAPolicy", "check_bars",
    "controller_config", "format_table", "host_ema_available", "main", "model_draft_tables",
    "plot", "recorded_draft_tables", "run_set", "step_time", "synthetic_tables", "truth_params",
]  # fmt: skip

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic", action="store_true", help="use generated acceptance tables")
    ap.add_argument("--tables", nargs="*", help="acceptance-table JSONL files")
    ap.add_argument(
        "--model-drafts",
        action="store_true",
        help="model-draft chains: STANDALONE-shaped (trace proposals) and EAGLE-shaped "
        "(synthetic) acceptance, charged with draft forwards",
    )
    ap.add_argument(
        "--mtp-drafts",
        nargs="?",
        const=MTP_DRAFT,
        metavar="NAME",
        help="MTP draft chains: the recorded proposals model_drafts[NAME] (default "
        f"{MTP_DRAFT}) of every trace in --trace-dir, charged as an MTP layer of the target",
    )
    ap.add_argument(
        "--trace-dir",
        type=Path,
        default=HYBRID_TRACES,
        help="traces with recorded model-draft proposals (--model-drafts, --mtp-drafts)",
    )
    ap.add_argument(
        "--zero-step",
        choices=("warm", "skip", "repair"),
        default="warm",
        help="model drafts at zero steps: run the draft extend (host default), skip it, or "
        "skip it and rebuild the draft KV at the next drafting step (draft-KV repair)",
    )
    ap.add_argument("--sets", help="comma-separated subset of the sets to run")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    ap.add_argument("--steps", type=int, default=4000, help="decode steps per replay")
    ap.add_argument("--requests", type=int, default=300, help="synthetic requests per set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=0.05, help="log-normal sd of measured times")
    ap.add_argument("--outlier-rate", type=float, default=0.01)
    ap.add_argument("--no-host-ema", action="store_true")
    ap.add_argument("--counterfactual", action="store_true", help="add controller+nested")
    ap.add_argument("--out", default=str(RESULTS / "adaptive_replay.json"))
    ap.add_argument("--plot", help="plot path (default: --out with .png; '' = none)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a bar fails")
    ap.add_argument("--note", default="", help="free text stored in the JSON (provenance)")
    args = ap.parse_args(argv)

    shapes: dict[str, str] = {}
    if args.model_drafts or args.mtp_drafts:
        tables, source = {}, []
        try:
            if args.model_drafts:
                tables, shapes = model_draft_tables(args.requests, args.seed, args.trace_dir)
                source += [f"{args.trace_dir / '*.jsonl'} model_drafts[{TRACE_DRAFT}]",
                           "synthetic eagle-chain"]  # fmt: skip
            if args.mtp_drafts:
                mtp = recorded_draft_tables(args.mtp_drafts, "mtp", args.trace_dir)
                tables.update(mtp)
                shapes.update(dict.fromkeys(mtp, "mtp"))
                source.append(f"{args.trace_dir / '*.jsonl'} model_drafts[{args.mtp_drafts}]")
        except ValueError as exc:
            ap.error(
                f"{exc}\n(record a draft's proposals into the traces with "
                "benchmarks/model_drafts.py, or name one the traces have)"
            )
    elif args.synthetic:
        sets = args.sets.split(",") if args.sets else SYNTHETIC_SETS
        bad = sorted(set(sets) - set(SYNTHETIC_SETS))
        if bad:
            ap.error(f"--sets: {bad} not among {list(SYNTHETIC_SETS)}")
        tables, source = synthetic_tables(args.requests, args.seed, sets), "synthetic"
    else:
        paths = args.tables or sorted(glob.glob(str(RESULTS / "acceptance" / "*.jsonl")))
        if not paths:
            ap.error("no acceptance tables found; pass --tables or --synthetic")
        tables, source = load_tables(paths), paths
    if args.sets:
        wanted = args.sets.split(",")
        missing = sorted(set(wanted) - set(tables))
        if missing:
            ap.error(f"--sets: {missing} not among {sorted(tables)}")
        tables = {n: tables[n] for n in wanted}
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    host_ema = not args.no_host_ema and host_ema_available()

    t0 = time.time()
    results: dict[str, dict] = {}
    with tqdm(total=len(tables) * len(batch_sizes), desc="replay", file=sys.stderr) as bar:
        for name, table in tables.items():
            bar.set_postfix_str(name)
            results[name] = run_set(
                table, batch_sizes, steps=args.steps, seed=args.seed, host_ema=host_ema,
                counterfactual=args.counterfactual, noise=args.noise,
                outlier_rate=args.outlier_rate, shape=shapes.get(name, "suffix"),
                zero_step=args.zero_step, progress=bar,
            )  # fmt: skip
    bars = {s: {b: check_bars(r) for b, r in rows.items()} for s, rows in results.items()}
    all_ok = all(v["ok"] for rows in bars.values() for v in rows.values())
    report = build_report(
        args, source=source, shapes=shapes, tables=tables, batch_sizes=batch_sizes,
        host_ema=host_ema, results=results, bars=bars, all_ok=all_ok, t0=t0,
    )  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    plot_path = (
        args.plot if args.plot is not None else args.out and str(Path(args.out).with_suffix(".png"))
    )
    if plot_path:
        plot(results, Path(plot_path))
    print(format_table(results))
    if args.mtp_drafts:
        print(f"\nmtp:* sets: recorded proposals model_drafts[{args.mtp_drafts!r}], charged "
              f"as {SHAPE_PRESETS['mtp']}")  # fmt: skip
    print(summary(all_ok, host_ema, LABEL))
    if args.check and not all_ok:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
