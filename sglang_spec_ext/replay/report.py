"""Text tables and the machine/version block of replay reports."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def package_versions(names: Sequence[str] = ()) -> dict[str, str | None]:
    base = ("sglang-spec-ext", "sglang", "arctic-inference", "numpy", "torch", "transformers")
    out: dict[str, str | None] = {}
    for name in (*base, *names):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)

    text = [[cell(v) for v in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)
    ]
    numeric = [
        all(isinstance(r[i], int | float) or r[i] is None for r in rows)
        for i in range(len(headers))
    ]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(vals, widths, numeric, strict=True)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in text)])
