"""adaptive_replay.py: JSON report, table and plot (benchmarks/results/adaptive_replay*.json).

The JSON report (source, machine, versions, parameters, cost model, per-table controller
settings, results and bars), the printed goodput table per set and the PNG (goodput
and goodput over plain decoding against batch size, every policy).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from sglang_spec_ext.adaptive.config import AdaptiveConfig
from sglang_spec_ext.adaptive.prior import COEFF_NAMES, PRESETS
from sglang_spec_ext.adaptive.simulator import AcceptanceTable
from sglang_spec_ext.machine import machine_info, package_versions

from .bars import BAR_FIXED, BAR_PLAIN, EMA_LEVEL, check_bars
from .costs import CONTROLLER_PRIOR, LABEL, SHAPE_PRESETS, TRUTH_PRESET, controller_config


def build_report(
    args: argparse.Namespace,
    *,
    source: object,
    shapes: dict[str, str],
    tables: dict[str, AcceptanceTable],
    batch_sizes: list[int],
    host_ema: bool,
    results: dict[str, dict],
    bars: dict[str, dict],
    all_ok: bool,
    t0: float,
) -> dict:
    """The JSON report of one run (``args``: the parsed command line)."""
    truth = PRESETS[TRUTH_PRESET]
    cfg = AdaptiveConfig(**CONTROLLER_PRIOR)
    return {
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
