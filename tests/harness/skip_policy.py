"""TEST HARNESS: a test run fails when a test is skipped for a reason not allowed here.

A broken install (the native core not built, a data package missing, a host module that
no longer imports) must not turn into quietly skipped tests. Every skip reason of a run
(tests and whole modules) is checked against :data:`ALLOWED`: the documented optional
peers and hardware. Anything else makes the session fail, listing the offending tests.
The hooks are imported by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import re

import pytest

#: (pattern searched in the skip reason, why such a skip is legitimate).
ALLOWED: tuple[tuple[str, str], ...] = (
    (r"arctic-inference not installed", "optional peer: the ArcticInference comparison"),
    (r"\bno GPU\b|needs a GPU|requires a GPU|CUDA is not available", "GPU-only checks"),
    (
        r"real sgl_kernel/torchvision is installed",
        "a GPU host: the CPU placeholders are never used there",
    ),
)
#: Skips for a missing native core, allowed only where the build was skipped on purpose.
NATIVE_MISSING = r"native (suffix )?(core|backend) not built"


def _on_purpose_without_native() -> bool:
    return os.environ.get("SGLANG_SPEC_EXT_NO_NATIVE", "") in ("1", "true", "yes") or (
        os.environ.get("SGLANG_SPEC_EXT_BACKEND") == "python"
    )


def allowed(reason: str) -> bool:
    """Whether a skip with this reason is legitimate in this environment."""
    if re.search(NATIVE_MISSING, reason):
        return _on_purpose_without_native()
    return any(re.search(pattern, reason) for pattern, _ in ALLOWED)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text.removeprefix("Skipped: ")


_BAD: list[tuple[str, str]] = []


def _check(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not getattr(report, "wasxfail", None):
        reason = _reason(report)
        if not allowed(reason):
            _BAD.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _check(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _check(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BAD and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if not _BAD:
        return
    terminalreporter.section("skips not allowed (tests/harness/skip_policy.py)", red=True)
    for nodeid, reason in _BAD:
        terminalreporter.line(f"{nodeid}: {reason}", red=True)
    terminalreporter.line(
        "A skip must be for a documented optional peer or hardware (see ALLOWED); a broken "
        "install must fail. Fix the environment (scripts/setup_env.sh) or the test.",
        red=True,
    )
