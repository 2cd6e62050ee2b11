"""Build-time variables (setup.py) and the run-time config agree.

``load_config`` rejects unknown ``SGLANG_SPEC_EXT_*`` variables, so a variable that
setup.py documents for the build (``SGLANG_SPEC_EXT_NO_NATIVE``) must be known to the
config as build-time only, or every server started in that shell refuses to start.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_spec_ext.config import BUILD_TIME_ENV, ConfigError, load_config

SETUP_PY = Path(__file__).resolve().parents[2] / "setup.py"


def test_every_variable_setup_py_reads_is_a_known_build_time_variable():
    read = set(re.findall(r"SGLANG_SPEC_EXT_[A-Z0-9_]+", SETUP_PY.read_text()))
    assert "SGLANG_SPEC_EXT_NO_NATIVE" in read
    # Run-time variables named in setup.py's text (the backend choice) are config fields.
    runtime = {"SGLANG_SPEC_EXT_BACKEND"}
    assert read - runtime <= BUILD_TIME_ENV, sorted(read - runtime - BUILD_TIME_ENV)


@pytest.mark.parametrize("value", ["1", "0", "yes"])
def test_the_build_time_variable_does_not_stop_a_server(value):
    config = load_config({"SGLANG_SPEC_EXT_NO_NATIVE": value})
    assert config == load_config({})  # ignored: it has no run-time meaning


def test_unknown_variables_are_still_rejected():
    with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_NO_NATIV\\b"):
        load_config({"SGLANG_SPEC_EXT_NO_NATIV": "1"})
