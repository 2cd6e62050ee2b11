"""Replay benchmark of the adaptive draft-width controller.

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
import dataclasses
import functools
import glob
import json
import logging
import sys
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_spec_ext.adaptive.config import CHAIN_DEFAULTS, AdaptiveConfig
from sglang_spec_ext.adaptive.controller import AdaptiveController
from sglang_spec_ext.adaptive.prior import (
    COEFF_NAMES,
    PRESETS,
    StepCostParams,
    draft_extend_time,
    step_time,
)
from sglang_spec_ext.adaptive.simulator import (
    AcceptanceTable,
    ControllerPolicy,
    FixedPolicy,
    WidthPolicy,
    load_tables,
    replay,
)
from sglang_spec_ext.adaptive.synthetic import generate
from sglang_spec_ext.machine import machine_info, package_versions
from sglang_spec_ext.replay.table import model_draft_table
from sglang_spec_ext.replay.trace import read_trace

LABEL = "analytic step-cost model (projection, not measured)"
RESULTS = Path(__file__).resolve().parent / "results"
TRUTH_PRESET = "llama3-8b-h100"
#: Draft shape -> the truth preset its steps are charged with.
SHAPE_PRESETS = {
    "suffix": TRUTH_PRESET,
    "standalone": "llama3-8b-h100-standalone-1b",
    "eagle3": "llama3-8b-h100-eagle3",
    "mtp": "llama3-8b-h100-mtp",
}
HYBRID_TRACES = Path(__file__).resolve().parent / "traces" / "hybrid"
TRACE_DRAFT = "smollm2-l14+8"
#: The recorded MTP layer's proposals (``--mtp-drafts`` without a name).
MTP_DRAFT = "smollm2-mtp"
# The controller's prior is deliberately wrong: it must calibrate from measured times.
CONTROLLER_PRIOR = {
    "cost_mem_bw": 2.0e12,  # truth 2.68e12
    "cost_flops": 4.0e14,  # truth 6.0e14
    "cost_fixed_s": 2.0e-3,  # truth 1.0e-3
    "cost_context_len": 1024.0,  # truth 2048
    "cost_spec_fixed_s": 0.1e-3,  # truth 0.3e-3
    "cost_draft_s_per_req": 5e-6,  # truth 10e-6
}
#: The controller's draft-model prior is wrong too (x truth).
CONTROLLER_DRAFT_PRIOR_SCALE = {
    "draft_weight_bytes": 1.6,
    "draft_kv_bytes_per_token": 0.5,
    "draft_fixed_s": 2.0,
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BAR_FIXED = 0.98  # controller >= 98 % of the best fixed k
BAR_PLAIN = 0.98  # controller >= 98 % of plain decoding
#: Versus the host EMA: within this of it counts as level where the EMA's hand-set tier
#: already sits on the optimum (its goodput within this of the best static setting).
EMA_LEVEL = 0.005


class HostEMAPolicy:
    """The host's EMA step controller (real sglang code), one chain step = one draft."""

    name = "host EMA"

    def __init__(self, initial_steps: int = 3, max_steps: int | None = None) -> None:
        """``max_steps``: drop the host's default candidates above it (through its own
        config-file interface, as the server does), so it chooses among steps the
        drafts really have."""
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

        from sglang_spec_ext.sglang.model_drafts.adaptive import host_ema_policy

        logging.getLogger("sglang").setLevel(logging.WARNING)
        if max_steps is None:
            self.params = AdaptiveSpeculativeParams(initial_steps=initial_steps)
        else:
            self.params = host_ema_policy(max_steps)

    def choose(self, batch_size: int, req_ids: Sequence[Hashable]) -> int:
        return int(self.params.get_steps_for_batch(batch_size))

    def observe(
        self,
        batch_size: int,
        k: int,
        accepted: np.ndarray,
        step_time_s: float,
        req_ids: Sequence[Hashable],
        finished: Sequence[Hashable],
        within: Mapping[int, np.ndarray] | None = None,
    ) -> None:
        self.params.on_verify_complete([int(a) for a in accepted], batch_size)


def host_ema_available() -> bool:
    try:
        import sglang.srt.speculative.adaptive_spec_params  # noqa: F401
    except Exception:
        return False
    return True


SYNTHETIC_SETS = ("repetitive", "chat", "mixed")


def synthetic_tables(
    n_requests: int, seed: int, sets: Sequence[str] = SYNTHETIC_SETS
) -> dict[str, AcceptanceTable]:
    return {
        s: AcceptanceTable.from_rows(
            generate(s, n_requests, seed=seed + SYNTHETIC_SETS.index(s)), s
        )
        for s in sets
    }


def truth_params(shape: str, zero_step: str = "warm") -> StepCostParams:
    """The step-cost truth of a draft shape (``zero_step``: model drafts only)."""
    params = PRESETS[SHAPE_PRESETS[shape]]
    if shape != "suffix" and zero_step in ("skip", "repair"):
        params = params.with_overrides(zero_step_draft=0.0)
    return params


def recorded_draft_tables(
    draft: str, shape: str, trace_dir: Path = HYBRID_TRACES
) -> dict[str, AcceptanceTable]:
    """``shape:<file stem>`` -> the acceptance of the recorded chain proposals
    ``model_drafts[draft]`` of each trace file in ``trace_dir``. ``ValueError`` naming the
    file where a record lacks them, or where ``trace_dir`` has no trace."""
    paths = sorted(Path(trace_dir).glob("*.jsonl"))
    if not paths:
        raise ValueError(f"no *.jsonl trace in {trace_dir}")
    tables: dict[str, AcceptanceTable] = {}
    for path in paths:
        try:
            rows = [r.to_json() for r in model_draft_table(read_trace(path), draft)]
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        name = f"{shape}:{path.stem}"
        tables[name] = AcceptanceTable.from_rows(rows, name)
    return tables


def model_draft_tables(
    n_synthetic: int, seed: int, trace_dir: Path = HYBRID_TRACES
) -> tuple[dict[str, AcceptanceTable], dict[str, str]]:
    """STANDALONE-shaped tables per trace set (real draft proposals) and one
    EAGLE-shaped synthetic table; with the shape of each."""
    tables = recorded_draft_tables(TRACE_DRAFT, "standalone", trace_dir)
    shapes = dict.fromkeys(tables, "standalone")
    rows = generate("eagle-chain", n_synthetic, ks=range(1, 8), seed=seed)
    tables["eagle3:synthetic"] = AcceptanceTable.from_rows(rows, "eagle3:synthetic")
    shapes["eagle3:synthetic"] = "eagle3"
    return tables, shapes


def controller_config(
    table: AcceptanceTable, shape: str = "suffix", zero_step: str = "warm"
) -> AdaptiveConfig:
    """Candidates: the default ones the table has columns for (all of the table's
    budgets if that leaves fewer than three), capped at 32; plus plain decoding.
    Model drafts: every step count of the table, and a wrong draft prior too."""
    ks = [int(k) for k in table.ks[1:] if k <= 32]
    default = AdaptiveConfig().candidate_ks
    cands = [k for k in ks if k in default]
    cands = (0, *(cands if len(cands) >= 3 else ks)) if shape == "suffix" else (0, *ks)
    prior = dict(CONTROLLER_PRIOR)
    if shape != "suffix":
        truth = truth_params(shape, zero_step)
        for name, scale in CONTROLLER_DRAFT_PRIOR_SCALE.items():
            prior["cost_" + name] = getattr(truth, name) * scale
        prior["cost_zero_step_draft"] = truth.zero_step_draft  # the server reads its env
    return AdaptiveConfig(
        candidate_ks=cands,
        max_k=max(cands),
        cost_preset=SHAPE_PRESETS[shape],
        **prior,
        **({} if shape == "suffix" else CHAIN_DEFAULTS),
    )


def run_set(
    table: AcceptanceTable,
    batch_sizes: Sequence[int],
    *,
    steps: int,
    seed: int,
    host_ema: bool,
    counterfactual: bool,
    noise: float,
    outlier_rate: float,
    shape: str = "suffix",
    zero_step: str = "warm",
    progress: tqdm | None = None,
) -> dict[str, dict]:
    """Goodput of every policy at every batch size for one acceptance set."""
    truth = truth_params(shape, zero_step)
    plain_truth = PRESETS[TRUTH_PRESET]  # no draft model at all

    def true_cost(bs: int, k: int) -> float:
        return float(step_time(truth, bs, k)[0])

    def plain_cost(bs: int, k: int) -> float:
        return float(step_time(plain_truth, bs, 0)[0])

    cfg = controller_config(table, shape, zero_step)
    repair = None
    if shape != "suffix" and zero_step == "repair":  # the draft constants of the truth
        repair = functools.partial(draft_extend_time, truth)

    out: dict[str, dict] = {}
    for bs in batch_sizes:
        policies: list[WidthPolicy] = [FixedPolicy(k) for k in cfg.ks]
        controller = AdaptiveController(cfg)
        if repair is not None:  # priced from the controller's own (wrong) prior
            controller.expect_repairs(functools.partial(draft_extend_time, cfg.cost_params()))
        policies.append(ControllerPolicy(controller, "controller"))
        if counterfactual:
            policies.append(
                ControllerPolicy(AdaptiveController(cfg), "controller+nested", counterfactual=True)
            )
        if host_ema:
            policies.append(HostEMAPolicy(max_steps=max(cfg.ks)))
        row: dict[str, dict] = {}
        plain = replay(table, bs, FixedPolicy(0), plain_cost, steps=steps, seed=seed)
        row["plain"] = {"goodput_tok_s": plain.goodput, "mean_k": 0.0, "k_hist": {"0": steps}}
        for pol in policies:
            res = replay(
                table, bs, pol, true_cost, steps=steps, seed=seed,
                noise=noise, outlier_rate=outlier_rate, repair_cost=repair,
            )  # fmt: skip
            row[pol.name] = {
                "goodput_tok_s": res.goodput,
                "mean_k": res.mean_k,
                "k_hist": {str(k): n for k, n in sorted(res.k_hist.items())},
            }
        out[str(bs)] = row
        if progress is not None:
            progress.update(1)
    return out


def check_bars(row: dict[str, dict]) -> dict[str, object]:
    """Bars at one batch size: vs best fixed (2 %), vs host EMA, vs plain (2 %). Versus
    the EMA: at or above it, or level (within ``EMA_LEVEL`` below it) where the EMA
    already sits on the optimum (within ``EMA_LEVEL`` of the best of plain and every
    fixed step count); ``vs_host_ema`` says which."""
    fixed = {n: v["goodput_tok_s"] for n, v in row.items() if n.startswith("fixed")}
    best_name = max(fixed, key=fixed.__getitem__)
    ctl = row["controller"]["goodput_tok_s"]
    plain = row["plain"]["goodput_tok_s"] if "plain" in row else None
    res: dict[str, object] = {
        "best_fixed": best_name,
        "ctl_over_best_fixed": ctl / fixed[best_name],
        "ok_best_fixed": ctl >= BAR_FIXED * fixed[best_name],
    }
    if plain is not None:
        res["ctl_over_plain"] = ctl / plain
        res["ok_plain"] = ctl >= BAR_PLAIN * plain
    if "host EMA" in row:
        ema = row["host EMA"]["goodput_tok_s"]
        optimum = max(fixed[best_name], plain if plain is not None else 0.0)
        on_optimum = ema >= (1.0 - EMA_LEVEL) * optimum
        res["ctl_over_host_ema"] = ctl / ema
        res["host_ema_on_optimum"] = on_optimum
        if ctl >= ema:
            res["vs_host_ema"] = "above"
        elif on_optimum and ctl >= (1.0 - EMA_LEVEL) * ema:
            res["vs_host_ema"] = "level"
        else:
            res["vs_host_ema"] = "below"
        res["ok_host_ema"] = res["vs_host_ema"] != "below"
    res["ok"] = all(v for key, v in res.items() if key.startswith("ok_"))
    return res


def format_table(results: dict[str, dict]) -> str:
    lines = []
    for set_name, rows in results.items():
        lines.append(f"\n[{set_name}] goodput, tokens/s ({LABEL})")
        head = f"{'bs':>4} {'plain':>9} {'best fixed':>15} {'controller':>10} {'host EMA':>9} {'ctl k':>6} {'EMA k':>6} {'ctl/best':>8} {'ctl/plain':>9} {'ctl/EMA':>8} {'vs EMA':>6} {'bars':>5}"
        lines.append(head)
        for bs, row in rows.items():
            bars = check_bars(row)
            best = str(bars["best_fixed"])
            ema = row.get("host EMA", {}).get("goodput_tok_s", float("nan"))
            ema_k = row.get("host EMA", {}).get("mean_k", float("nan"))
            lines.append(
                f"{bs:>4} {row['plain']['goodput_tok_s']:9.0f} "
                f"{row[best]['goodput_tok_s']:9.0f} ({best[6:]:>4}) "
                f"{row['controller']['goodput_tok_s']:10.0f} {ema:9.0f} "
                f"{row['controller']['mean_k']:6.1f} {ema_k:6.1f} "
                f"{bars['ctl_over_best_fixed']:8.3f} "
                f"{bars.get('ctl_over_plain', float('nan')):9.3f} "
                f"{bars.get('ctl_over_host_ema', float('nan')):8.3f} "
                f"{bars.get('vs_host_ema', '-'):>6} "
                f"{'ok' if bars['ok'] else 'FAIL':>5}"
            )
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(2, n, figsize=(5.2 * n, 8), squeeze=False)
    for col, (set_name, rows) in enumerate(results.items()):
        bss = [int(b) for b in rows]
        names = list(next(iter(rows.values())))
        plain = np.array([rows[str(b)]["plain"]["goodput_tok_s"] for b in bss])
        for name in names:
            g = np.array([rows[str(b)][name]["goodput_tok_s"] for b in bss])
            fixed = name.startswith("fixed")
            style = {"color": "0.75", "lw": 0.8} if fixed else {"lw": 2}
            label = None if fixed else name
            if name == "plain":
                label, style = "plain decoding", {"color": "k", "lw": 1.5, "ls": "--"}
            for row_i, y in ((0, g), (1, g / plain)):
                axes[row_i][col].plot(bss, y, label=label, **style)
        best = [
            max(v["goodput_tok_s"] for k, v in rows[str(b)].items() if k.startswith("fixed"))
            for b in bss
        ]
        axes[1][col].plot(
            bss, np.array(best) / plain, color="0.4", lw=1, ls=":", label="best fixed k"
        )
        for row_i in (0, 1):
            ax = axes[row_i][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.grid(alpha=0.3)
        axes[0][col].set_yscale("log")
        axes[0][col].set_title(f"{set_name}")
        axes[0][col].set_ylabel("goodput (tokens/s)")
        axes[1][col].set_ylabel("goodput / plain decoding")
        axes[1][col].legend(fontsize=7)
    fig.suptitle(f"Adaptive draft width, replay; {LABEL}; grey: fixed k", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    truth = PRESETS[TRUTH_PRESET]
    cfg = AdaptiveConfig(**CONTROLLER_PRIOR)
    report = {
        "label": LABEL,
        "source": source,
        "note": args.note,
        "machine": {
            **machine_info(),
            "gpu_used": "none: step times come from the analytic model",
        },
        "versions": package_versions(),
        "parameters": {
            "batch_sizes": batch_sizes,
            "steps": args.steps,
            "seed": args.seed,
            "synthetic_requests": args.requests if args.synthetic else None,
            "measurement_noise_lognormal_sd": args.noise,
            "outlier_rate": args.outlier_rate,
            "outlier_factor": 3.0,
            "host_ema": host_ema,
            "host_ema_initial_steps": 3,
            "zero_step": args.zero_step,
            "mtp_draft": args.mtp_drafts,
            "shapes": {n: shapes.get(n, "suffix") for n in tables},
            "truth_presets": {n: SHAPE_PRESETS[shapes.get(n, "suffix")] for n in tables},
            "bars": {
                "vs_best_fixed": BAR_FIXED,
                "vs_plain": BAR_PLAIN,
                "vs_host_ema": 1.0,
                "host_ema_level_where_on_optimum": 1.0 - EMA_LEVEL,
            },
        },  # fmt: skip
        "cost_model": {
            "formula": "t = fixed + [k>0](spec_fixed + bs*draft_per_req) + max(weights + "
            "bs*kv_per_req + n*act_per_token, n*flop_per_token), n = bs*(k+1)",
            "truth_preset": TRUTH_PRESET,
            "truth_constants": truth.to_dict(),
            "truth_coefficients_s": dict(
                zip(COEFF_NAMES, truth.coefficients().tolist(), strict=True)
            ),
            "controller_prior_constants": cfg.cost_params().to_dict(),
        },
        "controller_config": dataclasses.asdict(cfg),  # candidate_ks/max_k: per table
        "tables": {
            n: {
                "requests": len(t.lengths),
                "positions": int(t.lengths.sum()),
                "ks": t.ks[1:].tolist(),
                "candidate_ks": list(controller_config(t, shapes.get(n, "suffix")).ks),
                "controller_cost_prior": controller_config(
                    t, shapes.get(n, "suffix"), args.zero_step
                )
                .cost_params()
                .to_dict(),
            }
            for n, t in tables.items()
        },
        "results": results,
        "bars": bars,
        "all_bars_ok": all_ok,
        "wall_s": round(time.time() - t0, 1),
    }
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
    print(f"\nbars ({'all hold' if all_ok else 'SOME FAIL'}): controller >= {BAR_FIXED:.0%} of best "
          f"fixed k, >= host EMA{'' if host_ema else ' (not run)'} (level: within {EMA_LEVEL:.1%} "
          f"where the EMA sits on the optimum), >= {BAR_PLAIN:.0%} of plain; {LABEL}")  # fmt: skip
    if args.check and not all_ok:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
