"""Runs at start-up of every Python process with this directory on PYTHONPATH.

Installs sglang-spec-ext's placeholder modules for SGLang's GPU-only imports
(``sgl_kernel``, ``torchvision``; see ``sglang_spec_ext.sglang.cpu_placeholders``),
then runs the ``sitecustomize`` this file shadows, if the environment has one.
Only ``sglang-spec-ext serve-cpu`` (or a user who asks for CPU serving) puts this
directory on PYTHONPATH.
"""

import importlib.machinery
import importlib.util
import os
import sys

from sglang_spec_ext.sglang import cpu_placeholders

cpu_placeholders.install()


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_run_shadowed_sitecustomize()
