"""The host's real plugin loader discovers, runs and filters our entry point."""

from __future__ import annotations

import pytest

from tests.harness.subproc import run_snippet

RESOLVE = """
import logging
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
try:
    algo = SpeculativeAlgorithm.from_string("suffix")
    print("RESOLVED", type(algo).__name__, algo.name)
except ValueError as e:
    print("UNKNOWN", e)
"""


def test_load_plugins_discovers_and_runs_our_entry_point():
    out = run_snippet(RESOLVE)
    assert "RESOLVED ModelFreeSpecAlgo SUFFIX" in out.stdout, out.stdout + out.stderr
    assert "Failed to execute general plugin" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    "allow, expect",
    [
        ("sglang_spec_ext", "RESOLVED ModelFreeSpecAlgo SUFFIX"),
        ("some_other_plugin", "UNKNOWN Unknown speculative algorithm name: suffix"),
        ("some_other_plugin, sglang_spec_ext", "RESOLVED ModelFreeSpecAlgo SUFFIX"),
    ],
)
def test_sglang_plugins_allow_list_is_honoured(allow, expect):
    out = run_snippet(RESOLVE, env={"SGLANG_PLUGINS": allow})
    assert expect in out.stdout, out.stdout + out.stderr


def test_register_is_idempotent_in_process():
    from sglang.srt.speculative.spec_registry import _REGISTRY

    from sglang_spec_ext.plugin import register

    first = register()
    specs = {name: _REGISTRY[name] for name in ("SUFFIX", "HYBRID")}
    assert register() == first == ["SUFFIX", "HYBRID"]
    assert all(_REGISTRY[name] is spec for name, spec in specs.items())


def test_unsupported_host_version_refuses_with_range(monkeypatch):
    from sglang_spec_ext import plugin
    from sglang_spec_ext.sglang.host import version as host

    monkeypatch.setattr(host, "host_version", lambda: "0.5.22")
    with pytest.raises(
        host.UnsupportedHostError, match=r"sglang 0\.5\.22 is not supported.*0\.5\.23"
    ):
        plugin.register()
    monkeypatch.setattr(host, "host_version", lambda: None)
    with pytest.raises(host.UnsupportedHostError, match="SGLang is not installed"):
        host.check_host()


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.5.23", True),
        ("0.5.23.post1", True),
        ("0.5.24", False),
        ("0.4.9", False),
        ("garbage", False),
    ],
)
def test_supported_range(version, ok):
    from sglang_spec_ext.sglang.host.version import is_supported

    assert is_supported(version) is ok
