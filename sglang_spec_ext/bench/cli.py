"""``sglang-spec-ext bench``: baseline vs speculative serving, across scenarios
(input/output lengths) and loads (Poisson request rates, fixed concurrencies).

Endpoints: ``--baseline-url`` / ``--spec-url`` for running servers, or
``--model-path M`` to launch them here (``--baseline-args``, ``--spec-args``,
``--server-args`` for both; always stopped). Prints the comparison table last;
``--out DIR`` writes ``results.json`` (after every cell) and ``bench.png``.
Exit status: 0, 1 on a parity mismatch, 2 on bad usage, 3 when a server fails to
start or requests failed, 130 when interrupted (what was measured is saved).
"""

from __future__ import annotations

import argparse
import asyncio
import math
from pathlib import Path
from typing import Any

from sglang_spec_ext.bench import report, workload
from sglang_spec_ext.bench.client import APIS, fetch_model_path
from sglang_spec_ext.bench.runner import Endpoint, Plan, log, run_all
from sglang_spec_ext.bench.servers import (
    ServerError,
    add_launch_arguments,
    launch_settings,
    signals_as_interrupt,
)

DEFAULT_SPEC_ARGS = "--speculative-algorithm SUFFIX"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("endpoints (running servers)")
    g.add_argument("--baseline-url", help="running server without speculation")
    g.add_argument("--spec-url", help="running server with speculation")
    g = p.add_argument_group("endpoints (launched here)")
    g.add_argument(
        "--model-path", help="launch servers for this model (python -m sglang.launch_server)"
    )
    g.add_argument("--baseline-args", default="", help="extra launch args of the baseline server")
    g.add_argument(
        "--spec-args",
        default=DEFAULT_SPEC_ARGS,
        help=f"launch args of the speculative server (default {DEFAULT_SPEC_ARGS!r})",
    )
    add_launch_arguments(g, "launch args for both servers (e.g. '--device cpu ...')")
    g.add_argument(
        "--no-baseline", action="store_true", help="measure only the speculative endpoint"
    )
    g.add_argument("--no-spec", action="store_true", help="measure only the baseline endpoint")
    g = p.add_argument_group("workload")
    g.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME[:IN:OUT]",
        help=f"preset ({', '.join(workload.PRESET_SCENARIOS)}) or NAME:IN:OUT; repeatable (default: the three presets)",
    )
    g.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply all lengths (e.g. 0.05 for a CPU smoke run)",
    )
    g.add_argument(
        "--rates",
        default=None,
        help="Poisson request rates, req/s, 'inf' = all at once (default 1,4,inf unless --concurrency is given)",
    )
    g.add_argument("--concurrency", default="", help="closed-loop client counts, e.g. 1,4")
    g.add_argument("--num-prompts", type=int, default=32, help="requests per cell")
    g.add_argument(
        "--prompts",
        choices=("random", "random-words", "mixed", "structured"),
        default="random",
        help="random token ids, random words, the mixed workload (code edits, agent loops "
        "and a repeated question beside chat and random-token prompts; chat-template "
        "prompts of their own length, the scenario sets the output length), or the "
        "structured workload (tool calls under JSON schemas, regex answers, JSON mode, chat; "
        "each constrained request ends with its grammar, native API) (ignored with "
        "--dataset)",
    )
    g.add_argument(
        "--dataset",
        type=Path,
        help="JSONL prompts: 'prompt_ids' or 'prompt' per line (used as they are; the scenario sets the output length)",
    )
    g.add_argument("--tokenizer", help="tokenizer directory (default: the model path)")
    g.add_argument(
        "--vocab-size",
        type=int,
        help="random token ids from range(N) (default: from the tokenizer)",
    )
    g.add_argument(
        "--api",
        choices=APIS,
        default="native",
        help="native /generate (exact lengths, accept length) or OpenAI /v1/completions",
    )
    g.add_argument("--no-stream", action="store_true", help="no streaming (no TTFT/ITL)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--warmup", type=int, default=1, help="warm-up requests per endpoint")
    g.add_argument("--request-timeout", type=float, default=3600.0)
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("parity")
    g.add_argument(
        "--check-parity",
        action="store_true",
        help="greedy prompts through both endpoints must give identical tokens",
    )
    g.add_argument("--parity-prompts", type=int, default=4)
    g.add_argument(
        "--parity-only", action="store_true", help="only the parity check (implies --check-parity)"
    )
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, help="directory for results.json, bench.png and server logs")
    g.add_argument("--label", help="a note stored with the results (e.g. 'CPU smoke run')")
    g.add_argument("--no-progress", action="store_true")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("func",)}  # fmt: skip


def _endpoints(args: argparse.Namespace) -> list[Endpoint]:
    launch = launch_settings(args)
    out = []
    for role, url, args_, off in (
        ("baseline", args.baseline_url, args.baseline_args, args.no_baseline),
        ("speculative", args.spec_url, args.spec_args, args.no_spec),
    ):
        if off:
            continue
        if url:
            out.append(Endpoint(role, url=url))
        elif args.model_path:
            out.append(
                Endpoint(
                    role,
                    model_path=args.model_path,
                    args=launch.launch_args(args_, args.model_path),
                    env=launch.env,
                    pythonpath=launch.pythonpath,
                    start_timeout_s=launch.timeout_s,
                )  # fmt: skip
            )
    return out


def _prompt_source(args: argparse.Namespace, endpoints: list[Endpoint]) -> workload.PromptSource:
    tok_path = args.tokenizer or args.model_path
    if tok_path is None:  # ask the running servers where their model lives
        for ep in endpoints:
            found = asyncio.run(fetch_model_path(ep.url)) if ep.url else None
            if found and Path(found).is_dir():
                tok_path = found
                break
    # random token ids need no tokenizer when the vocabulary size is given
    need_tok = args.dataset is not None or args.prompts != "random" or not args.vocab_size
    tokenizer = workload.load_tokenizer(tok_path) if (tok_path and need_tok) else None
    if args.dataset:
        return workload.PromptSource(
            "dataset", dataset=workload.read_dataset(args.dataset, tokenizer)
        )
    vocab = workload.vocab_ids(tokenizer, tok_path, args.vocab_size)
    if args.prompts == "random" and not vocab:
        raise ValueError("random token prompts need --vocab-size N or --tokenizer DIR")
    return workload.PromptSource(args.prompts, vocab=vocab, tokenizer=tokenizer)


def _plan(args: argparse.Namespace, source: workload.PromptSource) -> Plan:
    scen = [workload.parse_scenario(s) for s in (args.scenario or list(workload.PRESET_SCENARIOS))]
    scen = [s.scaled(args.scale) for s in scen]
    conc = workload.parse_ints(args.concurrency) if args.concurrency else []
    rates = (
        workload.parse_rates(args.rates) if args.rates else ([] if conc else [1.0, 4.0, math.inf])
    )
    if args.num_prompts < 1 or not (rates or conc):
        raise ValueError("need --num-prompts >= 1 and at least one rate or concurrency")
    return Plan(
        scenarios=scen, loads=workload.loads_from(rates, conc), source=source,
        num_prompts=args.num_prompts, seed=args.seed, api=args.api, stream=not args.no_stream,
        temperature=args.temperature, warmup=args.warmup, timeout_s=args.request_timeout,
        parity_prompts=args.parity_prompts if (args.check_parity or args.parity_only) else 0,
        parity_only=args.parity_only, out_dir=args.out, progress=not args.no_progress,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        if args.scale <= 0:
            raise ValueError("--scale must be > 0")
        endpoints = _endpoints(args)
        if not endpoints:
            raise ValueError("no endpoint: give --baseline-url/--spec-url or --model-path")
        roles = {ep.role for ep in endpoints}
        if (args.check_parity or args.parity_only) and roles != {"baseline", "speculative"}:
            raise ValueError("--check-parity needs both a baseline and a speculative endpoint")
        plan = _plan(args, _prompt_source(args, endpoints))
    except (ValueError, OSError) as exc:
        log(f"error: {exc}")
        return 2
    doc = report.new_document(_params(args), args.label)
    doc["scenarios"] = [s.__dict__ for s in plan.scenarios]
    doc["loads"] = [ld.to_json() for ld in plan.loads]
    doc["prompts"] = {"kind": plan.source.kind, "vocab_ids": len(plan.source.vocab) or None}
    out_json = args.out / "results.json" if args.out else None

    def save() -> None:
        if out_json is not None:
            report.write_json(doc, out_json)

    save()
    rc = 0
    try:
        with signals_as_interrupt():
            rc = run_all(endpoints, plan, doc, save)
        failed = sum((c.get(r) or {}).get("failed", 0) for c in doc["cells"] for r in report.ROLES)
        if failed and rc == 0:
            log(f"warning: {failed} requests failed (see 'errors' in the results)")
            rc = 3
        doc["status"] = "complete"
    except KeyboardInterrupt:
        doc["status"] = "interrupted"
        log("interrupted: saving what was measured so far")
        rc = 130
    except ServerError as exc:
        doc["status"] = "failed"
        doc["error"] = str(exc)
        log(f"error: {exc}")
        rc = 3
    save()
    if args.out and doc["cells"]:
        from sglang_spec_ext.bench.plot import plot_results

        png = plot_results(doc, args.out / "bench.png")
        log(f"wrote {out_json}" + (f" and {png}" if png else ""))
    if not args.parity_only:
        print(report.render_table(doc))
    return rc
