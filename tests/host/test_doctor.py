"""``sglang-spec-ext doctor``: exit 0 in a working environment, a clear non-zero
report with the fix when the host is missing, unsupported or misconfigured."""

from __future__ import annotations

import json

from tests.harness.subproc import run_snippet

DOCTOR = (
    "import sys\nfrom sglang_spec_ext.cli import main\nsys.exit(main(['doctor'] + sys.argv[1:]))\n"
)


def test_doctor_passes_in_the_test_environment(tmp_path):
    out_json = tmp_path / "doctor.json"
    code = DOCTOR.replace("sys.argv[1:]", f"['--json', {str(out_json)!r}]")
    res = run_snippet(code)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sglang 0.5.23 (supported" in res.stdout
    assert "discovered and run by the host's load_plugins()" in res.stdout
    assert "--speculative-algorithm SUFFIX resolves in the host" in res.stdout
    # a newcomer's first command: no traceback, no host log noise, one screen
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "Failed to apply hooks" not in out, out[-3000:]
    assert len(out.splitlines()) < 40, out
    data = json.loads(out_json.read_text())
    assert data["ok"] is True and data["registration"]["algorithms"] == {
        "SUFFIX": True,
        "HYBRID": True,
    }


def test_doctor_reports_a_missing_host_with_the_fix():
    # Hide the host package from this interpreter: a meta-path finder that refuses it,
    # and a metadata lookup that finds no distribution.
    code = (
        """
import importlib.abc, importlib.metadata, sys
class _NoSGLang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoSGLang())
_real = importlib.metadata.version
def _version(name):
    if name == "sglang":
        raise importlib.metadata.PackageNotFoundError(name)
    return _real(name)
importlib.metadata.version = _version
"""
        + DOCTOR
    )
    res = run_snippet(code)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[FAIL] SGLang is not installed" in res.stdout
    assert "fix: pip install 'sglang>=0.5.23,<0.5.24'" in res.stdout
    assert "doctor: problems found" in res.stdout


def test_doctor_reports_an_unsupported_host_version(monkeypatch, capsys):
    from sglang_spec_ext import doctor
    from sglang_spec_ext.sglang.host import version as host

    monkeypatch.setattr(host, "host_version", lambda: "0.6.1")
    rc = doctor.run(doctor_args())
    out = capsys.readouterr().out
    assert rc == 1
    assert "sglang 0.6.1 is not supported" in out and "fix: install sglang>=0.5.23,<0.5.24" in out


def test_doctor_reports_a_bad_config_value(monkeypatch, capsys):
    from sglang_spec_ext import doctor

    monkeypatch.setenv("SGLANG_SPEC_EXT_MAX_DEPTH", "-3")
    rc = doctor.run(doctor_args())
    out = capsys.readouterr().out
    assert rc == 1 and "SGLANG_SPEC_EXT_MAX_DEPTH='-3' is invalid" in out


def test_doctor_reports_filtered_plugin():
    res = run_snippet(DOCTOR, env={"SGLANG_PLUGINS": "someone_else"})
    assert res.returncode == 1
    assert "SGLANG_PLUGINS is set and does not list sglang_spec_ext" in res.stdout


def doctor_args():
    import argparse

    from sglang_spec_ext import doctor

    p = argparse.ArgumentParser()
    doctor.add_arguments(p)
    return p.parse_args([])
