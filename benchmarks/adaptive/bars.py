"""adaptive_replay.py: the controller's bars (for benchmarks/results/adaptive_replay*.json).

Per batch size: the controller at >= 98 % of the best fixed step count and of plain
decoding, and at or above the host's EMA policy, except where the EMA's hand-set tier
already sits on the optimum (its goodput within 0.5 % of the best of plain and every
fixed step count): there within 0.5 % of it counts as level.
"""

from __future__ import annotations

BAR_FIXED = 0.98  # controller >= 98 % of the best fixed k
BAR_PLAIN = 0.98  # controller >= 98 % of plain decoding
#: Versus the host EMA: within this of it counts as level where the EMA's hand-set tier
#: already sits on the optimum (its goodput within this of the best static setting).
EMA_LEVEL = 0.005


def check_bars(row: dict[str, dict]) -> dict[str, object]:
    """Bars at one batch size: vs best fixed (2 %), vs host EMA, vs plain (2 %). Versus
    the EMA: at or above it, or level (within ``EMA_LEVEL`` below it) where the EMA
    already sits on the optimum (within ``EMA_LEVEL`` of the best of plain and every
    fixed step count); ``vs_host_ema`` says which."""
    fixed = {n: v["goodput_tok_s"] for n, v in row.items() if n.startswith("fixed")}
    best_name = max(fixed, key=fixed.__getitem__)
    ctl = row["controller"]["goodput_tok_s"]
    plain = row["plain"]["goodput_tok_s"] if "plain" in row else None
    res: dict[str, object] = {
        "best_fixed": best_name,
        "ctl_over_best_fixed": ctl / fixed[best_name],
        "ok_best_fixed": ctl >= BAR_FIXED * fixed[best_name],
    }
    if plain is not None:
        res["ctl_over_plain"] = ctl / plain
        res["ok_plain"] = ctl >= BAR_PLAIN * plain
    if "host EMA" in row:
        ema = row["host EMA"]["goodput_tok_s"]
        optimum = max(fixed[best_name], plain if plain is not None else 0.0)
        on_optimum = ema >= (1.0 - EMA_LEVEL) * optimum
        res["ctl_over_host_ema"] = ctl / ema
        res["host_ema_on_optimum"] = on_optimum
        if ctl >= ema:
            res["vs_host_ema"] = "above"
        elif on_optimum and ctl >= (1.0 - EMA_LEVEL) * ema:
            res["vs_host_ema"] = "level"
        else:
            res["vs_host_ema"] = "below"
        res["ok_host_ema"] = res["vs_host_ema"] != "below"
    res["ok"] = all(v for key, v in res.items() if key.startswith("ok_"))
    return res


def summary(all_ok: bool, host_ema: bool, label: str) -> str:
    """The closing line: whether every bar holds, and what they are."""
    return (f"\nbars ({'all hold' if all_ok else 'SOME FAIL'}): controller >= {BAR_FIXED:.0%} of best "
            f"fixed k, >= host EMA{'' if host_ema else ' (not run)'} (level: within {EMA_LEVEL:.1%} "
            f"where the EMA sits on the optimum), >= {BAR_PLAIN:.0%} of plain; {label}")  # fmt: skip
