"""Optional part of ``tune --trace --adaptive``: the adaptive draft-width controller
(``sglang_spec_ext.adaptive``) replayed on the best setting's acceptance tables, per
batch size, against every fixed width (``adaptive.simulator.replay``).

Step times charged in the simulation: the analytic roofline preset's plain decode
step ``t(B, 0)`` times the chosen cost model's relative cost, so the controller and
the fixed widths are judged by the same cost model as the search. The controller
calibrates its own cost model online from those (noisy) times, as on a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang_spec_ext.replay import AcceptanceRow


def adaptive_per_batch(
    rows: Sequence[AcceptanceRow],
    widths: Sequence[int],
    batch_sizes: Sequence[int],
    cost: Any,
    steps: int = 2000,
    seed: int = 0,
    preset: str = "llama3-8b-h100",
) -> list[dict[str, Any]]:
    """Per batch size: controller goodput, best fixed width and its goodput, and their
    ratio. Raises ``ImportError``/``ValueError`` when the adaptive package cannot run."""
    from sglang_spec_ext.adaptive import AdaptiveConfig, AdaptiveController
    from sglang_spec_ext.adaptive.prior import PRESETS, analytic_step_time
    from sglang_spec_ext.adaptive.simulator import (
        AcceptanceTable,
        ControllerPolicy,
        FixedPolicy,
        replay,
    )

    table = AcceptanceTable.from_rows([r.to_json() for r in rows])
    coeffs = PRESETS[preset].coefficients()
    ks = sorted({w - 1 for w in widths if w > 1})

    def true_cost(bs: int, k: int) -> float:
        plain = float(analytic_step_time(coeffs, bs, 0)[0])
        return plain * cost.relative(bs, k + 1)

    out = []
    for bs in batch_sizes:
        fixed = {
            k: replay(table, bs, FixedPolicy(k), true_cost, steps=steps, seed=seed).goodput
            for k in [0, *ks]
        }
        cfg = AdaptiveConfig(candidate_ks=tuple([0, *ks]), max_k=max(ks), cost_preset=preset)
        ctl = ControllerPolicy(AdaptiveController(cfg))
        res = replay(table, bs, ctl, true_cost, steps=steps, seed=seed)
        best_k = max(fixed, key=lambda k: fixed[k])
        out.append(
            {
                "batch_size": bs,
                "controller_goodput": res.goodput,
                "controller_mean_width": res.mean_k + 1,
                "best_fixed_width": best_k + 1,
                "best_fixed_goodput": fixed[best_k],
                "plain_goodput": fixed[0],
                "vs_best_fixed": res.goodput / fixed[best_k] if fixed[best_k] else None,
            }
        )
    return out
