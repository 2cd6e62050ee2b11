"""The results document (``results.json``) and the comparison table.

The document is rewritten (atomically) after every measured cell, so an interrupted
run leaves everything measured so far on disk. Shape::

    {"tool", "label", "status": "running"|"complete"|"interrupted"|"failed",
     "machine": machine_info(), "versions", "parameters", "endpoints",
     "cells": [{"scenario", "input_len", "output_len", "load": {"kind", "value"},
                "load_label", "baseline": {...metrics}, "speculative": {...},
                "speedup"}],
     "parity": {...} (with --check-parity)}
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_spec_ext.bench.metrics import speedup
from sglang_spec_ext.bench.workload import Load, Scenario
from sglang_spec_ext.machine import machine_info

ROLES = ("baseline", "speculative")


def new_document(parameters: dict[str, Any], label: str | None = None) -> dict[str, Any]:
    info = machine_info()
    return {
        "tool": "sglang-spec-ext bench",
        "label": label,
        "status": "running",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "versions": info["versions"],
        "parameters": parameters,
        "endpoints": {},
        "cells": [],
    }


def record_cell(
    doc: dict[str, Any], scenario: Scenario, load: Load, role: str, metrics: dict[str, Any]
) -> dict[str, Any]:
    """Store ``metrics`` of ``role`` for the cell (created on first use)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    for cell in doc["cells"]:
        if cell["scenario"] == scenario.name and cell["load_label"] == load.label:
            break
    else:
        cell = {
            "scenario": scenario.name,
            "input_len": scenario.input_len,
            "output_len": scenario.output_len,
            "load": load.to_json(),
            "load_label": load.label,
        }
        doc["cells"].append(cell)
    cell[role] = metrics
    cell["speedup"] = speedup(cell.get("baseline"), cell.get("speculative"))
    return cell


def write_json(doc: dict[str, Any], path: Path | str) -> Path:
    """Write ``doc`` atomically (a reader never sees a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pair(cell: dict[str, Any], group: str, stat: str, fmt: str) -> str:
    vals = [(cell.get(r) or {}).get(group, {}).get(stat) for r in ROLES]
    return "/".join(_num(v, fmt) for v in vals)


TABLE_HEADERS = (
    "scenario", "load", "in/out", "base tok/s", "spec tok/s", "speedup", "accept",
    "e2e p50 s b/s", "e2e p99 s b/s", "TTFT p50 ms b/s", "ITL p50 ms b/s",
)  # fmt: skip


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in doc["cells"]:
        b, s = c.get("baseline") or {}, c.get("speculative") or {}
        rows.append(
            [
                c["scenario"],
                c["load_label"],
                f"{c['input_len']}/{c['output_len']}",
                _num(b.get("output_throughput"), ".1f"),
                _num(s.get("output_throughput"), ".1f"),
                "-" if c.get("speedup") is None else f"{c['speedup']:.2f}x",
                _num(s.get("accept_length"), ".2f"),
                _pair(c, "e2e_latency_s", "median", ".2f"),
                _pair(c, "e2e_latency_s", "p99", ".2f"),
                _pair(c, "ttft_ms", "median", ".0f"),
                _pair(c, "itl_ms", "median", ".1f"),
            ]
        )
    return rows


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 2) -> str:
    """Aligned text table: the first ``left`` columns left-aligned, the rest right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        cells = [
            v.ljust(w) if i < left else v.rjust(w)
            for i, (v, w) in enumerate(zip(vals, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def render_table(doc: dict[str, Any]) -> str:
    """The comparison table (output tok/s; b/s = baseline/speculative)."""
    title = f"bench ({doc.get('status')})"
    if doc.get("label"):
        title += f": {doc['label']}"
    note = (
        "tok/s = output tokens/s; speedup = spec/base output tok/s; accept = tokens per "
        "verify step (spec); b/s = baseline/speculative"
    )
    return "\n".join([title, format_table(TABLE_HEADERS, table_rows(doc)), note])
