"""The hook mechanism resolves every target before the host's ``HookRegistry`` sees it
(``sglang/host/hooks.py``): no traceback in a process that cannot import a target's module
(doctor, the tools), the hook applied the moment that module is imported, and one warning
line naming the target and the feature when the host lacks the attribute.

Each scenario runs in a fresh interpreter: the host's ``HookRegistry`` is process-wide."""

from __future__ import annotations

from tests.harness.subproc import run_snippet, snippet_result

# A package with a module that cannot be imported until a flag is set (as the host's
# scheduler cannot without torchvision outside a server on this machine).
_SETUP = """
import json, logging, os, sys, tempfile
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang_spec_ext.sglang.host.hooks import pending_targets, register_hooks_once

root = tempfile.mkdtemp()
os.makedirs(os.path.join(root, "spec_ext_probe_pkg"))
open(os.path.join(root, "spec_ext_probe_pkg", "__init__.py"), "w").close()
with open(os.path.join(root, "spec_ext_probe_pkg", "worker.py"), "w") as f:
    f.write(
        "import os\\n"
        "if not os.environ.get('PROBE_OK'):\\n"
        "    import spec_ext_probe_missing_dependency\\n"
        "class Worker:\\n"
        "    def step(self):\\n"
        "        return 1\\n"
    )
sys.path.insert(0, root)
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.name, record.levelname, record.getMessage(), bool(record.exc_info)))
for name in ("sglang_spec_ext", "sglang.srt.plugins.hook_registry"):
    logging.getLogger(name).addHandler(Keep())
    logging.getLogger(name).setLevel(logging.DEBUG)

def plus_one(result, *args, **kwargs):
    return result + 1
"""


def test_a_target_whose_module_cannot_import_waits_and_is_applied_on_import():
    res = snippet_result(
        _SETUP
        + """
target = "spec_ext_probe_pkg.worker.Worker.step"
res = {"registered": register_hooks_once([(target, plus_one, HookType.AFTER)])}
res["pending"] = pending_targets()
res["in_host_registry"] = target in HookRegistry._hooks
res["again"] = register_hooks_once([(target, plus_one, HookType.AFTER)])
os.environ["PROBE_OK"] = "1"
import spec_ext_probe_pkg.worker as w
res["step"] = w.Worker().step()
res["pending_after"] = pending_targets()
res["patched"] = target in HookRegistry._patched
res["tracebacks"] = sum(1 for r in records if r[3])
res["warnings"] = [r[2] for r in records if r[1] in ("WARNING", "ERROR")]
print("RESULT " + json.dumps(res))
"""
    )
    assert res["registered"] is True
    assert res["pending"] == {
        "spec_ext_probe_pkg.worker": ["spec_ext_probe_pkg.worker.Worker.step"]
    }
    assert res["in_host_registry"] is False  # the host never tried (and never logged)
    assert res["again"] is False  # idempotent while it waits
    assert res["step"] == 2  # applied when the module was imported
    assert res["pending_after"] == {} and res["patched"] is True
    assert res["tracebacks"] == 0 and res["warnings"] == []


def test_a_missing_attribute_is_one_warning_naming_target_and_feature():
    res = snippet_result(
        _SETUP
        + """
os.environ["PROBE_OK"] = "1"
target = "spec_ext_probe_pkg.worker.Worker.moved_away"
res = {"registered": register_hooks_once([(target, plus_one, HookType.AFTER)], "probe feature")}
res["tracebacks"] = sum(1 for r in records if r[3])
res["warnings"] = [r[2] for r in records if r[1] in ("WARNING", "ERROR")]
res["in_host_registry"] = target in HookRegistry._hooks
print("RESULT " + json.dumps(res))
"""
    )
    assert res["registered"] is False and res["in_host_registry"] is False
    assert res["tracebacks"] == 0
    (warning,) = res["warnings"]
    assert "\n" not in warning
    assert "spec_ext_probe_pkg.worker.Worker.moved_away" in warning
    assert "no attribute 'moved_away'" in warning and "probe feature is off" in warning


def test_an_importable_target_is_applied_at_once_as_before():
    res = snippet_result(
        _SETUP
        + """
os.environ["PROBE_OK"] = "1"
import spec_ext_probe_pkg.worker as w
target = "spec_ext_probe_pkg.worker.Worker.step"
res = {"registered": register_hooks_once([(target, plus_one, HookType.AFTER)])}
res["step"] = w.Worker().step()
res["pending"] = pending_targets()
print("RESULT " + json.dumps(res))
"""
    )
    assert res == {"registered": True, "step": 2, "pending": {}}


def test_plugin_loading_outside_a_server_logs_no_traceback():
    """The host's real ``load_plugins()`` in a plain interpreter (what doctor, bench, tune
    and simulate do when they load the plugin): our hooks wait, nothing is logged with a
    traceback, and the algorithms still resolve."""
    res = run_snippet(
        """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
print("SUFFIX ok", SpeculativeAlgorithm.from_string("SUFFIX") is not None)
"""
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "SUFFIX ok True" in out
    assert "Traceback" not in out and "Failed to apply hooks" not in out, out[-3000:]


def test_a_hook_on_import_never_imports_its_module():
    """``register_hooks_on_import``: an importable module is left unimported (Mooncake's
    PD module, imported at plugin load, turned the host's multi-process metrics off on
    every server) and hooked the moment something imports it."""
    res = snippet_result(
        _SETUP
        + """
from sglang_spec_ext.sglang.host.hooks import register_hooks_on_import
os.environ["PROBE_OK"] = "1"  # importable now: still not imported by the call
target = "spec_ext_probe_pkg.worker.Worker.step"
res = {"waits": register_hooks_on_import("spec_ext_probe_pkg.worker",
                                         [(target, plus_one, HookType.AFTER)])}
res["imported_by_the_call"] = "spec_ext_probe_pkg.worker" in sys.modules
import spec_ext_probe_pkg.worker as w
res["step"] = w.Worker().step()
res["pending_after"] = pending_targets()
print("RESULT " + json.dumps(res))
"""
    )
    assert res == {"waits": True, "imported_by_the_call": False, "step": 2,
                   "pending_after": {}}  # fmt: skip
