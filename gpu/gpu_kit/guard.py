"""Stages under a time guard: one budget for the run and a cap per stage. A stage that
fails is recorded (stage name, error, traceback tail) and the next one runs; a stage that
reaches its cap is cut there (its partial figures stay) and the next one runs; when the
run's budget is spent, the stage in flight is cut and the rest are recorded as skipped.

Results are written as they arrive (:class:`gpu_kit.results.Results`), so a call that is
killed still returns what it measured."""

from __future__ import annotations

import math
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_kit.results import Results


class TimeUp(BaseException):
    """The run's budget is spent, or the run was told to stop (SIGTERM). A BaseException:
    stages cannot swallow it."""


class StageCapped(BaseException):
    """The stage in flight reached its own cap (the run goes on with the next stage)."""


class Budget:
    """Seconds left of the run. ``arm(stage_end)`` makes SIGALRM raise, at the earlier of
    the run's end (:class:`TimeUp`) and ``stage_end`` (:class:`StageCapped`); both are
    seconds since the start. SIGTERM raises :class:`TimeUp` (the outer ``timeout`` sends
    it), so the wrap-up still stops the servers and writes the logs."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self.seconds = seconds
        self._cause: type[BaseException] = TimeUp
        self._why = ""
        self.terminated = False  # SIGTERM arrived: the wrap-up keeps to the essentials

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def _fire(self, signum: int, frame: object) -> None:
        raise self._cause(self._why)

    def _term(self, signum: int, frame: object) -> None:
        self.terminated = True
        raise TimeUp("terminated (SIGTERM): the outer timeout or the device tool stopped the run")

    def arm(self, stage_end: float | None = None, stage: str = "") -> None:
        end = self.seconds
        self._cause, self._why = TimeUp, f"time guard: {self.seconds:.0f} s budget spent"
        if stage_end is not None and stage_end < self.seconds:
            end = stage_end
            self._cause = StageCapped
            self._why = f"stage cap: {stage} cut after {stage_end - self.elapsed():.0f} s"
        signal.signal(signal.SIGALRM, self._fire)
        signal.signal(signal.SIGTERM, self._term)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, end - self.elapsed()))

    @staticmethod
    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


def tail(text: str, lines: int = 30, chars: int = 4000) -> str:
    return "\n".join(text.splitlines()[-lines:])[-chars:]


@dataclass
class Stage:
    """One stage: ``fn(ctx, record)`` fills ``record`` (a dict) as it goes.

    ``min_seconds``: not started with less budget left (recorded as skipped);
    ``cap_seconds``: cut after this long (None: only the run's budget bounds it);
    ``needs``: stages that must have passed first (else skipped, naming them)."""

    name: str
    fn: Callable[[Any, dict[str, Any]], None]
    min_seconds: float = 30.0
    needs: tuple[str, ...] = ()
    doc: str = ""
    cap_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _skip(results: Results, status: dict[str, str], name: str, reason: str) -> None:
    status[name] = "skipped"
    results.update(name, status="skipped", reason=reason)


def run_stages(
    stages: list[Stage],
    ctx: Any,
    results: Results,
    budget: Budget,
    cleanup: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = print,
) -> dict[str, str]:
    """Runs each stage in order under the guard; returns stage -> status (passed, failed,
    capped, time-up, skipped). A failure is recorded (error, traceback tail, what ``ctx``
    adds through ``failure_details``) and the next stage runs; so does a stage cut at its
    cap; :class:`TimeUp` stops the run after recording where it struck. ``cleanup`` runs
    after every stage that started (under the run's budget only)."""
    status: dict[str, str] = {}
    budget.arm()
    try:
        for stage in stages:
            record = results.stage(stage.name)
            record["doc"] = stage.doc
            missing = [n for n in stage.needs if status.get(n) != "passed"]
            if missing:
                _skip(results, status, stage.name, f"needs {missing}")
                log(f"[run] {stage.name}: skipped (needs {missing})")
                continue
            if budget.left() < stage.min_seconds:
                _skip(results, status, stage.name, f"time: {budget.left():.0f} s left, "
                      f"stage needs >= {stage.min_seconds:.0f} s")  # fmt: skip
                log(f"[run] {stage.name}: skipped (time)")
                continue
            t0 = budget.elapsed()
            cap = stage.cap_seconds if stage.cap_seconds is not None else math.inf
            results.current = stage.name
            results.update(stage.name, status="running", started_s=round(t0, 1),
                           cap_s=None if math.isinf(cap) else round(min(cap, budget.left()), 1))  # fmt: skip
            log(f"[run] {stage.name}: start at {t0:.0f} s ({budget.left():.0f} s left, "
                f"cap {cap if math.isinf(cap) else round(min(cap, budget.left()))} s)")  # fmt: skip
            try:
                budget.arm(t0 + cap, stage.name)
                stage.fn(ctx, record)
                status[stage.name] = "passed"
            except StageCapped as exc:
                status[stage.name] = "capped"
                record.update(status="capped", error=str(exc))
            except TimeUp as exc:
                status[stage.name] = "time-up"
                record.update(status="time-up", error=str(exc))
                raise
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                status[stage.name] = "failed"
                record.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                              traceback=tail(traceback.format_exc(), 40))  # fmt: skip
                details = getattr(ctx, "failure_details", None)
                if details is not None:
                    record["details"] = details()
                log(f"[run] {stage.name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                if budget.left() > 0:
                    budget.arm()  # the stage's cap no longer applies; the run's budget does
                else:
                    budget.disarm()
                if record.get("status") == "running":
                    record["status"] = "passed"
                record["seconds"] = round(budget.elapsed() - t0, 1)
                results.current = None
                try:
                    cleanup()
                except Exception as exc:  # noqa: BLE001
                    record["cleanup_error"] = f"{type(exc).__name__}: {exc}"
                results.flush()
                log(f"[run] {stage.name}: {record['status']} in {record['seconds']} s")
    except TimeUp:
        for stage in stages:
            if stage.name not in status:
                _skip(results, status, stage.name, "time guard fired")
    finally:
        budget.disarm()
        results.data["meta"]["status"] = status
        results.data["meta"]["elapsed_s"] = round(budget.elapsed(), 1)
        results.flush()
    return status
