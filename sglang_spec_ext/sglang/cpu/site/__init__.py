"""A ``PYTHONPATH`` directory for CPU-only serving (``sglang-spec-ext serve-cpu``).

Its ``sitecustomize.py`` installs :mod:`sglang_spec_ext.sglang.cpu.placeholders` in
every Python process that has this directory on its path (the server launcher and
the scheduler/detokenizer processes it spawns). Nothing imports this package for
that: put :data:`SITE_DIR` on ``PYTHONPATH`` (see
:func:`sglang_spec_ext.sglang.cpu.serving.cpu_serving_env`).
"""

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

SITE_DIR: Path = Path(__file__).resolve().parent


def run_next_sitecustomize(site_dir: str) -> None:
    """Run the ``sitecustomize`` that the one in ``site_dir`` shadows: the first found on
    ``sys.path`` after ``site_dir`` (so a chain of site directories runs each once, in
    path order; none after it: nothing runs)."""
    here = os.path.abspath(site_dir)
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    rest = sys.path[paths.index(here) + 1 :] if here in paths else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
