"""``tune --model-path``: measure SUFFIX settings on real servers launched here.

SUFFIX settings are read when a server starts (environment / config file), so each
(setting, width) point gets its own server: the setting is written to a temporary
config file named by ``SGLANG_SPEC_EXT_CONFIG`` and the width is passed as
``--speculative-num-draft-tokens``. At each batch size (a closed loop of that many
concurrent clients) the same requests are sent to every server; the objective is
the measured output tokens per second. A plain server (no speculation) is measured
too unless ``--no-baseline``. Servers are stopped whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_spec_ext.bench.client import run_cell
from sglang_spec_ext.bench.metrics import summarize
from sglang_spec_ext.bench.servers import LaunchedServer
from sglang_spec_ext.bench.workload import Load, PromptSource, Scenario
from sglang_spec_ext.tune.search import DraftSetting


def _measure(
    url: str, source: PromptSource, scenario: Scenario, batch_sizes: Sequence[int], n: int
) -> dict[int, dict[str, Any]]:
    out = {}
    for i, bs in enumerate(batch_sizes):
        # distinct prompts per batch size (a server's global tree must not have seen
        # them), the same across servers
        reqs = source.build(scenario, n, seed=10_007 * (i + 1))
        results, t0 = asyncio.run(run_cell(url, reqs, Load("concurrency", bs), stream=True))
        out[bs] = summarize(results, t0)
    return out


def live_search(
    model_path: str,
    server_args: str,
    settings: Sequence[DraftSetting],
    widths: Sequence[int],
    batch_sizes: Sequence[int],
    source: PromptSource,
    scenario: Scenario,
    num_prompts: int,
    *,
    env: dict[str, str] | None = None,
    pythonpath: Sequence[str] = (),
    baseline: bool = True,
    log_dir: Path | None = None,
    timeout_s: float = 600.0,
) -> list[dict[str, Any]]:
    """One entry per server: ``{"setting", "width", "per_batch": {bs: metrics}}``
    (``setting`` ``None`` and ``width`` 1 for the plain baseline)."""
    points: list[tuple[DraftSetting | None, int]] = [(None, 1)] if baseline else []
    points += [(s, w) for s in settings for w in widths if w > 1]
    out = []
    with tempfile.TemporaryDirectory(prefix="spec-ext-tune-") as tmp:
        for i, (setting, width) in enumerate(points):
            server_env = dict(env or {})
            args = server_args
            if setting is not None:
                cfg = Path(tmp) / f"config-{i}.json"
                cfg.write_text(json.dumps(setting.config_dict()))
                server_env["SGLANG_SPEC_EXT_CONFIG"] = str(cfg)
                args += f" --speculative-algorithm SUFFIX --speculative-num-draft-tokens {width}"
            log_path = (log_dir / f"tune-server-{i}.log") if log_dir else None
            server = LaunchedServer(
                model_path, args, env=server_env, pythonpath=pythonpath,
                log_path=log_path, name=f"tune-{i}",
            )  # fmt: skip
            label = "plain" if setting is None else f"W={width} {setting.config_dict()}"
            print(f"[tune] server {i + 1}/{len(points)}: {label}", file=sys.stderr, flush=True)
            try:
                server.start(timeout_s)
                per_batch = _measure(server.url, source, scenario, batch_sizes, num_prompts)
            finally:
                server.stop()
            out.append(
                {
                    "setting": None if setting is None else setting.config_dict(),
                    "width": width,
                    "per_batch": per_batch,
                }
            )
    return out


def best_live(points: Sequence[dict[str, Any]], batch_sizes: Sequence[int]) -> list[dict]:
    """Per batch size, the speculative point with the highest output tok/s."""
    plain = next((p for p in points if p["setting"] is None), None)
    rows = []
    for bs in batch_sizes:
        spec = [p for p in points if p["setting"] is not None]
        if not spec:
            continue
        best = max(spec, key=lambda p: p["per_batch"][bs]["output_throughput"])
        m = best["per_batch"][bs]
        base = plain["per_batch"][bs]["output_throughput"] if plain else None
        rows.append(
            {
                "batch_size": bs,
                "width": best["width"],
                "setting": best["setting"],
                "accept_length": m["accept_length"],
                "output_throughput": m["output_throughput"],
                "plain_throughput": base,
                "speedup": m["output_throughput"] / base if base else None,
            }
        )
    return rows
