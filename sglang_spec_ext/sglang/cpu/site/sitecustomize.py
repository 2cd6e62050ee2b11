"""Runs at start-up of every Python process with this directory on PYTHONPATH.

Installs sglang-spec-ext's placeholder modules for SGLang's GPU-only imports
(``sgl_kernel``, ``torchvision``; see ``sglang_spec_ext.sglang.cpu.placeholders``),
then runs the ``sitecustomize`` this file shadows, if the environment has one.
Only ``sglang-spec-ext serve-cpu`` (or a user who asks for CPU serving) puts this
directory on PYTHONPATH.
"""

import os

from sglang_spec_ext.sglang.cpu import placeholders as cpu_placeholders
from sglang_spec_ext.sglang.cpu.site import run_next_sitecustomize

cpu_placeholders.install()
run_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
