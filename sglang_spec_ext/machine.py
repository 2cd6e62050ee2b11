"""Where a measurement was taken: machine, OS and package versions.

Every benchmark and report writes this next to its figures, so a number is never
read without knowing which machine and which versions produced it.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

PACKAGES = ("sglang-spec-ext", "sglang", "torch", "transformers", "numpy", "arctic-inference")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        return None
    return None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info() -> dict:
    """Machine, OS, CPU, GPU (if any), Python and package versions."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpu(),
        "python": platform.python_version(),
        "versions": package_versions(),
    }
