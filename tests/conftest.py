"""Test-wide set-up.

Installs the TEST-ONLY placeholder modules for the host's GPU-only imports
(``sgl_kernel``, ``torchvision``) so real SGLang modules import in this process;
see tests/harness/shim/spec_ext_placeholders.py. The product never does this.
"""

from __future__ import annotations

import sys
from pathlib import Path

_SHIM = Path(__file__).resolve().parent / "harness" / "shim"
if str(_SHIM) not in sys.path:
    sys.path.insert(0, str(_SHIM))

import spec_ext_placeholders  # noqa: E402

spec_ext_placeholders.install()
