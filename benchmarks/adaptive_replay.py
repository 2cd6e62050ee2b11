"""Replay benchmark of the adaptive draft-width controller.

Drives ``sglang_spec_ext.adaptive.AdaptiveController`` with acceptance tables (JSONL,
``{"set", "ks", "accepted"}`` per request) at batch sizes 1..256 and compares it with
every fixed ``k``, plain decoding (``k = 0``) and the host's own EMA policy
(``sglang.srt.speculative.adaptive_spec_params.AdaptiveSpeculativeParams``, run through
its real Python API; its chosen step count maps to ``k = steps``, a chain).

Step times come from the ANALYTIC step-cost model (``sglang_spec_ext.adaptive.cost``,
default constants: Llama-3-8B bf16 on one H100 SXM). Nothing is measured on a GPU:
the figures are a projection, labelled as such in the output. The simulation charges
the analytic time (the "truth"); the controller's own cost model starts from a
deliberately different prior (``CONTROLLER_PRIOR``) and calibrates online from the
charged times times log-normal noise with 1 % outliers (x3).

    python benchmarks/adaptive_replay.py --synthetic          # generated tables
    python benchmarks/adaptive_replay.py                       # benchmarks/results/acceptance/*.jsonl
    python benchmarks/adaptive_replay.py --tables a.jsonl b.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Hashable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_spec_ext.adaptive.config import AdaptiveConfig
from sglang_spec_ext.adaptive.controller import AdaptiveController
from sglang_spec_ext.adaptive.cost import PRESETS, analytic_step_time
from sglang_spec_ext.adaptive.simulator import (
    AcceptanceTable,
    ControllerPolicy,
    FixedPolicy,
    WidthPolicy,
    load_tables,
    replay,
)
from sglang_spec_ext.adaptive.synthetic import generate

LABEL = "analytic step-cost model (projection, not measured)"
RESULTS = Path(__file__).resolve().parent / "results"
TRUTH_PRESET = "llama3-8b-h100"
# The controller's prior is deliberately wrong: it must calibrate from measured times.
CONTROLLER_PRIOR = {
    "cost_mem_bw": 2.0e12,  # truth 2.68e12
    "cost_flops": 4.0e14,  # truth 6.0e14
    "cost_fixed_s": 2.0e-3,  # truth 1.0e-3
    "cost_context_len": 1024.0,  # truth 2048
    "cost_spec_fixed_s": 0.1e-3,  # truth 0.3e-3
    "cost_draft_s_per_req": 5e-6,  # truth 10e-6
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BAR_FIXED = 0.98  # controller >= 98 % of the best fixed k
BAR_PLAIN = 0.98  # controller >= 98 % of plain decoding


class HostEMAPolicy:
    """The host's EMA step controller (real sglang code), one chain step = one draft."""

    name = "host EMA"

    def __init__(self, initial_steps: int = 3) -> None:
        from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

        logging.getLogger("sglang").setLevel(logging.WARNING)
        self.params = AdaptiveSpeculativeParams(initial_steps=initial_steps)

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


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


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


def controller_config(table: AcceptanceTable) -> AdaptiveConfig:
    """Candidates: the default ones the table has columns for (all of the table's
    budgets if that leaves fewer than three), capped at 32; plus plain decoding."""
    ks = [int(k) for k in table.ks[1:] if k <= 32]
    default = AdaptiveConfig().candidate_ks
    cands = [k for k in ks if k in default]
    cands = (0, *(cands if len(cands) >= 3 else ks))
    return AdaptiveConfig(candidate_ks=cands, max_k=max(cands), **CONTROLLER_PRIOR)


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
    progress: tqdm | None = None,
) -> dict[str, dict]:
    """Goodput of every policy at every batch size for one acceptance set."""
    truth = PRESETS[TRUTH_PRESET].coefficients()

    def true_cost(bs: int, k: int) -> float:
        return float(analytic_step_time(truth, bs, k)[0])

    cfg = controller_config(table)
    out: dict[str, dict] = {}
    for bs in batch_sizes:
        policies: list[WidthPolicy] = [FixedPolicy(k) for k in cfg.ks]
        policies.append(ControllerPolicy(AdaptiveController(cfg), "controller"))
        if counterfactual:
            policies.append(
                ControllerPolicy(AdaptiveController(cfg), "controller+nested", counterfactual=True)
            )
        if host_ema:
            policies.append(HostEMAPolicy())
        row: dict[str, dict] = {}
        for pol in policies:
            res = replay(
                table, bs, pol, true_cost, steps=steps, seed=seed,
                noise=noise, outlier_rate=outlier_rate,
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
    """Bars at one batch size: vs best fixed (2 %), vs host EMA, vs plain (2 %)."""
    fixed = {n: v["goodput_tok_s"] for n, v in row.items() if n.startswith("fixed")}
    best_name = max(fixed, key=fixed.__getitem__)
    ctl = row["controller"]["goodput_tok_s"]
    plain = row["fixed k=0"]["goodput_tok_s"] if "fixed k=0" in row else None
    res: dict[str, object] = {
        "best_fixed": best_name,
        "ctl_over_best_fixed": ctl / fixed[best_name],
        "ok_best_fixed": ctl >= BAR_FIXED * fixed[best_name],
    }
    if plain is not None:
        res["ctl_over_plain"] = ctl / plain
        res["ok_plain"] = ctl >= BAR_PLAIN * plain
    if "host EMA" in row:
        res["ctl_over_host_ema"] = ctl / row["host EMA"]["goodput_tok_s"]
        res["ok_host_ema"] = ctl >= row["host EMA"]["goodput_tok_s"]
    res["ok"] = all(v for key, v in res.items() if key.startswith("ok_"))
    return res


def format_table(results: dict[str, dict]) -> str:
    lines = []
    for set_name, rows in results.items():
        lines.append(f"\n[{set_name}] goodput, tokens/s ({LABEL})")
        head = f"{'bs':>4} {'plain':>9} {'best fixed':>15} {'controller':>10} {'host EMA':>9} {'ctl k':>6} {'ctl/best':>8} {'ctl/plain':>9} {'ctl/EMA':>8} {'bars':>5}"
        lines.append(head)
        for bs, row in rows.items():
            bars = check_bars(row)
            best = str(bars["best_fixed"])
            ema = row.get("host EMA", {}).get("goodput_tok_s", float("nan"))
            lines.append(
                f"{bs:>4} {row['fixed k=0']['goodput_tok_s']:9.0f} "
                f"{row[best]['goodput_tok_s']:9.0f} ({best[6:]:>4}) "
                f"{row['controller']['goodput_tok_s']:10.0f} {ema:9.0f} "
                f"{row['controller']['mean_k']:6.1f} {bars['ctl_over_best_fixed']:8.3f} "
                f"{bars.get('ctl_over_plain', float('nan')):9.3f} "
                f"{bars.get('ctl_over_host_ema', float('nan')):8.3f} "
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
        plain = np.array([rows[str(b)]["fixed k=0"]["goodput_tok_s"] for b in bss])
        for name in names:
            g = np.array([rows[str(b)][name]["goodput_tok_s"] for b in bss])
            fixed = name.startswith("fixed")
            style = {"color": "0.75", "lw": 0.8} if fixed and name != "fixed k=0" else {"lw": 2}
            label = None if fixed and name != "fixed k=0" else name
            if name == "fixed k=0":
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
    ap.add_argument("--plot", default=str(RESULTS / "adaptive_replay.png"))
    ap.add_argument("--check", action="store_true", help="exit 1 when a bar fails")
    ap.add_argument("--note", default="", help="free text stored in the JSON (provenance)")
    args = ap.parse_args(argv)

    if args.synthetic:
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
                outlier_rate=args.outlier_rate, progress=bar,
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
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "gpu": "none used: step times come from the analytic model",
        },
        "versions": {p: _version(p) for p in ("sglang-spec-ext", "sglang", "numpy")},
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
            "bars": {"vs_best_fixed": BAR_FIXED, "vs_plain": BAR_PLAIN, "vs_host_ema": 1.0},
        },  # fmt: skip
        "cost_model": {
            "formula": "t = fixed + [k>0](spec_fixed + bs*draft_per_req) + max(weights + "
            "bs*kv_per_req + n*act_per_token, n*flop_per_token), n = bs*(k+1)",
            "truth_preset": TRUTH_PRESET,
            "truth_constants": truth.to_dict(),
            "truth_coefficients_s": dict(
                zip(
                    (
                        "fixed",
                        "spec_fixed",
                        "draft_per_req",
                        "weights",
                        "kv_per_req",
                        "act_per_token",
                        "flop_per_token",
                    ),
                    truth.coefficients().tolist(),
                    strict=True,
                )
            ),  # fmt: skip
            "controller_prior_constants": cfg.cost_params().to_dict(),
        },
        "controller_config": dataclasses.asdict(cfg),  # candidate_ks/max_k: per table
        "tables": {
            n: {
                "requests": len(t.lengths),
                "positions": int(t.lengths.sum()),
                "ks": t.ks[1:].tolist(),
                "candidate_ks": list(controller_config(t).ks),
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
    if args.plot:
        plot(results, Path(args.plot))
    print(format_table(results))
    print(f"\nbars ({'all hold' if all_ok else 'SOME FAIL'}): controller >= {BAR_FIXED:.0%} of best "
          f"fixed k, >= host EMA{'' if host_ema else ' (not run)'}, >= {BAR_PLAIN:.0%} of plain; {LABEL}")  # fmt: skip
    if args.check and not all_ok:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
