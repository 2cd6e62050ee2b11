"""The timing stages of ``gpu/run``: host time and syncs per decode step (the scheduler
probe, ``gpu/probe_site``), HYBRID on its own, decode tok/s with acceptance pinned, and
the start-up and graph memory of adaptive SUFFIX. Each writes every finished cell at once
(``kit.cell``); the kit is :class:`gpu_kit.kit.Kit`."""

from __future__ import annotations

import glob
import json
import re
import time
from pathlib import Path
from typing import Any

from gpu_kit import client
from gpu_kit.models import GEOMETRIES, prompts
from gpu_kit.stages import _fail_on_errors

PROBE_METHOD = (
    "gpu/probe_site/sitecustomize.py in the scheduler: Scheduler.run_batch of decode "
    "batches and ModelRunner.forward timed; torch.cuda.set_sync_debug_mode('warn') "
    "during the sync phase only"
)


def _probe_files(kit: Any, label: str) -> dict[str, Any]:
    out = {}
    for path in glob.glob(f"{kit.probe_out(label)}.*"):
        if path.endswith(".tmp"):
            continue
        try:
            data = json.loads(Path(path).read_text())
        except ValueError:
            continue  # being rewritten
        if any(data["figures"].values()):
            out.update(data["figures"])
    return out


def _summarize_probe(figures: dict[str, Any]) -> dict[str, Any]:
    table = {}
    for phase, per_bs in figures.items():
        if not phase.startswith(("time", "sync")):
            continue  # warm-up and idle steps
        for bs, f in per_bs.items():
            n = f["steps"]
            if not n:
                continue
            row = {"steps": n, "step_ms": round(1e3 * f["step_s"] / n, 3),
                   "forward_ms": round(1e3 * f["fwd_s"] / n, 3),
                   "host_outside_forward_ms": round(1e3 * (f["step_s"] - f["fwd_s"]) / n, 3),
                   "cpu_outside_forward_ms": round(1e3 * (f["step_cpu_s"] - f["fwd_cpu_s"]) / n, 3)}  # fmt: skip
            if f.get("results"):
                row["result_cpu_ms"] = round(1e3 * f["result_cpu_s"] / f["results"], 3)
            if f.get("loops"):
                row["loop_ms"] = round(1e3 * f["loop_s"] / f["loops"], 3)
                row["loop_cpu_ms"] = round(1e3 * f["loop_cpu_s"] / f["loops"], 3)
            if "launched_overlapped" in f:
                row["launched_overlapped"] = round(f["launched_overlapped"] / n, 3)
            if phase.startswith("sync"):
                row["syncs_per_step_in_run_batch"] = round(f["syncs_in_step"] / n, 2)
                row["syncs_per_step_elsewhere"] = round(f["syncs_elsewhere"] / n, 2)
                row["sync_sites"] = dict(sorted(f["sites"].items(), key=lambda kv: -kv[1])[:8])
            table[f"{phase} (batch {bs})"] = row
    return table


def _probe_server(kit: Any, spec: Any, server: Any, vocab: int) -> dict[str, Any]:
    """Per batch size: a warm-up round (not counted), a timed round, a sync round."""
    p = kit.p
    warmup = {}
    try:
        for bs in p["host_batches"]:
            # first decodes at a batch size compile (Triton, torch.compile of the host's
            # draft helpers for HYBRID): a warm-up round, not counted
            t0 = time.monotonic()
            kit.probe_ctl(spec.label, f"warmup:bs{bs}")
            client.generate_many(server.url, prompts(bs, 64, vocab, seed=50 + bs), 8)
            warmup[str(bs)] = round(time.monotonic() - t0, 1)
            for phase in ("time", "sync"):
                kit.probe_ctl(spec.label, f"{phase}:bs{bs}")
                ps = prompts(bs, 256, vocab, seed=bs + (7 if phase == "sync" else 0))
                outs = client.generate_many(server.url, ps, p["host_new_tokens"])
        kit.probe_ctl(spec.label, "off")
        client.generate(server.url, prompts(1, 16, vocab, seed=5)[0], 12)
        time.sleep(0.5)
        row = _summarize_probe(_probe_files(kit, spec.label))
        row["warmup_s"] = warmup
        row["spec"] = client.spec_figures(outs)
        return row
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "warmup_s": warmup}


def _probe_stage(kit: Any, rec: dict[str, Any], specs: dict[str, Any], timeout_s: Any) -> None:
    p = kit.p
    rec.update(geometry=p["host_geometry"], dtype=p["timing_dtype"], method=PROBE_METHOD)
    rec["results"] = {}
    vocab = GEOMETRIES[p["host_geometry"]]["vocab_size"]
    for name, spec, server in kit.each_server(specs, timeout_s=timeout_s):
        if isinstance(server, Exception):
            rec["results"][name] = {"error": str(server)[-2000:]}
        else:
            rec["results"][name] = _probe_server(kit, spec, server, vocab)
            rec["results"][name]["ready_s"] = server.ready_s
            rec["results"][name]["first_request_s"] = server.first_request_s
        kit.cell(name, rec["results"][name])
    failed = [k for k, v in rec["results"].items()
              if "error" in v or not any(x.startswith(("time", "sync")) for x in v)]  # fmt: skip
    if failed:
        raise RuntimeError(f"host-time figures missing for {failed}")


def stage_hosttime(kit: Any, rec: dict[str, Any]) -> None:
    """Host time per decode step outside the forwards and host syncs per step: SUFFIX,
    adaptive SUFFIX, the host's NGRAM (HYBRID: its own stage)."""
    p = kit.p
    geo, dtype, w = p["host_geometry"], p["timing_dtype"], p["host_width"]
    specs = {
        "SUFFIX": kit.spec("SUFFIX-probe", geo, dtype, algo="SUFFIX", width=w, probe=True),
        "SUFFIX-adaptive": kit.spec(
            "SUFFIX-adaptive-probe", geo, dtype, algo="SUFFIX", width=w, adaptive=True, probe=True
        ),  # fmt: skip
        "NGRAM": kit.spec("NGRAM-probe", geo, dtype, algo="NGRAM", width=w, probe=True),
    }
    rec["width"] = w
    _probe_stage(kit, rec, specs, None)


def stage_hybrid(kit: Any, rec: dict[str, Any]) -> None:
    """HYBRID (a 2-layer dummy draft, 3 steps, 4 draft tokens) alone: start-up (draft
    and draft-extend graph capture on triton), first request, host time per step."""
    p = kit.p
    spec = kit.spec("HYBRID-probe", p["host_geometry"], p["timing_dtype"], algo="HYBRID",
                    width=4, probe=True)  # fmt: skip
    rec.update(width=4, draft_geometry=p["draft_geometry"])
    _probe_stage(kit, rec, {"HYBRID": spec}, p["hybrid_ready_timeout_s"])
    server = kit.pool.live.get(spec)
    if server is not None:
        rec["capture_log"] = _capture_lines(server.log_tail(400))


def stage_toks(kit: Any, rec: dict[str, Any]) -> None:
    """Decode tok/s at fixed batch sizes with acceptance pinned by the host: a projection."""
    p = kit.p
    geo, dtype, acc = p["timing_geometry"], p["timing_dtype"], p["toks_accept_len"]
    sim = {"SGLANG_SIMULATE_ACC_LEN": str(acc)}
    specs = {
        "plain": kit.spec("plain-timing", geo, dtype),
        "SUFFIX-8": kit.spec("SUFFIX-8-sim", geo, dtype, algo="SUFFIX", width=8, env=sim),
        "SUFFIX-adaptive": kit.spec(
            "SUFFIX-adaptive-sim", geo, dtype, algo="SUFFIX", width=16, adaptive=True, env=sim
        ),  # fmt: skip
        "NGRAM-8": kit.spec("NGRAM-8-sim", geo, dtype, algo="NGRAM", width=8, env=sim),
    }
    rec.update(label="PROJECTION: acceptance pinned by SGLANG_SIMULATE_ACC_LEN, dummy weights",
               simulate_acc_len=acc, geometry=geo, dtype=dtype, table={})  # fmt: skip
    vocab = GEOMETRIES[geo]["vocab_size"]
    for name, _spec, server in kit.each_server(specs):
        if isinstance(server, Exception):
            rec["table"][name] = {"error": str(server)[-2000:]}
            kit.cell(name, rec["table"][name])
            continue
        for bs in p["toks_batches"]:
            ps = prompts(bs, 256, vocab, seed=500 + bs)
            try:
                cell = client.step_times(server.url, ps, p["toks_new_tokens"])
            except Exception as exc:  # noqa: BLE001
                cell = {"error": f"{type(exc).__name__}: {exc}"}
            rec["table"].setdefault(name, {})[str(bs)] = cell
            kit.cell(f"{name}/{bs}", cell)
    plain = rec["table"].get("plain", {})
    rec["vs_plain"] = {
        name: {bs: round(c["tok_s"] / plain[bs]["tok_s"], 3)
               for bs, c in row.items() if "tok_s" in c and "tok_s" in plain.get(bs, {})}
        for name, row in rec["table"].items() if name != "plain"
    }  # fmt: skip
    cells = {}
    for name, row in rec["table"].items():
        if "error" in row:  # the server never came up
            cells[name] = row
        else:
            cells |= {f"{name}/{bs}": cell for bs, cell in row.items()}
    _fail_on_errors("toks", cells)


def _capture_lines(log: str) -> list[str]:
    return [ln[-300:] for ln in log.splitlines() if re.search(r"[Cc]apture.*(end|mem)", ln)][-12:]


def stage_adaptive(kit: Any, rec: dict[str, Any]) -> None:
    """Start-up time and graph memory: fixed SUFFIX-16 vs adaptive SUFFIX-16, each alone."""
    p = kit.p
    geo, dtype = p["timing_geometry"], p["timing_dtype"]
    kit.pool.stop_all()
    rec.update(geometry=geo, dtype=dtype, servers={})
    for name, adaptive in (("SUFFIX-16", False), ("SUFFIX-adaptive-16", True)):
        before = kit.gpu_memory_used_mib()
        spec = kit.spec(f"{name}-alone", geo, dtype, algo="SUFFIX", width=16, adaptive=adaptive)
        server = kit.pool.get_many([spec])[spec.label]
        if isinstance(server, Exception):
            rec["servers"][name] = {"error": str(server)[-2000:]}
            kit.cell(name, rec["servers"][name])
            continue
        after = kit.gpu_memory_used_mib()
        rec["servers"][name] = {
            "ready_s": server.ready_s,
            "first_request_s": server.first_request_s,
            "gpu_memory_mib": None if before is None or after is None else after - before,
            "capture_log": _capture_lines(server.log_tail(400)),
        }
        kit.cell(name, rec["servers"][name])
        kit.pool.stop_all()
    _fail_on_errors("adaptive", rec["servers"])
