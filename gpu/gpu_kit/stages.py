"""The stages of ``gpu/run``, in priority order. Each fills its record as results arrive
(``kit.save()`` rewrites results.json) and leaves the servers a later stage still needs.

The ``kit`` argument is :class:`gpu_kit.run.Kit`: ``spec(...)`` builds a server spec,
``pool`` starts and keeps servers, ``p`` holds the sizes of this run (GPU or dry)."""

from __future__ import annotations

import glob
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_kit import client
from gpu_kit.install import kernel_probe_code, machine_facts, run_text
from gpu_kit.models import GEOMETRIES, prompts

IMPORTCHECK = Path(__file__).with_name("importcheck.py")


def stage_env(kit: Any, rec: dict[str, Any]) -> None:
    """Machine facts, the carry, the plugin build, sgl_kernel, the host's CUDA imports."""
    env = kit.server_env(None)
    rec["machine"] = machine_facts(env)
    rec["carry"] = kit.carry_report
    kit.save()
    if not kit.dry:
        raw = run_text([sys.executable, "-c", kernel_probe_code()], timeout=180, env=env)
        try:
            rec["sgl_kernel_carried"] = json.loads(raw.splitlines()[-1])
            ok = rec["sgl_kernel_carried"]["rmsnorm_rel_err"] < 2e-2
        except (ValueError, IndexError, KeyError):
            rec["sgl_kernel_carried"] = {"error": raw[-3000:]}
            ok = False
        kit.kernel = "carried" if ok else "fallback"
        rec["sgl_kernel_used"] = kit.kernel
        env = kit.server_env(None)
    report_path = kit.layout.work / "importcheck.json"
    report_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(IMPORTCHECK), "--out", str(report_path)]
    if kit.dry:
        cmd += ["--fake-cuda", "--placeholder", "torchvision", "--visible-placeholders"]
    raw = run_text(cmd, timeout=300, env=env)
    try:
        report = json.loads(report_path.read_text())
        rec["imports"] = {k: report[k] for k in ("ok", "failed", "missing_modules",
                                                  "cuda_reported", "sgl_kernel", "seconds")}  # fmt: skip
        rec["import_errors"] = {m: r for m, r in report["modules"].items() if not r["ok"]}
    except (OSError, ValueError):
        rec["imports"] = {"ok": False, "output_tail": raw[-4000:]}
    kit.save()
    rec["plugin"] = kit.plugin_status()  # not waited for: the first SUFFIX server waits
    if not rec["imports"].get("ok"):
        raise RuntimeError(f"host CUDA-path imports failed: {rec['imports'].get('failed')}")


def _first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _gap(out: dict[str, Any], pos: int) -> float | None:
    """Top-1 minus top-2 logprob of the plain server at output position ``pos``."""
    tops = (out.get("meta_info") or {}).get("output_top_logprobs") or []
    if pos >= len(tops) or not tops[pos] or len(tops[pos]) < 2:
        return None
    return round(float(tops[pos][0][0]) - float(tops[pos][1][0]), 8)


def stage_parity(kit: Any, rec: dict[str, Any]) -> None:
    """Greedy output of SUFFIX (widths), adaptive SUFFIX and NGRAM against plain, fp32."""
    p = kit.p
    geo = p["parity_geometry"]
    # fp32 dots in Triton kernels default to tf32 on Hopper; ieee keeps fp32 arithmetic
    env = {} if kit.dry else {"TRITON_F32_DEFAULT": "ieee"}
    extra = ("--enable-deterministic-inference",) if p["parity_deterministic"] else ()
    common = {"env": env, "gpu_path": True, "extra": extra, "graph_bs": p["parity_graph_bs"],
              "max_total_tokens": p["parity_max_total_tokens"]}  # fmt: skip
    specs = {"plain": kit.spec("plain", geo, "float32", **common)}
    for w in p["parity_widths"]:
        specs[f"SUFFIX-{w}"] = kit.spec(f"SUFFIX-{w}", geo, "float32", algo="SUFFIX", width=w,
                                        **common)  # fmt: skip
    # The widest SUFFIX verifies ragged at every batch (the triton route's eager ragged
    # steps; by default they start above the captured graph sizes, which parity never
    # reaches).
    widest = f"SUFFIX-{max(p['parity_widths'])}"
    specs[widest] = specs[widest].with_env(SGLANG_SPEC_EXT_RAGGED_EAGER="always")
    specs["SUFFIX-adaptive"] = kit.spec("SUFFIX-adaptive", geo, "float32", algo="SUFFIX",
                                        width=max(p["parity_widths"]), adaptive=True, **common)  # fmt: skip
    specs["NGRAM"] = kit.spec("NGRAM", geo, "float32", algo="NGRAM", width=8, **common)
    rec["geometry"], rec["dtype"], rec["server_env"] = geo, "float32", env
    rec["extra_args"] = list(extra)
    if not kit.dry:
        rec["sgl_kernel"] = (
            "the kit's fallback (pure-torch norms): sglang-kernel 0.4.5 has no fp32 rmsnorm"
        )
    rec["gpu_path"] = "CUDA graphs + overlap (host defaults)" if not kit.dry else kit.dry_path
    rec["ready_s"], rec["results"] = {}, {}
    vocab = GEOMETRIES[geo]["vocab_size"]
    ps = prompts(p["parity_prompts"], p["parity_prompt_len"], vocab, seed=1)
    base: list[dict[str, Any]] = []
    ref: list[list[int]] = []
    for label, _spec, server in kit.each_server(specs):
        rec["ready_s"][label] = getattr(server, "ready_s", None)
        if label == "plain":  # first: the reference
            if isinstance(server, Exception):
                raise server
            base = client.generate_many(server.url, ps, p["parity_new_tokens"],
                                        return_logprob=True, top_logprobs_num=2)  # fmt: skip
            ref = [o["output_ids"] for o in base]
            continue
        row: dict[str, Any] = {}
        rec["results"][label] = row
        if isinstance(server, Exception):
            row.update(identical=None, error=str(server)[-3000:])
            kit.save()
            continue
        try:
            outs = client.generate_many(server.url, ps, p["parity_new_tokens"])
        except Exception as exc:  # noqa: BLE001 - recorded per algorithm
            row.update(identical=None, error=f"{type(exc).__name__}: {exc}",
                       log_tail=server.log_tail())  # fmt: skip
            kit.save()
            continue
        mismatches = []
        for i, (o, r) in enumerate(zip(outs, ref, strict=True)):
            pos = _first_mismatch(o["output_ids"], r)
            if pos is not None:
                mismatches.append({"prompt": i, "position": pos, "plain_top2_gap": _gap(base[i], pos),
                                   "plain": r[pos : pos + 4], "spec": o["output_ids"][pos : pos + 4]})  # fmt: skip
        row.update(identical=not mismatches, mismatches=mismatches[:8], **client.spec_figures(outs))
        kit.save()
    rec["all_identical"] = all(r.get("identical") for r in rec["results"].values())
    if not rec["all_identical"]:
        raise RuntimeError("parity: " + ", ".join(
            f"{k}={'error' if r.get('identical') is None else 'DIFFERS'}"
            for k, r in rec["results"].items() if not r.get("identical")))  # fmt: skip


def stage_curve(kit: Any, rec: dict[str, Any]) -> None:
    """Verify step time over plain decode (host NGRAM, acceptance pinned to 1 token)."""
    p = kit.p
    geo, dtype = p["timing_geometry"], p["timing_dtype"]
    sim = {"SGLANG_SIMULATE_ACC_LEN": "1.0"}
    specs = {1: kit.spec("plain-timing", geo, dtype)}
    for w in p["curve_widths"]:
        specs[w] = kit.spec(f"NGRAM-{w}-acc1", geo, dtype, algo="NGRAM", width=w, env=sim)
    rec.update(geometry=geo, dtype=dtype, method=(
        "streamed greedy requests; every step commits one token per request, so the "
        "median over streams of milliseconds per token while every request of the batch "
        "decodes is the step time; verify = host NGRAM at width W with "
        "SGLANG_SIMULATE_ACC_LEN=1; width 1 = plain decode"))  # fmt: skip
    rec["ready_s"], rec["step_ms"], rec["errors"] = {}, {}, {}
    vocab = GEOMETRIES[geo]["vocab_size"]
    for w, spec, server in kit.each_server(specs, keep=(specs[1],)):
        rec["ready_s"][spec.label] = getattr(server, "ready_s", None)
        if isinstance(server, Exception):
            rec["errors"][str(w)] = str(server)[-2000:]
            continue
        client.generate(server.url, prompts(1, 64, vocab, seed=99)[0], 8)  # warm-up
        for bs in p["curve_batches"]:
            ps = prompts(bs, p["curve_prompt_len"], vocab, seed=1000 * w + bs)
            try:
                cell = client.step_times(server.url, ps, p["curve_new_tokens"])
            except Exception as exc:  # noqa: BLE001
                rec["errors"][f"{w}x{bs}"] = f"{type(exc).__name__}: {exc}"
                continue
            rec["step_ms"].setdefault(str(w), {})[str(bs)] = cell
            kit.save()
    plain = rec["step_ms"].get("1", {})
    rec["ratio"] = {
        str(w): {bs: round(c["ms_per_token"] / plain[bs]["ms_per_token"], 4)
                 for bs, c in cells.items() if bs in plain}
        for w, cells in rec["step_ms"].items()
    }  # fmt: skip
    kit.write_json("calibration.json", {"what": "verify step time / plain decode step time",
                                        "device": kit.device_name(), "geometry": geo,
                                        "dtype": dtype, "method": rec["method"],
                                        "ratio": rec["ratio"]})  # fmt: skip
    if rec["errors"]:
        raise RuntimeError(f"curve cells failed: {sorted(rec['errors'])}")


def _probe_files(kit: Any, label: str) -> dict[str, Any]:
    out = {}
    for path in glob.glob(f"{kit.probe_out(label)}.*"):
        if path.endswith(".tmp"):
            continue
        data = json.loads(Path(path).read_text())
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


def stage_hosttime(kit: Any, rec: dict[str, Any]) -> None:
    """Host time per decode step outside the forwards and host syncs per step."""
    p = kit.p
    geo, dtype = p["host_geometry"], p["timing_dtype"]
    w = p["host_width"]
    specs = {
        "SUFFIX": kit.spec("SUFFIX-probe", geo, dtype, algo="SUFFIX", width=w, probe=True),
        "SUFFIX-adaptive": kit.spec(
            "SUFFIX-adaptive-probe", geo, dtype, algo="SUFFIX", width=w, adaptive=True, probe=True
        ),  # fmt: skip
        "NGRAM": kit.spec("NGRAM-probe", geo, dtype, algo="NGRAM", width=w, probe=True),
        "HYBRID": kit.spec("HYBRID-probe", geo, dtype, algo="HYBRID", width=4, probe=True),
    }
    rec.update(geometry=geo, dtype=dtype, width=w, method=(
        "gpu/probe_site/sitecustomize.py in the scheduler: Scheduler.run_batch of decode "
        "batches and ModelRunner.forward timed; torch.cuda.set_sync_debug_mode('warn') "
        "during the sync phase only"))  # fmt: skip
    rec["results"] = {}
    vocab = GEOMETRIES[geo]["vocab_size"]
    for name, spec, server in kit.each_server(specs):
        if isinstance(server, Exception):
            rec["results"][name] = {"error": str(server)[-2000:]}
            continue
        warmup = {}
        try:
            for bs in p["host_batches"]:
                # first decodes at a batch size compile (Triton, torch.compile of the
                # host's draft helpers for HYBRID): a warm-up round, not counted
                t0 = time.monotonic()
                kit.probe_ctl(spec.label, f"warmup:bs{bs}")
                client.generate_many(server.url, prompts(bs, 64, vocab, seed=50 + bs), 8)
                warmup[str(bs)] = round(time.monotonic() - t0, 1)
                for phase in ("time", "sync"):
                    kit.probe_ctl(spec.label, f"{phase}:bs{bs}")
                    ps = prompts(bs, 256, vocab, seed=bs + (7 if phase == "sync" else 0))
                    client.generate_many(server.url, ps, p["host_new_tokens"])
            kit.probe_ctl(spec.label, "off")
            client.generate(server.url, prompts(1, 16, vocab, seed=5)[0], 12)
            time.sleep(0.5)
            rec["results"][name] = _summarize_probe(_probe_files(kit, spec.label))
            rec["results"][name]["warmup_s"] = warmup
        except Exception as exc:  # noqa: BLE001
            rec["results"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        kit.save()
    failed = [k for k, v in rec["results"].items()
              if "error" in v or not any(x.startswith(("time", "sync")) for x in v)]  # fmt: skip
    if failed:
        raise RuntimeError(f"host-time figures missing for {failed}")


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
            continue
        client.generate(server.url, prompts(1, 64, vocab, seed=98)[0], 8)
        for bs in p["toks_batches"]:
            ps = prompts(bs, 256, vocab, seed=500 + bs)
            try:
                cell = client.step_times(server.url, ps, p["toks_new_tokens"])
            except Exception as exc:  # noqa: BLE001
                cell = {"error": f"{type(exc).__name__}: {exc}"}
            rec["table"].setdefault(name, {})[str(bs)] = cell
            kit.save()
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
            continue
        after = kit.gpu_memory_used_mib()
        rec["servers"][name] = {
            "ready_s": server.ready_s,
            "gpu_memory_mib": None if before is None or after is None else after - before,
            "capture_log": _capture_lines(server.log_tail(400)),
        }
        kit.pool.stop_all()
        kit.save()
    _fail_on_errors("adaptive", rec["servers"])


def _fail_on_errors(stage: str, cells: dict[str, Any]) -> None:
    """A stage whose cells hold errors is failed, not passed (the first GPU run recorded
    'toks' and 'adaptive' as passed with every server dead); its figures stay."""
    bad = sorted(k for k, v in cells.items() if isinstance(v, dict) and "error" in v)
    if bad:
        raise RuntimeError(f"{stage}: cells failed: {bad}")


def gpu_memory_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout  # fmt: skip
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
