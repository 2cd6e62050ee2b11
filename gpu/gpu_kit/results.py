"""What a run has measured, on disk as it arrives, so that a call killed at any moment
still returns it:

* ``results.json``: every stage's record, rewritten after each change through a temporary
  file and an atomic rename (a reader never sees half a file; a kill between the two
  leaves the previous complete version);
* ``cells.jsonl``: one line per finished cell (a server's parity row, a curve point, a
  host-time table), appended and fsynced at once; a kill can cut at most its last line.

:func:`load_partial` reads either back (``results.json`` first, else the cells)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

RESULTS = "results.json"
CELLS = "cells.jsonl"


class Results:
    """``results.json`` and ``cells.jsonl`` in the output folder."""

    def __init__(self, out: Path, meta: dict[str, Any] | None = None) -> None:
        self.out = out
        self.path = out / RESULTS
        self.cells_path = out / CELLS
        self.data: dict[str, Any] = {"meta": meta or {}, "stages": {}, "order": []}
        self.current: str | None = None  # the stage in flight (set by the guard)
        self.t0 = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        self.flush()

    def stage(self, name: str) -> dict[str, Any]:
        if name not in self.data["stages"]:
            self.data["stages"][name] = {}
            self.data["order"].append(name)
        return self.data["stages"][name]

    def update(self, name: str, **values: Any) -> None:
        self.stage(name).update(values)
        self.flush()

    def cell(self, key: str, value: Any, stage: str | None = None) -> None:
        """One finished cell of ``stage`` (default: the stage in flight): a line in
        ``cells.jsonl`` at once, and ``results.json`` rewritten."""
        line = json.dumps({"t": round(time.monotonic() - self.t0, 1),
                           "stage": stage or self.current or "run", "cell": key,
                           "value": value}, default=str)  # fmt: skip
        with open(self.cells_path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(self.data, indent=1, default=str))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def read_cells(out: Path) -> list[dict[str, Any]]:
    """The whole lines of ``cells.jsonl`` (a line cut by a kill is dropped)."""
    path = out / CELLS
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def load_partial(out: Path) -> dict[str, Any]:
    """A run's results from its output folder, whatever state the run ended in:
    ``results.json`` when it parses, else a skeleton rebuilt from ``cells.jsonl``; the
    cells are attached either way (``cells``)."""
    cells = read_cells(out)
    try:
        data = json.loads((out / RESULTS).read_text())
    except (OSError, ValueError):
        data = {"meta": {"rebuilt_from": CELLS}, "stages": {}, "order": []}
        for row in cells:
            if row["stage"] not in data["stages"]:
                data["stages"][row["stage"]] = {"status": "unknown (run killed)"}
                data["order"].append(row["stage"])
    data["cells"] = cells
    return data
