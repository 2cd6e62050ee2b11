"""PNG plot of a results document: per scenario, output throughput and median
end-to-end latency against load (request rates, then concurrencies), baseline vs
speculative."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

STYLE = {"baseline": ("tab:gray", "o", "baseline"), "speculative": ("tab:blue", "s", "speculative")}


def plot_results(doc: dict[str, Any], path: Path | str) -> Path | None:
    """Write the plot; ``None`` (nothing written) when no cell has figures yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios: list[str] = []
    for c in doc["cells"]:
        if c["scenario"] not in scenarios:
            scenarios.append(c["scenario"])
    if not scenarios:
        return None
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(11, 3.6 * len(scenarios)), squeeze=False)
    for row, name in enumerate(scenarios):
        cells = [c for c in doc["cells"] if c["scenario"] == name]
        labels = [c["load_label"] for c in cells]
        xs = list(range(len(cells)))
        for role, (color, marker, text) in STYLE.items():
            tput = [(c.get(role) or {}).get("output_throughput") for c in cells]
            lat = [((c.get(role) or {}).get("e2e_latency_s") or {}).get("median") for c in cells]
            for ax, ys in ((axes[row][0], tput), (axes[row][1], lat)):
                pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=color, marker=marker, label=text)
        c0 = cells[0]
        for ax, ylabel in (
            (axes[row][0], "output tok/s"),
            (axes[row][1], "median e2e latency (s)"),
        ):
            ax.set_xticks(xs)
            ax.set_xticklabels(labels)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{name} ({c0['input_len']} in / {c0['output_len']} out)")
            ax.grid(alpha=0.3)
            ax.margins(y=0.15)  # room for the speedup labels
            ax.set_ylim(bottom=0)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
        for c, x in zip(cells, xs, strict=True):
            if c.get("speedup") is not None:
                axes[row][0].annotate(
                    f"{c['speedup']:.2f}x", (x, (c["speculative"]["output_throughput"])),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8,
                )  # fmt: skip
    title = "sglang-spec-ext bench"
    if doc.get("label"):
        title += f": {doc['label']}"
    fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
