"""The host (SGLang) version check, kept free of SGLang imports.

Everything we hook is pinned to one minor release; outside the supported range
the plugin refuses to register and says which versions it supports.
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_spec_ext import SUPPORTED_HOST

HOST_DIST = "sglang"


class UnsupportedHostError(RuntimeError):
    """SGLang is missing or its version is outside the supported range."""


def host_version() -> str | None:
    """The installed SGLang version, or None when SGLang is not installed."""
    try:
        return metadata.version(HOST_DIST)
    except metadata.PackageNotFoundError:
        return None


def is_supported(version: str) -> bool:
    try:
        return Version(version) in SpecifierSet(SUPPORTED_HOST)
    except InvalidVersion:
        return False


def check_host(version: str | None = None) -> str:
    """Return the host version, or raise :class:`UnsupportedHostError` with the fix."""
    version = host_version() if version is None else version
    if version is None:
        raise UnsupportedHostError(
            f"SGLang is not installed; sglang-spec-ext needs sglang{SUPPORTED_HOST} "
            f"(pip install 'sglang-spec-ext[sglang]')"
        )
    if not is_supported(version):
        raise UnsupportedHostError(
            f"sglang {version} is not supported by sglang-spec-ext; supported: "
            f"sglang{SUPPORTED_HOST}. Install a supported SGLang or a sglang-spec-ext "
            "release made for this one."
        )
    return version
