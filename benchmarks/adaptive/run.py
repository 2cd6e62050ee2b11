"""adaptive_replay.py: one set under every policy (for benchmarks/results/adaptive_replay*.json).

Every fixed ``k``, the controller (optionally its counterfactual twin), the host's EMA
and a server without speculation ("plain"), each replayed at every batch size and
charged the analytic truth (``costs.truth_params``); the policies see those times with
log-normal noise and outliers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tqdm import tqdm

from sglang_spec_ext.adaptive.controller import AdaptiveController
from sglang_spec_ext.adaptive.prior import PRESETS, draft_extend_time, step_time
from sglang_spec_ext.adaptive.simulator import (
    AcceptanceTable,
    ControllerPolicy,
    FixedPolicy,
    WidthPolicy,
    replay,
)

from .costs import TRUTH_PRESET, controller_config, truth_params
from .host_ema import HostEMAPolicy

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def run_set(
    table: AcceptanceTable,
    batch_sizes: Sequence[int],
    *,
    steps: int,
    seed: int,
    host_ema: bool,
    counterfactual: bool,
    noise: float,
    outlier_rate: float,
    shape: str = "suffix",
    zero_step: str = "warm",
    progress: tqdm | None = None,
) -> dict[str, dict]:
    """Goodput of every policy at every batch size for one acceptance set."""
    truth = truth_params(shape, zero_step)
    plain_truth = PRESETS[TRUTH_PRESET]  # no draft model at all

    def true_cost(bs: int, k: int) -> float:
        return float(step_time(truth, bs, k)[0])

    def plain_cost(bs: int, k: int) -> float:
        return float(step_time(plain_truth, bs, 0)[0])

    cfg = controller_config(table, shape, zero_step)
    repair = None
    if shape != "suffix" and zero_step == "repair":  # the draft constants of the truth
        repair = functools.partial(draft_extend_time, truth)

    out: dict[str, dict] = {}
    for bs in batch_sizes:
        policies: list[WidthPolicy] = [FixedPolicy(k) for k in cfg.ks]
        controller = AdaptiveController(cfg)
        if repair is not None:  # priced from the controller's own (wrong) prior
            controller.expect_repairs(functools.partial(draft_extend_time, cfg.cost_params()))
        policies.append(ControllerPolicy(controller, "controller"))
        if counterfactual:
            policies.append(
                ControllerPolicy(AdaptiveController(cfg), "controller+nested", counterfactual=True)
            )
        if host_ema:
            policies.append(HostEMAPolicy(max_steps=max(cfg.ks)))
        row: dict[str, dict] = {}
        plain = replay(table, bs, FixedPolicy(0), plain_cost, steps=steps, seed=seed)
        row["plain"] = {"goodput_tok_s": plain.goodput, "mean_k": 0.0, "k_hist": {"0": steps}}
        for pol in policies:
            res = replay(
                table, bs, pol, true_cost, steps=steps, seed=seed,
                noise=noise, outlier_rate=outlier_rate, repair_cost=repair,
            )  # fmt: skip
            row[pol.name] = {
                "goodput_tok_s": res.goodput,
                "mean_k": res.mean_k,
                "k_hist": {str(k): n for k, n in sorted(res.k_hist.items())},
            }
        out[str(bs)] = row
        if progress is not None:
            progress.update(1)
    return out
