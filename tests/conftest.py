"""Test-wide set-up.

Installs the product's placeholder modules for the host's GPU-only imports
(``sgl_kernel``, ``torchvision``; :mod:`sglang_spec_ext.sglang.cpu_placeholders`,
the same ones ``sglang-spec-ext serve-cpu`` installs in CPU servers) so real SGLang
modules import in this process.
"""

from __future__ import annotations

from sglang_spec_ext.sglang import cpu_placeholders

cpu_placeholders.install()

# A skip for a reason other than a documented optional peer fails the run.
from tests.harness.skip_policy import (  # noqa: E402, F401
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
