"""What ``doctor`` asks of the host: discovery and registration through the
host's real plugin loader. Host modules are imported inside the functions."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

ENTRY_POINT_NAME = "sglang_spec_ext"


@dataclass
class RegistrationReport:
    discovered: bool = False  # our entry point is in the host's plugin group
    allowed: bool = True  # not filtered out by SGLANG_PLUGINS
    loaded: bool = False  # load_plugins() ran our register() without error
    algorithms: dict[str, bool] = field(default_factory=dict)  # name -> resolves
    errors: list[str] = field(default_factory=list)
    hooks_waiting: int = 0  # runtime hooks whose host module this process cannot import
    modules_waiting: list[str] = field(default_factory=list)
    waiting_reason: str = ""  # why the first of them would not import here


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            msg += f": {record.exc_info[1]}"
        self.messages.append(msg)


def probe_registration(names: tuple[str, ...]) -> RegistrationReport:
    """Run the host's real ``load_plugins()`` and check that ``names`` resolve."""
    from importlib.metadata import entry_points

    from sglang.srt.environ import envs
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins

    report = RegistrationReport()
    report.discovered = any(
        ep.name == ENTRY_POINT_NAME for ep in entry_points(group=GENERAL_PLUGINS_GROUP)
    )
    allowed = envs.SGLANG_PLUGINS.get()
    if allowed:
        report.allowed = ENTRY_POINT_NAME in {x.strip() for x in allowed.split(",")}

    capture = _Capture()
    loggers = [logging.getLogger("sglang.srt.plugins"), logging.getLogger("sglang_spec_ext")]
    for lg in loggers:
        lg.addHandler(capture)
    try:
        load_plugins()
    finally:
        for lg in loggers:
            lg.removeHandler(capture)
    report.errors = capture.messages
    from sglang_spec_ext.sglang.host.hooks import pending_targets, unimportable_reason

    waiting = pending_targets()
    report.hooks_waiting = sum(len(t) for t in waiting.values())
    report.modules_waiting = sorted(waiting)
    report.waiting_reason = unimportable_reason(min(waiting)) if waiting else ""
    report.loaded = (
        report.discovered
        and report.allowed
        and not any(ENTRY_POINT_NAME in m or "sglang-spec-ext" in m for m in capture.messages)
    )

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for name in names:
        try:
            SpeculativeAlgorithm.from_string(name)
            report.algorithms[name] = True
        except ValueError:
            report.algorithms[name] = False
    return report
