"""``sglang-spec-ext tune``: search SUFFIX draft settings and write the best as a
config file (``SGLANG_SPEC_EXT_CONFIG``) that ``load_config`` accepts.

- ``--trace FILE.jsonl``: exact offline replay (``tune.search``); objective: accept
  length per verify step over a verify-cost model, per batch size (see
  ``tune.search`` for the cost models). Optional ``--adaptive``: the adaptive
  controller replayed on the best setting (``tune.adaptive``).
- ``--model-path M --server-args "..."``: real servers launched per point
  (``tune.live``); objective: measured output tok/s per batch size.
  A running server (``--url``) cannot be tuned: SUFFIX settings are read at start.

The verify width is a server flag (``--speculative-num-draft-tokens``), not a config
key: ``tune`` prints it next to the config it writes. The table comes last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sglang_spec_ext.bench.servers import add_launch_arguments
from sglang_spec_ext.config import CONFIG_FILE_ENV, ConfigError, load_config
from sglang_spec_ext.machine import machine_info
from sglang_spec_ext.tune.modes import run_live, run_replay
from sglang_spec_ext.tune.search import CONFIG_KEYS
from sglang_spec_ext.tune.tables import LIVE_GRID, REPLAY_GRID


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to tune on")
    g.add_argument(
        "--trace",
        type=Path,
        help="replay trace (JSONL prompt_ids/output_ids); with --model-path: the prompts",
    )
    g.add_argument("--model-path", help="tune on real servers launched here (one per point)")
    g.add_argument("--url", help="not supported: a running server cannot change SUFFIX settings")
    g = p.add_argument_group("search space (comma lists; defaults differ for replay and live)")
    g.add_argument(
        "--widths",
        help=f"verify widths incl. the root (replay {REPLAY_GRID['widths']}, live {LIVE_GRID['widths']})",
    )
    for name in CONFIG_KEYS:
        g.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            help=f"replay {REPLAY_GRID[name]}, live {LIVE_GRID[name]}",
        )
    g.add_argument(
        "--batch-sizes",
        default=None,
        help="batch sizes to report (replay 1,4,16,64; live 1,4: concurrent clients)",
    )
    g = p.add_argument_group("replay objective")
    g.add_argument(
        "--cost-model",
        choices=("linear", "analytic"),
        default="linear",
        help="linear: cost = 1 + alpha*B*(W-1); analytic: roofline preset",
    )
    g.add_argument(
        "--alpha",
        type=float,
        default=0.01,
        help="linear model: cost of one extra verified token, in plain steps",
    )
    g.add_argument(
        "--cost-preset",
        default="llama3-8b-h100",
        help="analytic model preset (sglang_spec_ext.adaptive.prior.PRESETS)",
    )
    g.add_argument("--limit", type=int, help="only the first N trace records")
    g.add_argument("--set", dest="sets", action="append", help="only these trace sets")
    g.add_argument("--backend", choices=("auto", "native", "python"), default="auto")
    g.add_argument(
        "--adaptive",
        action="store_true",
        help="also replay the adaptive controller on the best setting",
    )
    g.add_argument("--adaptive-steps", type=int, default=2000)
    g.add_argument(
        "--top", type=int, default=5, help="also list the N best candidates at --config-batch-size"
    )
    g = p.add_argument_group("live servers (--model-path)")
    add_launch_arguments(g, "launch args of every server (e.g. '--device cpu ...')")
    g.add_argument("--dataset", type=Path, help="JSONL prompts ('prompt_ids' or 'prompt')")
    g.add_argument("--num-prompts", type=int, default=8, help="requests per batch size")
    g.add_argument("--input-len", type=int, default=256, help="random prompt length")
    g.add_argument("--output-len", type=int, default=128)
    g.add_argument("--vocab-size", type=int)
    g.add_argument("--no-baseline", action="store_true", help="do not measure a plain server")
    g = p.add_argument_group("output")
    g.add_argument(
        "--write-config", type=Path, metavar="FILE", help="write the best setting as a config file"
    )
    g.add_argument(
        "--config-batch-size",
        type=int,
        help="batch size whose best setting is written (default: the first)",
    )
    g.add_argument("--json", type=Path, metavar="OUT", help="write the full report")
    g.add_argument("--no-progress", action="store_true")


def write_config(path: Path, setting: dict[str, Any]) -> dict[str, Any]:
    """Write ``setting`` as a config file and load it back with ``load_config``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(setting, indent=2) + "\n", encoding="utf-8")
    loaded = load_config({CONFIG_FILE_ENV: str(path)})
    return {k: getattr(loaded, k) for k in setting}


def run(args: argparse.Namespace) -> int:
    if args.url:
        print(
            "error: tune cannot change the settings of a running server (SUFFIX reads them at "
            "start); use --model-path M --server-args '...' so tune launches a server per point, "
            "or --trace FILE for offline replay",
            file=sys.stderr,
        )
        return 2
    if not args.trace and not args.model_path:
        print("error: give --trace FILE (replay) or --model-path M (live)", file=sys.stderr)
        return 2
    from sglang_spec_ext.bench.servers import ServerError, signals_as_interrupt

    try:
        with signals_as_interrupt():
            report, rows, table = (run_live if args.model_path else run_replay)(args)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted (launched servers were stopped)", file=sys.stderr)
        return 130
    rc = 0
    chosen = _chosen(rows, args)
    if chosen is not None:
        report["chosen"] = chosen
        if args.write_config:
            try:
                report["config"] = write_config(args.write_config, chosen["setting"])
            except ConfigError as exc:
                print(f"error: the written config does not load: {exc}", file=sys.stderr)
                rc = 1
            else:
                report["config_file"] = str(args.write_config)
                print(
                    f"wrote {args.write_config}; serve with {CONFIG_FILE_ENV}={args.write_config}"
                    f" and --speculative-num-draft-tokens {chosen['width']}",
                    file=sys.stderr,
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report["machine"] = machine_info()
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    print(table)
    return rc


def _chosen(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any] | None:
    if not rows:
        return None
    want = args.config_batch_size
    match = [r for r in rows if r["batch_size"] == want] if want else rows[:1]
    if not match:
        print(f"warning: --config-batch-size {want} was not evaluated; using batch size "
              f"{rows[0]['batch_size']}", file=sys.stderr)  # fmt: skip
        match = rows[:1]
    return match[0]
