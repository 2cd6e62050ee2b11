"""Search of SUFFIX draft settings on replay traces (the engine of ``tune --trace``).

For every drafter setting (max_depth, spec_factor, spec_offset, min_token_prob,
use_tree) the trace is replayed once through the suffix drafter into an acceptance
table (``sglang_spec_ext.replay.table``: accepted tokens per position and draft
budget; exact for the suffix drafter under greedy decoding), from which the accept
length of every verify width ``W`` (budget ``W - 1`` draft nodes) follows.

Objective, per batch size ``B``: a goodput proxy relative to plain decoding,
``accept_len(W) / cost(B, W)`` (plain decoding: ``W = 1``, accept length 1, cost 1).
Cost models (``cost`` is one verify step over one plain decode step at batch size B):

- ``linear``: ``cost(B, W) = 1 + alpha * B * (W - 1)``, every extra verified token
  costs ``alpha`` of a plain step (at ``B = 1``: ``1 + alpha * (W - 1)``).
- ``analytic``: ``t(B, W - 1) / t(B, 0)`` of the roofline step-cost model of
  ``sglang_spec_ext.adaptive.prior`` (a preset GPU/model; memory-bound decode, compute
  beyond the knee, per-step speculation overheads).

Acceptance is taken from single-request replay (it does not depend on the batch);
only the cost depends on ``B``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_spec_ext.config import PluginConfig
from sglang_spec_ext.replay import (
    AcceptanceRow,
    DrafterOptions,
    TraceRecord,
    acceptance_table,
    drafter_factory,
    simulate_fixed_budget,
)

CONFIG_KEYS = (
    "max_depth", "spec_factor", "spec_offset", "min_token_prob", "use_tree", "global_prompt_cap",
)  # fmt: skip


@dataclass(frozen=True)
class DraftSetting:
    """The SUFFIX drafter settings ``tune`` searches (names as in the config file)."""

    max_depth: int = 64
    spec_factor: float = 1.0
    spec_offset: float = 0.0
    min_token_prob: float = 0.1
    use_tree: bool = True
    global_prompt_cap: int = 64  # prompt tokens (the last ones) in the global tree

    @classmethod
    def plugin_default(cls) -> DraftSetting:
        d = PluginConfig()
        return cls(*(getattr(d, k) for k in CONFIG_KEYS))

    def config_dict(self) -> dict[str, Any]:
        return asdict(self)

    def options(self, backend: str = "auto", width: int = 16) -> DrafterOptions:
        fields = asdict(self)
        extra = {"global_prompt_cap": fields.pop("global_prompt_cap")}  # a SuffixConfig field
        return DrafterOptions(width=width, suffix_backend=backend, extra=extra, **fields)


@dataclass
class SearchSpace:
    widths: list[int]
    max_depth: list[int]
    spec_factor: list[float]
    spec_offset: list[float]
    min_token_prob: list[float]
    use_tree: list[bool] = field(default_factory=lambda: [True])
    global_prompt_cap: list[int] = field(default_factory=lambda: [PluginConfig().global_prompt_cap])

    def settings(self, include_default: bool = True) -> list[DraftSetting]:
        grid = itertools.product(
            self.max_depth,
            self.spec_factor,
            self.spec_offset,
            self.min_token_prob,
            self.use_tree,
            self.global_prompt_cap,
        )
        out = [DraftSetting(*values) for values in grid]
        if include_default and DraftSetting.plugin_default() not in out:
            out.append(DraftSetting.plugin_default())
        return out


class LinearCost:
    name = "linear"

    def __init__(self, alpha: float = 0.01) -> None:
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha

    def relative(self, batch_size: int, width: int) -> float:
        return 1.0 + self.alpha * batch_size * (width - 1)

    def describe(self) -> str:
        return f"cost(B, W) = 1 + {self.alpha:g} * B * (W - 1)"


class AnalyticCost:
    name = "analytic"

    def __init__(self, preset: str = "llama3-8b-h100") -> None:
        from sglang_spec_ext.adaptive.prior import PRESETS, analytic_step_time

        if preset not in PRESETS:
            raise ValueError(f"unknown cost preset {preset!r}; choose from {sorted(PRESETS)}")
        self.preset = preset
        self._coeffs = PRESETS[preset].coefficients()
        self._time = analytic_step_time

    def seconds(self, batch_size: int, width: int) -> float:
        return float(self._time(self._coeffs, batch_size, max(width - 1, 0))[0])

    def relative(self, batch_size: int, width: int) -> float:
        return self.seconds(batch_size, width) / self.seconds(batch_size, 1)

    def describe(self) -> str:
        return f"cost(B, W) = t(B, W-1) / t(B, 0), analytic roofline preset {self.preset}"


CostModel = LinearCost | AnalyticCost


@dataclass
class Evaluation:
    setting: DraftSetting
    accept: dict[int, float]  # width -> accept length (tokens per verify step)
    rows: list[AcceptanceRow] = field(default_factory=list, repr=False)

    def goodput(self, width: int, batch_size: int, cost: CostModel) -> float:
        return self.accept[width] / cost.relative(batch_size, width)


def accept_lengths(rows: Sequence[AcceptanceRow], widths: Iterable[int]) -> dict[int, float]:
    """Accept length per verify width from acceptance tables (``W = 1`` is plain: 1.0)."""
    out: dict[int, float] = {}
    for w in widths:
        if w <= 1:
            out[w] = 1.0
            continue
        commits = [c for row in rows for c in simulate_fixed_budget(row, w - 1)]
        out[w] = sum(commits) / len(commits) if commits else 1.0
    return out


def evaluate(
    records: Sequence[TraceRecord], setting: DraftSetting, widths: Sequence[int], backend="auto"
) -> Evaluation:
    ks = sorted({w - 1 for w in widths if w > 1})
    if not ks:
        return Evaluation(setting, {w: 1.0 for w in widths})
    factory = drafter_factory("suffix", setting.options(backend, max(widths)))
    rows = acceptance_table(records, factory, ks)
    return Evaluation(setting, accept_lengths(rows, widths), rows)


def search(
    records: Sequence[TraceRecord],
    space: SearchSpace,
    backend: str = "auto",
    progress: Callable[[Iterable[DraftSetting]], Iterable[DraftSetting]] | None = None,
) -> list[Evaluation]:
    settings = space.settings()
    it = progress(settings) if progress else settings
    return [evaluate(records, s, space.widths, backend) for s in it]


def ranked(
    evals: Sequence[Evaluation], widths: Sequence[int], batch_size: int, cost: CostModel
) -> list[tuple[float, int, Evaluation]]:
    """(goodput, width, evaluation) for every speculative candidate, best first."""
    cands = [(e.goodput(w, batch_size, cost), w, e) for e in evals for w in widths if w > 1]
    return sorted(cands, key=lambda c: (-c[0], c[1]))


def best_across_widths(
    evals: Sequence[Evaluation], widths: Sequence[int]
) -> tuple[float, Evaluation] | None:
    """The one setting for every searched width: highest geometric mean over the
    widths (> 1) of its accept length relative to the best setting at that width.
    A server's width is not fixed (the adaptive controller moves it), so its draft
    settings should hold up at all of them. Ties go to the earlier grid point (the
    smaller factor, then offset). None when there is nothing to rank."""
    ws = [w for w in widths if w > 1]
    if not ws or not evals:
        return None
    top = {w: max(e.accept[w] for e in evals) for w in ws}
    best: tuple[float, Evaluation] | None = None
    for e in evals:
        score = math.exp(sum(math.log(e.accept[w] / top[w]) for w in ws) / len(ws))
        if best is None or score > best[0] + 1e-12:
            best = (score, e)
    return best


def best_per_batch(
    evals: Sequence[Evaluation],
    widths: Sequence[int],
    batch_sizes: Sequence[int],
    cost: CostModel,
    default_width: int | None = None,
) -> list[dict[str, Any]]:
    """Per batch size: the best speculative candidate, whether it beats plain decoding,
    and the plugin's default setting for comparison, at ``default_width`` (default: the
    server's default width 16 if searched, else the widest searched)."""
    default = next((e for e in evals if e.setting == DraftSetting.plugin_default()), None)
    if default_width is None:
        default_width = 16 if 16 in widths else max(widths)
    out = []
    for bs in batch_sizes:
        top = ranked(evals, widths, bs, cost)
        if not top:
            continue
        g, w, e = top[0]
        row: dict[str, Any] = {
            "batch_size": bs,
            "width": w,
            "setting": e.setting.config_dict(),
            "accept_length": e.accept[w],
            "cost": cost.relative(bs, w),
            "goodput": g,
            "speculate": g > 1.0,
            "default_goodput": None,
            "default_width": default_width,
        }
        if default is not None and default_width in default.accept:
            row["default_goodput"] = default.goodput(default_width, bs, cost)
        out.append(row)
    return out
