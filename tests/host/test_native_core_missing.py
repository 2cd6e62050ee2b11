"""A missing native suffix core is loud: the worker warns at start-up, doctor fails.

The native core is made "missing" by hiding the built module from the drafter
(``sglang_spec_ext.suffix.drafter._native = None``), which is what a failed or
skipped build leaves behind.
"""

from __future__ import annotations

import logging
import os

import pytest

from sglang_spec_ext import doctor
from sglang_spec_ext.sglang.workers.suffix_worker import SuffixWorker
from sglang_spec_ext.suffix import drafter as drafter_module


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SGLANG_SPEC_EXT_"):
            monkeypatch.delenv(k)
    return monkeypatch


def _start_worker() -> SuffixWorker:
    w = object.__new__(SuffixWorker)  # __init__ needs the host's runtime context
    w.draft_token_num = 4
    w._init_drafter()
    return w


def _native_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "native suffix-tree core" in r.getMessage()
    ]


def test_auto_backend_without_the_native_core_warns_with_the_fix(clean_env, caplog):
    clean_env.setattr(drafter_module, "_native", None)
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        w = _start_worker()
    assert w.drafter.backend == "python"
    (msg,) = _native_warnings(caplog)
    assert "pip install --no-build-isolation -e ." in msg and "BACKEND=python" in msg


@pytest.mark.skipif(not drafter_module.native_available(), reason="native core not built")
def test_no_warning_when_the_native_core_is_there(clean_env, caplog):
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        assert _start_worker().drafter.backend == "native"
    assert not _native_warnings(caplog)


def test_an_explicit_python_backend_is_not_warned_about(clean_env, caplog):
    clean_env.setattr(drafter_module, "_native", None)
    clean_env.setenv("SGLANG_SPEC_EXT_BACKEND", "python")
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        assert _start_worker().drafter.backend == "python"
    assert not _native_warnings(caplog)


@pytest.mark.parametrize(
    "backend,native,fails",
    [
        (None, False, True),
        ("auto", False, True),
        ("native", False, True),
        ("python", False, False),
        (None, True, False),
    ],
)
def test_doctor_fails_without_the_native_core_unless_python_was_chosen(
    clean_env, capsys, backend, native, fails
):
    if backend is not None:
        clean_env.setenv("SGLANG_SPEC_EXT_BACKEND", backend)
    clean_env.setattr("sglang_spec_ext.suffix.native_available", lambda: native)
    rep = doctor._Report()
    doctor._check_native(rep)
    out = capsys.readouterr().out
    assert rep.failed is fails, out
    if fails:
        assert "FAIL" in out and "pip install --no-build-isolation -e ." in out
