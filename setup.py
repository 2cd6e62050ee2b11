"""Build script: only the optional native suffix-tree core lives here.

Metadata is in pyproject.toml. The native extension is optional: when it cannot
be compiled, the package falls back to the pure-Python reference drafter (25-50x
slower), the server warns at start-up and `sglang-spec-ext doctor` fails unless
SGLANG_SPEC_EXT_BACKEND=python is chosen explicitly. Set SGLANG_SPEC_EXT_NO_NATIVE=1
to skip the build on purpose; it is a build-time variable, listed in
sglang_spec_ext.config.BUILD_TIME_ENV so that a server started with it still set
accepts and ignores it. Every SGLANG_SPEC_EXT_* variable read here must be listed
there (tests/unit/test_build_env.py checks this).
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

SOURCES = [
    "csrc/suffix/bindings.cc",
    "csrc/suffix/draft.cc",
    "csrc/suffix/engine.cc",
    "csrc/suffix/suffix_tree.cc",
    "csrc/suffix/suffix_tree_remove.cc",
    "csrc/suffix/tree_check.cc",
]


class OptionalBuildExt(build_ext):
    """Build extensions, but never fail the install because of them."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # compiler missing, headers missing, ...
            self._warn(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    @staticmethod
    def _warn(exc: Exception) -> None:
        print(
            "WARNING: sglang_spec_ext.suffix._native was not built "
            f"({type(exc).__name__}: {exc}); the pure-Python suffix drafter will be used.",
            file=sys.stderr,
        )


def native_extensions() -> list:
    if os.environ.get("SGLANG_SPEC_EXT_NO_NATIVE", "") in ("1", "true", "yes"):
        return []
    try:
        from pybind11.setup_helpers import Pybind11Extension
    except ImportError:
        print("WARNING: pybind11 not available; skipping the native suffix core", file=sys.stderr)
        return []
    here = Path(__file__).parent
    if not all((here / s).exists() for s in SOURCES):
        return []
    compile_args = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off"]
    return [
        Pybind11Extension(
            "sglang_spec_ext.suffix._native",
            SOURCES,
            include_dirs=["csrc/suffix"],
            depends=[str(p) for p in sorted(Path("csrc/suffix").glob("*.h"))],
            cxx_std=17,
            extra_compile_args=compile_args,
        )
    ]


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
