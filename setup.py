"""Build script: only the optional native suffix-tree core lives here.

Metadata is in pyproject.toml. The native extension is optional: when it cannot
be compiled, the package falls back to the pure-Python reference drafter and
`sglang-spec-ext doctor` says so.
"""

from setuptools import setup

setup()
