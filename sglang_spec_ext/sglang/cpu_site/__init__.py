"""A ``PYTHONPATH`` directory for CPU-only serving (``sglang-spec-ext serve-cpu``).

Its ``sitecustomize.py`` installs :mod:`sglang_spec_ext.sglang.cpu_placeholders` in
every Python process that has this directory on its path (the server launcher and
the scheduler/detokenizer processes it spawns). Nothing imports this package for
that: put :data:`SITE_DIR` on ``PYTHONPATH`` (see
:func:`sglang_spec_ext.sglang.cpu_serving.cpu_serving_env`).
"""

from pathlib import Path

SITE_DIR: Path = Path(__file__).resolve().parent
