"""What ``tune`` searches and how it reports: the default grids, the search space
from the command line, and the result tables (shared by ``tune.cli`` and
``tune.modes``, which import this module and never each other)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang_spec_ext.bench.report import format_table
from sglang_spec_ext.tune.search import SearchSpace

REPLAY_GRID = {"widths": "2,4,8,16,32", "max_depth": "24,64", "spec_factor": "0.5,1,2",
               "spec_offset": "0,2", "min_token_prob": "0.05,0.1,0.2", "use_tree": "true",
               "global_prompt_cap": "64"}  # fmt: skip
LIVE_GRID = {"widths": "4,8", "max_depth": "64", "spec_factor": "1", "spec_offset": "0",
             "min_token_prob": "0.1", "use_tree": "true", "global_prompt_cap": "64"}  # fmt: skip


def _bools(text: str) -> list[bool]:
    m = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return [m[p.strip().lower()] for p in text.split(",") if p.strip()]
    except KeyError:
        raise ValueError(f"expected booleans, got {text!r}") from None


def search_space(args: argparse.Namespace, grid: dict[str, str]) -> SearchSpace:
    def val(name: str) -> str:
        v = getattr(args, name)
        return grid[name] if v is None else v

    def floats(name: str) -> list[float]:
        return [float(x) for x in val(name).split(",") if x.strip()]

    def ints(name: str) -> list[int]:
        return [int(x) for x in val(name).split(",") if x.strip()]

    widths = ints("widths")
    if not widths or min(widths) < 2:
        raise ValueError("--widths: verify widths must be >= 2")
    return SearchSpace(
        widths=sorted(set(widths)),
        max_depth=ints("max_depth"),
        spec_factor=floats("spec_factor"), spec_offset=floats("spec_offset"),
        min_token_prob=floats("min_token_prob"), use_tree=_bools(val("use_tree")),
        global_prompt_cap=ints("global_prompt_cap"),
    )  # fmt: skip


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _setting_cells(s: dict[str, Any]) -> list[str]:
    return [str(s["max_depth"]), f"{s['spec_factor']:g}", f"{s['spec_offset']:g}",
            f"{s['min_token_prob']:g}", "tree" if s["use_tree"] else "chain",
            str(s["global_prompt_cap"])]  # fmt: skip


SETTING_HEADERS = ["max_depth", "factor", "offset", "min_prob", "shape", "prompt_cap"]


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
