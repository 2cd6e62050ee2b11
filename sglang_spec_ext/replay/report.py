"""Text tables of replay reports (machine/version blocks: ``sglang_spec_ext.machine``)."""

from __future__ import annotations

from collections.abc import Sequence

# Machine and version blocks live in one place: sglang_spec_ext.machine.
from sglang_spec_ext.machine import machine_info, package_versions

__all__ = ["format_table", "machine_info", "package_versions"]


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
