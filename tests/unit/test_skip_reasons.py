"""The skip policy (tests/harness/skip_policy.py): a run with a skip for a reason that
is not a documented optional peer fails; allowed skips pass.

Each case runs pytest in a subprocess on a small generated test file with the policy
loaded as a plugin (``-p tests.harness.skip_policy``), as tests/conftest.py loads it
for the real suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import skip_policy

REPO = Path(__file__).resolve().parents[2]


def _run_pytest(tmp_path: Path, body: str, env: dict[str, str] | None = None):
    test = tmp_path / "test_generated.py"
    test.write_text(textwrap.dedent(body))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SPEC_EXT_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.harness.skip_policy", "--rootdir", str(tmp_path), str(test)],
        cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_for_an_unlisted_reason_fails_the_run(tmp_path):
    out = _run_pytest(
        tmp_path,
        """
        import pytest

        def test_ok():
            pass

        def test_skipped():
            pytest.skip("something not there yet")
        """,
    )
    assert out.returncode == 1, out.stdout
    assert "skips not allowed" in out.stdout and "something not there yet" in out.stdout


def test_a_module_skipped_at_import_fails_the_run(tmp_path):
    out = _run_pytest(tmp_path, 'import pytest\npytest.importorskip("no_such_module_xyz")\n')
    assert out.returncode == 1, out.stdout
    assert "no_such_module_xyz" in out.stdout


def test_documented_optional_peers_may_skip(tmp_path):
    out = _run_pytest(
        tmp_path,
        """
        import pytest

        pytestmark = pytest.mark.skipif(True, reason="arctic-inference not installed")

        def test_peer():
            pass
        """,
    )
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize(
    "env,code",
    [({}, 1), ({"SGLANG_SPEC_EXT_NO_NATIVE": "1"}, 0), ({"SGLANG_SPEC_EXT_BACKEND": "python"}, 0)],
)
def test_a_missing_native_core_may_skip_only_when_chosen(tmp_path, env, code):
    body = 'import pytest\n\ndef test_n():\n    pytest.skip("native backend not built")\n'
    out = _run_pytest(tmp_path, body, env)
    assert out.returncode == code, out.stdout


def test_the_allow_list_names_its_reasons():
    for pattern, why in skip_policy.ALLOWED:
        assert pattern and len(why) > 10
    assert not skip_policy.allowed("could not import 'sglang_spec_ext.suffix'")
    assert not skip_policy.allowed("SmolLM2 GGUF absent: pip install ...")
