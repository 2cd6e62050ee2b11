"""The two modes of ``sglang-spec-ext tune`` (argument handling in ``tune``): each
returns ``(report, best rows per batch size, table text)``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sglang_spec_ext.replay import read_trace
from sglang_spec_ext.tune.search import (
    AnalyticCost,
    LinearCost,
    best_across_widths,
    best_per_batch,
    ranked,
    search,
)
from sglang_spec_ext.tune.tables import (
    LIVE_GRID,
    REPLAY_GRID,
    live_table,
    replay_table,
    search_space,
)


def _batch_sizes(args: argparse.Namespace, default: str) -> list[int]:
    sizes = [int(x) for x in (args.batch_sizes or default).split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError("--batch-sizes must be positive integers")
    return sizes


def _progress(args: argparse.Namespace, desc: str):
    if args.no_progress:
        return None
    from tqdm import tqdm

    return lambda it: tqdm(it, desc=desc, unit="setting", file=sys.stderr, leave=False)


def run_replay(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict], str]:
    space = search_space(args, REPLAY_GRID)
    sizes = _batch_sizes(args, "1,4,16,64")
    cost = LinearCost(args.alpha) if args.cost_model == "linear" else AnalyticCost(args.cost_preset)
    records = read_trace(args.trace, limit=args.limit)
    if args.sets:
        records = [r for r in records if r.set in set(args.sets)]
        if not records:
            raise ValueError(f"no trace records in sets {args.sets}")
    t0 = time.perf_counter()
    evals = search(records, space, args.backend, _progress(args, "tune (replay)"))
    wall = time.perf_counter() - t0
    rows = best_per_batch(evals, space.widths, sizes, cost)
    cfg_bs = args.config_batch_size or sizes[0]
    top = ranked(evals, space.widths, cfg_bs, cost)[: max(args.top, 0)]
    report: dict[str, Any] = {
        "tool": "sglang-spec-ext tune",
        "mode": "replay",
        "trace": str(args.trace),
        "records": len(records),
        "output_tokens": sum(len(r.output_ids) for r in records),
        "objective": "goodput proxy = accept_len(W) / cost(B, W), relative to plain decoding",
        "cost_model": cost.describe(),
        "search_space": space.__dict__,
        "settings_evaluated": len(evals),
        "wall_s": wall,
        "best_per_batch": rows,
        "evaluations": [
            {"setting": e.setting.config_dict(), "accept_length": e.accept} for e in evals
        ],
        "parameters": {k: str(v) for k, v in vars(args).items()},
    }
    lines = [f"tune (replay): {len(records)} requests, {len(evals)} settings x widths "
             f"{space.widths} in {wall:.1f}s; {cost.describe()}"]  # fmt: skip
    if top:
        lines.append(f"best candidates at batch size {cfg_bs}:")
        lines += [
            f"  {g:.3f}x  W={w:<3d} accept {e.accept[w]:.3f}  {e.setting.config_dict()}"
            for g, w, e in top
        ]
    across = best_across_widths(evals, space.widths)
    if across is not None and len([w for w in space.widths if w > 1]) > 1:
        score, e = across
        ws = [w for w in space.widths if w > 1]
        report["across_widths"] = {
            "setting": e.setting.config_dict(),
            "relative_to_best_per_width": score,
            "accept_length": {str(w): e.accept[w] for w in ws},
        }
        accepts = " / ".join(f"{e.accept[w]:.3f}" for w in ws)
        lines.append(
            f"one setting for all widths {ws} (geometric mean {score:.4f} of the best per "
            f"width; accept {accepts}): {e.setting.config_dict()}"
        )
    if args.adaptive and rows:
        report["adaptive"] = _adaptive(args, evals, rows, space.widths, sizes, cost, lines)
    dw = rows[0]["default_width"] if rows else 16
    lines += [
        "best per batch size (goodput and default: x plain decoding; default = plugin "
        f"defaults at W={dw}):",
        replay_table(rows),
    ]
    return report, rows, "\n".join(lines)


def _adaptive(args, evals, rows, widths, sizes, cost, lines: list[str]) -> dict[str, Any]:
    best = rows[0]["setting"]
    ev = next(e for e in evals if e.setting.config_dict() == best)
    try:
        from sglang_spec_ext.tune.adaptive import adaptive_per_batch

        preset = getattr(cost, "preset", "llama3-8b-h100")
        res = adaptive_per_batch(ev.rows, widths, sizes, cost, args.adaptive_steps, 0, preset)
    except Exception as exc:  # optional: the adaptive package is work in progress
        lines.append(f"adaptive controller replay unavailable: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    lines.append(f"adaptive controller vs fixed widths (setting {best}):")
    for r in res:
        lines.append(
            f"  B={r['batch_size']:<4d} controller {r['controller_goodput']:.1f} tok/s "
            f"(mean W {r['controller_mean_width']:.1f}), best fixed W={r['best_fixed_width']} "
            f"{r['best_fixed_goodput']:.1f} tok/s, ratio {r['vs_best_fixed']:.3f}"
        )
    return {"setting": best, "per_batch": res, "step_times": "analytic preset x cost model"}


def run_live(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict], str]:
    from sglang_spec_ext.bench import workload
    from sglang_spec_ext.bench.servers import launch_settings
    from sglang_spec_ext.tune.live import best_live, live_search

    space = search_space(args, LIVE_GRID)
    sizes = _batch_sizes(args, "1,4")
    prompts_file = args.dataset or args.trace
    need_tok = prompts_file is not None or not args.vocab_size
    tokenizer = workload.load_tokenizer(args.model_path) if need_tok else None
    if prompts_file:
        source = workload.PromptSource(
            "dataset", dataset=workload.read_dataset(prompts_file, tokenizer)
        )
    else:
        vocab = workload.vocab_ids(tokenizer, args.model_path, args.vocab_size)
        if not vocab:
            raise ValueError("random prompts need --vocab-size N (no tokenizer found)")
        source = workload.PromptSource("random", vocab=vocab)
    scenario = workload.Scenario("tune", args.input_len, args.output_len)
    t0 = time.perf_counter()
    launch = launch_settings(args)
    points = live_search(
        args.model_path, launch.launch_args(model_path=args.model_path), space.settings(include_default=False), space.widths,
        sizes, source, scenario, args.num_prompts, env=launch.env,
        pythonpath=launch.pythonpath, baseline=not args.no_baseline,
        log_dir=args.json.parent if args.json else None, timeout_s=launch.timeout_s,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    rows = best_live(points, sizes)
    report = {
        "tool": "sglang-spec-ext tune",
        "mode": "live",
        "model_path": args.model_path,
        "server_args": args.server_args,
        "objective": "measured output tokens/s per batch size (closed loop of B clients)",
        "search_space": space.__dict__,
        "points": points,
        "best_per_batch": rows,
        "wall_s": wall,
        "parameters": {k: str(v) for k, v in vars(args).items()},
    }
    head = f"tune (live): {len(points)} servers in {wall:.0f}s; objective: output tok/s"
    return report, rows, head + "\n" + live_table(rows)
