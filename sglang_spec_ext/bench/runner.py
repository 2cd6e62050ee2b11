"""The benchmark run: for each endpoint in turn (baseline, then speculative), obtain
it (a URL, or a server launched here and always stopped), warm it up, collect the
greedy parity outputs, then measure every cell, saving the results after each one.

Every cell has its own prompts (the same for both endpoints), so a speculative
server's global suffix tree never sees a cell's prompts or answers before that cell.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_spec_ext.bench import client, parity, report
from sglang_spec_ext.bench.metrics import RequestResult, summarize
from sglang_spec_ext.bench.servers import LaunchedServer
from sglang_spec_ext.bench.workload import Load, PromptSource, Request, Scenario


@dataclass
class Endpoint:
    """A role's server: a URL, or what to launch (``model_path`` + ``args``)."""

    role: str
    url: str | None = None
    model_path: str | None = None
    args: str = ""
    env: dict[str, str] = field(default_factory=dict)
    pythonpath: Sequence[str] = ()
    start_timeout_s: float = 600.0

    def describe(self) -> dict[str, Any]:
        if self.url:
            return {"url": self.url, "launched": False}
        return {"launched": True, "model_path": self.model_path, "args": self.args,
                "env": self.env, "pythonpath": list(self.pythonpath)}  # fmt: skip


@dataclass
class Plan:
    scenarios: list[Scenario]
    loads: list[Load]
    source: PromptSource
    num_prompts: int
    seed: int = 0
    api: str = "native"
    stream: bool = True
    temperature: float = 0.0
    warmup: int = 1
    timeout_s: float = 3600.0
    parity_prompts: int = 0  # 0: no parity check
    parity_only: bool = False
    out_dir: Path | None = None
    progress: bool = True

    def cells(self) -> list[tuple[int, Scenario, Load]]:
        out, j = [], 0
        for sc in self.scenarios:
            for ld in self.loads:
                out.append((j, sc, ld))
                j += 1
        return out

    def cell_requests(self, index: int, scenario: Scenario) -> list[Request]:
        return self.source.build(scenario, self.num_prompts, self.seed * 1_000_003 + index)

    def parity_requests(self) -> list[Request]:
        return self.source.build(self.scenarios[0], self.parity_prompts, self.seed - 7_919)

    def warmup_requests(self) -> list[Request]:
        sc = Scenario("warmup", min(16, self.scenarios[0].input_len), 8)
        return self.source.build(sc, self.warmup, self.seed - 104_729)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(plan: Plan, desc: str, total: int) -> tuple[Callable[[RequestResult], None], Any]:
    if not plan.progress:
        return (lambda r: None), None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr, leave=False)
    return (lambda r: bar.update(1)), bar


def measure_cell(
    url: str, plan: Plan, index: int, sc: Scenario, ld: Load, role: str, model: str | None
) -> dict[str, Any]:
    reqs = plan.cell_requests(index, sc)
    on_done, bar = _progress(plan, f"{role} {sc.name} {ld.label}", len(reqs))
    try:
        results, t0 = asyncio.run(
            client.run_cell(
                url,
                reqs,
                ld,
                api=plan.api,
                stream=plan.stream,
                temperature=plan.temperature,
                model=model,
                seed=plan.seed + index,
                timeout_s=plan.timeout_s,
                on_done=on_done,
            )  # fmt: skip
        )
    finally:
        if bar is not None:
            bar.close()
    return summarize(results, t0)


def run_endpoint(
    ep: Endpoint,
    plan: Plan,
    doc: dict[str, Any],
    parity_out: dict[str, list[RequestResult]],
    save: Callable[[], None],
) -> None:
    """All work of one role; a launched server is stopped whatever happens."""
    server: LaunchedServer | None = None
    info = doc["endpoints"].setdefault(ep.role, ep.describe())
    try:
        url = ep.url
        if url is None:
            log_path = (plan.out_dir / f"{ep.role}-server.log") if plan.out_dir else None
            server = LaunchedServer(
                ep.model_path or "", ep.args, env=ep.env, pythonpath=ep.pythonpath,
                log_path=log_path, name=ep.role,
            )  # fmt: skip
            info.update(command=server.cmd, log=str(server.log_path))
            log(f"[{ep.role}] starting server: {' '.join(server.cmd)}")
            server.start(ep.start_timeout_s)
            url = server.url
            info["url"] = url
        model = asyncio.run(client.fetch_model_id(url)) if plan.api == "openai" else None
        info["model"] = model
        if plan.warmup:
            asyncio.run(
                client.run_sequential(url, plan.warmup_requests(), timeout_s=plan.timeout_s)
            )
        if plan.parity_prompts:
            info["parity_fields"] = asyncio.run(
                client.fetch_server_fields(url, parity.PARITY_FIELDS)
            )
            log(f"[{ep.role}] parity: {plan.parity_prompts} greedy prompts")
            parity_out[ep.role] = asyncio.run(
                client.run_sequential(url, plan.parity_requests(), timeout_s=plan.timeout_s)
            )
        if plan.parity_only:
            return
        for index, sc, ld in plan.cells():
            metrics = measure_cell(url, plan, index, sc, ld, ep.role, model)
            report.record_cell(doc, sc, ld, ep.role, metrics)
            save()
            acc = metrics["accept_length"]
            log(
                f"[{ep.role}] {sc.name} {ld.label}: {metrics['output_throughput']:.1f} tok/s, "
                f"{metrics['completed']} ok, {metrics['failed']} failed"
                + (f", accept {acc:.2f}" if acc is not None else "")
            )
    finally:
        if server is not None:
            server.stop()
            log(f"[{ep.role}] server stopped")


def run_all(
    endpoints: Sequence[Endpoint], plan: Plan, doc: dict[str, Any], save: Callable[[], None]
) -> int:
    """Run every endpoint, then the parity comparison. Returns 0, or 1 on a parity
    mismatch. ``KeyboardInterrupt`` propagates (the caller saves and exits 130)."""
    parity_out: dict[str, list[RequestResult]] = {}
    for ep in endpoints:
        run_endpoint(ep, plan, doc, parity_out, save)
    rc = 0
    if plan.parity_prompts:
        result = parity.compare(parity_out["baseline"], parity_out["speculative"])
        result["caveats"] = [
            c
            for ep in endpoints
            for c in parity.bit_identity_caveats(
                ep.role, doc["endpoints"].get(ep.role, {}).get("parity_fields")
            )
        ]
        doc["parity"] = result
        log(parity.describe(result))
        rc = 0 if result["ok"] else 1
    return rc
