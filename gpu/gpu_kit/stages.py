"""The stages of ``gpu/run`` that need no probe: the environment, the host's imports,
greedy parity and the step-cost curve (the timing stages: ``stages_timing.py``). Each fills
its record as results arrive and writes each finished cell at once (``kit.cell``).

The ``kit`` argument is :class:`gpu_kit.kit.Kit`: ``spec(...)`` builds a server spec,
``each_server`` starts them (ready, then a first request) and yields them, ``p`` holds the
sizes of this run (GPU or dry)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_kit import client
from gpu_kit.install import kernel_probe_code, machine_facts, run_text
from gpu_kit.models import GEOMETRIES, prompts
from gpu_kit.pins import CARRY_PINS, IMAGE_PACKAGES

IMPORTCHECK = Path(__file__).with_name("importcheck.py")


def stage_env(kit: Any, rec: dict[str, Any]) -> None:
    """Machine facts and, on the GPU, sglang-kernel's rmsnorm checked against torch (the
    carried library or the fallback from then on); the plugin build's state."""
    env = kit.server_env(None)
    with ThreadPoolExecutor(2) as ex:
        facts = ex.submit(machine_facts, env)
        probe = None
        if not kit.dry:
            timeout = float(kit.p["kernel_probe_timeout_s"])
            probe = ex.submit(run_text, [sys.executable, "-c", kernel_probe_code()], timeout, env)
        rec["machine"] = facts.result()
        kit.cell("machine", rec["machine"])
        if probe is not None:
            raw = probe.result()
            try:
                rec["sgl_kernel_carried"] = json.loads(raw.splitlines()[-1])
                ok = rec["sgl_kernel_carried"]["rmsnorm_rel_err"] < 2e-2
            except (ValueError, IndexError, KeyError):
                rec["sgl_kernel_carried"] = {"error": raw[-3000:]}
                ok = False
            kit.kernel = "carried" if ok else "fallback"
            kit.remember("kernel", kit.kernel)
            rec["sgl_kernel_used"] = kit.kernel
            kit.cell("sgl_kernel", {"probe": rec["sgl_kernel_carried"], "used": kit.kernel})
    rec["carry"] = kit.carry_report
    rec["plugin"] = kit.plugin_status()  # not waited for: the first SUFFIX server waits


def stage_imports(kit: Any, rec: dict[str, Any]) -> None:
    """The host's CUDA-path modules imported in a server's environment (importcheck.py):
    real CUDA on the GPU; faked on CPU, and in the rehearsal with every distribution
    that is neither on the image nor carried hidden."""
    env = kit.server_env(None)
    report_path = kit.layout.work / "importcheck.json"
    report_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(IMPORTCHECK), "--out", str(report_path)]
    if kit.dry:
        cmd += ["--fake-cuda", "--placeholder", "torchvision", "--visible-placeholders"]
    if kit.rehearse:
        cmd += ["--image", str(IMAGE_PACKAGES), "--carry", str(CARRY_PINS)]
    raw = run_text(cmd, timeout=300, env=env)
    try:
        report = json.loads(report_path.read_text())
        rec["imports"] = {k: report.get(k) for k in ("ok", "failed", "missing_modules",
                                                     "cuda_reported", "sgl_kernel", "seconds",
                                                     "torch", "python", "hidden_refused")}  # fmt: skip
        rec["import_errors"] = {m: r for m, r in report["modules"].items() if not r["ok"]}
    except (OSError, ValueError):
        rec["imports"] = {"ok": False, "output_tail": raw[-4000:]}
    kit.cell("imports", rec["imports"])
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


def _compare(
    server: Any, ps: list[list[int]], new_tokens: int, base: list[dict[str, Any]],
    ref: list[list[int]],
) -> dict[str, Any]:  # fmt: skip
    """One algorithm's greedy outputs against plain's: identical, or where they part."""
    try:
        outs = client.generate_many(server.url, ps, new_tokens)
    except Exception as exc:  # noqa: BLE001 - recorded per algorithm
        return {"identical": None, "error": f"{type(exc).__name__}: {exc}",
                "log_tail": server.log_tail()}  # fmt: skip
    mismatches = []
    for i, (o, r) in enumerate(zip(outs, ref, strict=True)):
        pos = _first_mismatch(o["output_ids"], r)
        if pos is not None:
            mismatches.append({"prompt": i, "position": pos, "plain_top2_gap": _gap(base[i], pos),
                               "plain": r[pos : pos + 4], "spec": o["output_ids"][pos : pos + 4]})  # fmt: skip
    return {"identical": not mismatches, "mismatches": mismatches[:8], **client.spec_figures(outs)}


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
            kit.cell("plain", {"ready_s": server.ready_s, "outputs": len(ref)})
            continue
        row: dict[str, Any] = {}
        rec["results"][label] = row
        if isinstance(server, Exception):
            row.update(identical=None, error=str(server)[-3000:])
        else:
            row.update(_compare(server, ps, p["parity_new_tokens"], base, ref))
        kit.cell(label, row)
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

    def measure(w: int, server: Any, bs: int) -> None:
        ps = prompts(bs, p["curve_prompt_len"], vocab, seed=1000 * w + bs)
        try:
            cell = client.step_times(server.url, ps, p["curve_new_tokens"])
        except Exception as exc:  # noqa: BLE001
            rec["errors"][f"{w}x{bs}"] = f"{type(exc).__name__}: {exc}"
            kit.cell(f"{w}x{bs}", {"error": rec["errors"][f"{w}x{bs}"]})
            return
        rec["step_ms"].setdefault(str(w), {})[str(bs)] = cell
        kit.cell(f"{w}x{bs}", cell)
        _write_calibration(kit, rec)  # after every cell: a cut stage keeps its ratios

    live: dict[int, Any] = {}
    for w, spec, server in kit.each_server(specs, keep=(specs[1],)):
        rec["ready_s"][spec.label] = getattr(server, "ready_s", None)
        if isinstance(server, Exception):
            rec["errors"][str(w)] = str(server)[-2000:]
            kit.cell(str(w), {"error": rec["errors"][str(w)]})
            continue
        if len(specs) > kit.wave_size():  # waves: this server now, then the next wave
            for bs in p["curve_batches"]:
                measure(w, server, bs)
        else:
            live[w] = server
    # one wave: batch by batch across widths, so a stage cut early still has ratios
    for bs in p["curve_batches"]:
        for w, server in live.items():
            measure(w, server, bs)
    _write_calibration(kit, rec)
    if rec["errors"]:
        raise RuntimeError(f"curve cells failed: {sorted(rec['errors'])}")


def _write_calibration(kit: Any, rec: dict[str, Any]) -> None:
    plain = rec["step_ms"].get("1", {})
    rec["ratio"] = {
        str(w): {bs: round(c["ms_per_token"] / plain[bs]["ms_per_token"], 4)
                 for bs, c in cells.items() if bs in plain}
        for w, cells in rec["step_ms"].items()
    }  # fmt: skip
    kit.write_json("calibration.json", {"what": "verify step time / plain decode step time",
                                        "device": kit.device_name(), "geometry": rec["geometry"],
                                        "dtype": rec["dtype"], "method": rec["method"],
                                        "ratio": rec["ratio"]})  # fmt: skip


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
