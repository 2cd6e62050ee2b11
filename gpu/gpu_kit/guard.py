"""Stages under one time guard, each failure recorded with its stage name and error tail,
results written as they arrive (one JSON file, rewritten after every change)."""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class TimeUp(BaseException):
    """The global time guard fired (a BaseException: stages cannot swallow it)."""


class Budget:
    """Seconds left of the run; ``arm`` makes SIGALRM raise :class:`TimeUp` at the end."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self.seconds = seconds

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def arm(self) -> None:
        def _fire(signum: int, frame: object) -> None:
            raise TimeUp(f"time guard: {self.seconds:.0f} s budget spent")

        signal.signal(signal.SIGALRM, _fire)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, self.left()))

    @staticmethod
    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


class Results:
    """``results.json`` in the output folder, rewritten atomically after every update."""

    def __init__(self, out: Path, meta: dict[str, Any] | None = None) -> None:
        self.out = out
        self.path = out / "results.json"
        self.data: dict[str, Any] = {"meta": meta or {}, "stages": {}, "order": []}
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

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def tail(text: str, lines: int = 30, chars: int = 4000) -> str:
    return "\n".join(text.splitlines()[-lines:])[-chars:]


@dataclass
class Stage:
    """One stage: ``fn(ctx, record)`` fills ``record`` (a dict) as it goes.

    ``min_seconds``: not started with less budget left (recorded as skipped);
    ``needs``: stages that must have passed first (else skipped, naming them)."""

    name: str
    fn: Callable[[Any, dict[str, Any]], None]
    min_seconds: float = 30.0
    needs: tuple[str, ...] = ()
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def run_stages(
    stages: list[Stage],
    ctx: Any,
    results: Results,
    budget: Budget,
    cleanup: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = print,
) -> dict[str, str]:
    """Runs each stage in order under the guard; returns stage -> status (passed, failed,
    skipped, time-up). A failure is recorded (error, traceback tail, what ``ctx``
    adds through ``failure_details``) and the next stage runs; :class:`TimeUp` stops the
    run after recording where it struck. ``cleanup`` runs after every stage."""
    status: dict[str, str] = {}
    budget.arm()
    try:
        for stage in stages:
            record = results.stage(stage.name)
            record["doc"] = stage.doc
            missing = [n for n in stage.needs if status.get(n) != "passed"]
            if missing:
                status[stage.name] = "skipped"
                results.update(stage.name, status="skipped", reason=f"needs {missing}")
                log(f"[run] {stage.name}: skipped (needs {missing})")
                continue
            if budget.left() < stage.min_seconds:
                status[stage.name] = "skipped"
                results.update(
                    stage.name,
                    status="skipped",
                    reason=f"time: {budget.left():.0f} s left, stage needs "
                    f">= {stage.min_seconds:.0f} s",
                )
                log(f"[run] {stage.name}: skipped (time)")
                continue
            t0 = budget.elapsed()
            results.update(stage.name, status="running", started_s=round(t0, 1))
            log(f"[run] {stage.name}: start at {t0:.0f} s ({budget.left():.0f} s left)")
            try:
                stage.fn(ctx, record)
                status[stage.name] = "passed"
            except TimeUp as exc:
                status[stage.name] = "time-up"
                record.update(status="time-up", error=str(exc))
                raise
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                status[stage.name] = "failed"
                record.update(
                    status="failed",
                    error=f"{type(exc).__name__}: {exc}"[:2000],
                    traceback=tail(traceback.format_exc(), 40),
                )
                details = getattr(ctx, "failure_details", None)
                if details is not None:
                    record["details"] = details()
                log(f"[run] {stage.name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                if record.get("status") == "running":
                    record["status"] = "passed"
                record["seconds"] = round(budget.elapsed() - t0, 1)
                try:
                    cleanup()
                except Exception as exc:  # noqa: BLE001
                    record["cleanup_error"] = f"{type(exc).__name__}: {exc}"
                results.flush()
                log(f"[run] {stage.name}: {record['status']} in {record['seconds']} s")
    except TimeUp:
        for stage in stages:
            if stage.name not in status:
                status[stage.name] = "skipped"
                results.update(stage.name, status="skipped", reason="time guard fired")
    finally:
        budget.disarm()
        results.data["meta"]["status"] = status
        results.data["meta"]["elapsed_s"] = round(budget.elapsed(), 1)
        results.flush()
    return status
