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

from sglang_spec_ext.bench.report import format_table
from sglang_spec_ext.config import CONFIG_FILE_ENV, ConfigError, load_config
from sglang_spec_ext.machine import machine_info
from sglang_spec_ext.tune.search import SearchSpace

REPLAY_GRID = {"widths": "2,4,8,16,32", "max_depth": "24,64", "spec_factor": "0.5,1,2",
               "spec_offset": "0,2", "min_token_prob": "0.05,0.1,0.2", "use_tree": "true"}  # fmt: skip
LIVE_GRID = {"widths": "4,8", "max_depth": "64", "spec_factor": "1", "spec_offset": "0",
             "min_token_prob": "0.1", "use_tree": "true"}  # fmt: skip


def _bools(text: str) -> list[bool]:
    m = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return [m[p.strip().lower()] for p in text.split(",") if p.strip()]
    except KeyError:
        raise ValueError(f"expected booleans, got {text!r}") from None


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
    for name in ("max_depth", "spec_factor", "spec_offset", "min_token_prob", "use_tree"):
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
        help="analytic model preset (sglang_spec_ext.adaptive.cost.PRESETS)",
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
    g.add_argument(
        "--server-args", default="", help="launch args of every server (e.g. '--device cpu ...')"
    )
    g.add_argument("--server-env", action="append", default=[], metavar="KEY=VAL")
    g.add_argument("--pythonpath", action="append", default=[], metavar="DIR")
    g.add_argument("--server-timeout", type=float, default=600.0)
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


def search_space(args: argparse.Namespace, grid: dict[str, str]) -> SearchSpace:
    def val(name: str) -> str:
        v = getattr(args, name)
        return grid[name] if v is None else v

    def floats(name: str) -> list[float]:
        return [float(x) for x in val(name).split(",") if x.strip()]

    widths = [int(x) for x in val("widths").split(",") if x.strip()]
    if not widths or min(widths) < 2:
        raise ValueError("--widths: verify widths must be >= 2")
    return SearchSpace(
        widths=sorted(set(widths)),
        max_depth=[int(x) for x in val("max_depth").split(",") if x.strip()],
        spec_factor=floats("spec_factor"), spec_offset=floats("spec_offset"),
        min_token_prob=floats("min_token_prob"), use_tree=_bools(val("use_tree")),
    )  # fmt: skip


def write_config(path: Path, setting: dict[str, Any]) -> dict[str, Any]:
    """Write ``setting`` as a config file and load it back with ``load_config``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(setting, indent=2) + "\n", encoding="utf-8")
    loaded = load_config({CONFIG_FILE_ENV: str(path)})
    return {k: getattr(loaded, k) for k in setting}


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _setting_cells(s: dict[str, Any]) -> list[str]:
    return [str(s["max_depth"]), f"{s['spec_factor']:g}", f"{s['spec_offset']:g}",
            f"{s['min_token_prob']:g}", "tree" if s["use_tree"] else "chain"]  # fmt: skip


SETTING_HEADERS = ["max_depth", "factor", "offset", "min_prob", "shape"]


def replay_table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "batch",
        "width",
        *SETTING_HEADERS,
        "accept",
        "cost",
        "goodput",
        "default",
        "verdict",
    ]
    body = [
        [
            str(r["batch_size"]),
            str(r["width"]),
            *_setting_cells(r["setting"]),
            _fmt(r["accept_length"]),
            _fmt(r["cost"]),
            f"{r['goodput']:.2f}x",
            "-" if r["default_goodput"] is None else f"{r['default_goodput']:.2f}x",
            "speculate" if r["speculate"] else "plain decoding wins",
        ]  # fmt: skip
        for r in rows
    ]
    return format_table(headers, body, left=1)


def live_table(rows: list[dict[str, Any]]) -> str:
    headers = ["batch", "width", *SETTING_HEADERS, "accept", "tok/s", "plain tok/s", "speedup"]
    body = [
        [
            str(r["batch_size"]),
            str(r["width"]),
            *_setting_cells(r["setting"]),
            _fmt(r["accept_length"]),
            _fmt(r["output_throughput"], ".1f"),
            _fmt(r["plain_throughput"], ".1f"),
            _fmt(r["speedup"]),
        ]  # fmt: skip
        for r in rows
    ]
    return format_table(headers, body, left=1)


def run(args: argparse.Namespace) -> int:
    from sglang_spec_ext.tune.modes import run_live, run_replay

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
    from sglang_spec_ext.bench.servers import ServerError, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
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
