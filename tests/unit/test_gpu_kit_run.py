"""gpu/run (the GPU carry kit's runner): the time guard and failure recording, the stages
end to end against a fake ``launch_server``, the scheduler probe, the plugin's source
fallback and the server commands (no GPU, no sglang server, no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "gpu"
sys.path.insert(0, str(GPU))

from gpu_kit import guard, results  # noqa: E402
from gpu_kit.models import GEOMETRIES, prompts, weight_bytes  # noqa: E402

FAKE_SERVER = Path(__file__).with_name("gpu_kit_fake_server.py")


def _run(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": ":".join(str(p) for p in paths), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


# -- time guard and failure recording -------------------------------------------------
def test_stages_record_failures_skip_and_stop_at_the_guard(tmp_path: Path) -> None:
    def ok(ctx, rec):
        rec["figure"] = 1

    def boom(ctx, rec):
        raise ValueError("broken on purpose")

    def slow(ctx, rec):
        rec["partial"] = "kept"
        time.sleep(10)

    class Ctx:
        def failure_details(self):
            return {"log": "tail of a server log"}

    res = results.Results(tmp_path)
    stages = [guard.Stage("a", ok, 0), guard.Stage("b", boom, 0), guard.Stage("c", ok, 99),
              guard.Stage("d", ok, 0, needs=("b",)), guard.Stage("e", slow, 0),
              guard.Stage("f", ok, 0)]  # fmt: skip
    cleaned = []
    t0 = time.monotonic()
    status = guard.run_stages(stages, Ctx(), res, guard.Budget(1.5),
                              cleanup=lambda: cleaned.append(1), log=lambda m: None)  # fmt: skip
    assert time.monotonic() - t0 < 5
    assert status == {"a": "passed", "b": "failed", "c": "skipped", "d": "skipped",
                      "e": "time-up", "f": "skipped"}  # fmt: skip
    data = json.loads((tmp_path / "results.json").read_text())
    st = data["stages"]
    assert st["a"]["figure"] == 1 and st["b"]["error"] == "ValueError: broken on purpose"
    assert "boom" in st["b"]["traceback"] and st["b"]["details"] == {"log": "tail of a server log"}
    assert "time" in st["c"]["reason"] and "needs" in st["d"]["reason"]
    assert st["e"]["partial"] == "kept" and "time guard" in st["e"]["error"]
    assert st["f"]["reason"] == "time guard fired" and len(cleaned) == 3  # stages that ran


# -- gpu/run end to end against fake servers ------------------------------------------
FAST = ["--set", "curve_new_tokens=64", "--set", "toks_new_tokens=48", "--set",
        "host_new_tokens=6", "--set", "parity_new_tokens=12", "--set", "ready_timeout_s=30"]  # fmt: skip


def _run_kit(
    tmp_path: Path, stages: str, env: dict[str, str] | None = None, budget: str = "300"
) -> dict:
    out = tmp_path / "out"
    cmd = [sys.executable, str(GPU / "run"), "--dry", "--out", str(out), "--work",
           str(tmp_path / "work"), "--stages", stages, "--budget", budget, "--reserve", "5", "--min-stage-seconds", "5",
           "--server-cmd", f"{sys.executable} {FAKE_SERVER}", *FAST]  # fmt: skip
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, **(env or {})},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert {"results.json", "run.log", "server-logs.txt"} <= {f.name for f in out.iterdir()}
    return json.loads((out / "results.json").read_text())


def test_run_stages_against_fake_servers(tmp_path: Path) -> None:
    data = _run_kit(tmp_path, "parity,curve,hosttime,toks,adaptive")
    st = data["stages"]
    assert data["meta"]["status"] == dict.fromkeys(
        ["parity", "curve", "hosttime", "toks", "adaptive"], "passed"
    )
    assert (
        st["parity"]["all_identical"]
        and st["parity"]["results"]["SUFFIX-4"]["accept_length"] == 2.0
    )
    ratio = st["curve"]["ratio"]
    assert ratio["1"]["1"] == 1.0 and ratio["4"]["2"] > 1.0
    host = st["hosttime"]["results"]["SUFFIX"]
    sync = next(v for k, v in host.items() if k.startswith("sync"))
    assert sync["syncs_per_step_in_run_batch"] == 2.0 and sync["host_outside_forward_ms"] > 0
    assert (
        st["toks"]["label"].startswith("PROJECTION")
        and st["toks"]["table"]["plain"]["1"]["tok_s"] > 0
    )
    assert set(st["adaptive"]["servers"]) == {"SUFFIX-16", "SUFFIX-adaptive-16"}
    assert (tmp_path / "out" / "calibration.json").is_file()


def test_run_in_waves_of_servers(tmp_path: Path) -> None:
    out = tmp_path / "o"
    cmd = [sys.executable, str(GPU / "run"), "--dry", "--out", str(out), "--work",
           str(tmp_path / "w"), "--stages", "parity,curve", "--budget", "120", "--reserve", "5",
           "--min-stage-seconds", "5", "--server-cmd", f"{sys.executable} {FAKE_SERVER}",
           *FAST, "--set", "max_concurrent_servers=2"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["status"] == {"parity": "passed", "curve": "passed"}
    assert set(data["stages"]["parity"]["results"]) == {"SUFFIX-4", "SUFFIX-adaptive", "NGRAM"}
    log = (out / "server-logs.txt").read_text()
    assert log.count("=====") == len(data["meta"]["servers"])


def test_run_records_a_failed_server_and_goes_on(tmp_path: Path) -> None:
    data = _run_kit(tmp_path, "parity,curve", {"FAKE_SERVER_EXIT_ALGO": "NGRAM",
                                               "FAKE_SERVER_DIFFER_ALGO": "SUFFIX"})  # fmt: skip
    st = data["stages"]
    assert st["parity"]["status"] == "failed" and st["curve"]["status"] == "failed"
    res = st["parity"]["results"]
    assert res["NGRAM"]["identical"] is None and "exited with code 3" in res["NGRAM"]["error"]
    assert (
        res["SUFFIX-4"]["identical"] is False and res["SUFFIX-4"]["mismatches"][0]["position"] == 5
    )
    assert "NGRAM" in st["parity"]["error"] and "DIFFERS" in st["parity"]["error"]
    assert st["curve"]["errors"] and "1" in st["curve"]["step_ms"]  # plain measured, NGRAM failed


def test_geometries_and_prompts() -> None:
    assert 7.9e9 < weight_bytes("llama3-8b", 1) < 8.1e9
    assert 1.2e9 < weight_bytes("llama3-1b", 1) < 1.3e9
    ps = prompts(3, 40, GEOMETRIES["tiny"]["vocab_size"], seed=0)
    assert len(ps) == 3 and all(len(p) == 40 for p in ps) and ps[0] != ps[1]
    assert ps[0][:10] == ps[0][10:20]  # a repeated segment: drafters find matches


def test_probe_registers_hooks_when_the_host_imports_its_registry(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    reg = fake / "sglang" / "srt" / "plugins"
    reg.mkdir(parents=True)
    for d in (fake / "sglang", fake / "sglang" / "srt", reg):
        (d / "__init__.py").write_text("")
    (reg / "hook_registry.py").write_text(
        "import enum\nclass HookType(enum.Enum):\n    AROUND = 'around'\n"
        "class HookRegistry:\n    hooks = []\n    @classmethod\n"
        "    def register(cls, target, fn, kind):\n        cls.hooks.append(target)\n"
    )
    nxt = tmp_path / "next"
    nxt.mkdir()
    (nxt / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = '1'\n")
    code = ("import os, sys\nassert 'sglang' not in sys.modules\n"
            "from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "print(os.environ.get('CHAINED'), sorted(h.rsplit('.', 2)[-2] for h in HookRegistry.hooks))")  # fmt: skip
    paths = [GPU / "probe_site", fake, nxt]
    p = _run(code, *paths)
    assert p.stdout.strip() == "1 []", p.stderr  # no GPU_KIT_PROBE_OUT: inert, still chains
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True,
        env={"PYTHONPATH": ":".join(map(str, paths)), "GPU_KIT_PROBE_OUT": str(tmp_path / "o")},
    )  # fmt: skip
    assert p.stdout.strip() == "1 ['ModelRunner', 'Scheduler', 'Scheduler']", p.stderr


def test_source_install_fallback_exposes_the_entry_point(tmp_path: Path) -> None:
    from gpu_kit.install import Layout, pythonpath, source_install

    layout = Layout(tmp_path / "work", tmp_path / "carry")
    report = source_install(layout)
    eps = next(layout.plugin_site.glob("*.dist-info")) / "entry_points.txt"
    assert "[sglang.srt.plugins]" in eps.read_text()
    assert "sglang.srt.plugins" in report["entry_points"]
    path = pythonpath(layout, None, "fallback", dry=False)
    assert str(REPO) in path and path[-1].endswith("shims/common")
    assert any(p.endswith("sgl_kernel_fallback") for p in path)


def test_every_gpu_server_command_parses_with_the_hosts_arguments(tmp_path: Path) -> None:
    """The lent machine's server commands (GPU mode, not dry) go through SGLang's own CLI
    parser: a misspelt flag or a value outside its choices fails here, not there."""
    import argparse

    from gpu_kit import stages, stages_timing
    from gpu_kit.kit import Kit
    from gpu_kit.servers import ServerError

    server_args = pytest.importorskip("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    ns = argparse.Namespace(dry=False, set=[], work=tmp_path / "w", carry=tmp_path / "c",
                            server_cmd=None)  # fmt: skip
    kit = Kit(ns, tmp_path, results.Results(tmp_path))
    seen = []

    class Recorder:
        live: dict = {}
        history: list = []

        def get_many(self, specs, timeout_s=None):
            seen.extend(specs)
            return {s.label: ServerError("not started (test)") for s in specs}

        def stop_all(self):
            return None

    kit.pool = Recorder()
    for fn in (stages.stage_parity, stages.stage_curve, stages_timing.stage_hosttime,
               stages_timing.stage_hybrid, stages_timing.stage_toks,
               stages_timing.stage_adaptive):  # fmt: skip
        try:
            fn(kit, {})
        except (ServerError, RuntimeError):
            pass
    labels = {s.label for s in seen}
    assert {"plain", "SUFFIX-16", "SUFFIX-adaptive", "NGRAM", "NGRAM-16-acc1", "HYBRID-probe",
            "SUFFIX-8-sim", "SUFFIX-adaptive-16-alone"} <= labels  # fmt: skip
    for spec in seen:
        parsed = parser.parse_args(list(spec.args))
        assert parsed.attention_backend == "triton" and parsed.load_format == "dummy"
        assert parsed.cuda_graph_backend_prefill == "disabled"
        if spec.plugin:
            assert parsed.speculative_algorithm in ("SUFFIX", "HYBRID")
    plain = next(s for s in seen if s.label == "plain")
    # fp32 parity servers take the pure-torch norms (sglang-kernel 0.4.5: no fp32 rmsnorm)
    assert dict(plain.env) == {"TRITON_F32_DEFAULT": "ieee", "GPU_KIT_SGL_KERNEL": "fallback"}
    kit.kernel = "carried"
    fp32_path = kit.server_env(plain)["PYTHONPATH"]
    bf16 = next(s for s in seen if s.label == "plain-timing")
    bf16_env = kit.server_env(bf16)
    assert "sgl_kernel_fallback" in fp32_path and "sgl_kernel_site" not in fp32_path
    assert "sgl_kernel_site" in bf16_env["PYTHONPATH"]
    assert "sgl_kernel_fallback" not in bf16_env["PYTHONPATH"]
    assert bf16_env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"


def test_site_overrides_replace_modules_without_touching_a_linked_original(
    tmp_path: Path,
) -> None:
    """gpu/run overlays gpu/shims/site_overrides on the carried sglang (modules the lent
    image cannot import: cutlass-dsl's dual GEMM, FlashMLA); a hard-linked tree's original
    file must stay as it was."""
    import importlib.util

    from gpu_kit.install import SHIMS, Layout, overlay_site

    layout = Layout(tmp_path / "work", tmp_path / "carry")
    original = tmp_path / "orig.py"
    original.write_text("import cutlass\n")
    gemm = layout.site / "sglang/kernels/ops/gemm"
    (layout.site / "sglang/kernels/ops/attention").mkdir(parents=True)
    gemm.mkdir(parents=True)
    os.link(original, gemm / "cutedsl_dual_gemm.py")
    done = overlay_site(layout)
    assert done == ["sglang/kernels/ops/attention/flash_mla_interface.py",
                    "sglang/kernels/ops/gemm/cutedsl_dual_gemm.py"]  # fmt: skip
    assert original.read_text() == "import cutlass\n"
    for rel in done:
        spec = importlib.util.spec_from_file_location("m", layout.site / rel)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if rel.endswith("cutedsl_dual_gemm.py"):
            # what sglang's DualGemm._select_mode reads: no dual GEMM off SM100
            assert mod.DualGemmQuantMode.UNQUANT.is_quantized is False
            assert mod.DualGemmQuantMode.DYNAMIC_PER_TOKEN.is_dynamic is True
            assert mod.can_use_dual_gemm(16, 2048, 8192, mod.DualGemmQuantMode.UNQUANT) is False
        else:
            with pytest.raises(RuntimeError, match="FlashMLA"):
                mod.get_mla_metadata()
    assert (SHIMS / "site_overrides").is_dir()


def test_time_guard_stops_a_hanging_stage_and_its_servers(tmp_path: Path) -> None:
    t0 = time.monotonic()
    data = _run_kit(tmp_path, "parity,toks", {"FAKE_SERVER_HANG_ALGO": "NGRAM"}, budget="15")
    assert time.monotonic() - t0 < 45
    st = data["stages"]
    assert st["parity"]["status"] == "time-up" and "time guard" in st["parity"]["error"]
    assert st["parity"]["results"]["SUFFIX-4"]["identical"] is True  # kept before the hang
    assert st["toks"]["status"] == "skipped"
    assert all(row["ready_s"] is not None for row in data["meta"]["servers"])


def test_servers_start_outside_the_repository(tmp_path: Path) -> None:
    """``python -m`` puts the working directory first on sys.path: a server started in the
    repository root imported the source tree's plugin (no compiled suffix core) instead of
    the one gpu/run built (found on the second GPU run)."""
    from gpu_kit.servers import Server, ServerSpec

    code = "import os, sys; print('CWD=' + os.getcwd()); sys.stdout.flush()"
    server = Server(ServerSpec("cwd", ()), [sys.executable, "-c", code, "--"], dict(os.environ),
                    tmp_path / "logs" / "cwd.log")  # fmt: skip
    server.launch()
    server.proc.wait(timeout=60)
    assert f"CWD={tmp_path / 'logs'}" in server.log_path.read_text()


def test_summary_names_what_killed_each_server(tmp_path: Path) -> None:
    """gpu/gpu_kit/summary.py: the committed GPU results keep each stage's status and, per
    server, the exception that ended it (not the kit's own 'exited' line)."""
    from gpu_kit import summary

    run = tmp_path / "run"
    run.mkdir()
    tail = "Traceback (most recent call last):\n  File x\nValueError: got Int8\n"
    results = {
        "meta": {"started": "t0", "argv": [], "servers": [
            {"label": "plain", "error": f"plain: exited with code -9\n{tail}"},
            {"label": "NGRAM", "error": None}]},
        "order": ["env", "curve", "toks"],
        "stages": {
            "env": {"status": "passed", "seconds": 1.0, "machine": {"nvidia_smi": "h\nH100, 580"}},
            "curve": {"status": "failed", "seconds": 2.0, "error": "RuntimeError: cells failed"},
            "toks": {"status": "skipped", "reason": "time"},
        },
    }  # fmt: skip
    (run / "results.json").write_text(json.dumps(results))
    (run / "server-logs.txt").write_text(
        "===== plain.log (10 chars, last 300 lines)\n"
        "[x] Engine startup timings (s): load_weight=0.1, cuda_graph={decode=31.8}\n"
    )
    out = tmp_path / "s.json"
    assert summary.main([str(run), "--out", str(out), "--note", "a finding"]) == 0
    doc = json.loads(out.read_text())
    r = doc["runs"][0]
    assert doc["findings"] == ["a finding"] and r["device"] == ["H100, 580"]
    assert r["server_failures"] == {"plain": "ValueError: got Int8"}
    assert r["stages"]["curve"] == {"status": "failed", "seconds": 2.0,
                                    "ended_by": "RuntimeError: cells failed"}  # fmt: skip
    assert r["stages"]["toks"]["why"] == "time"
    assert r["startup_timings"] == {"plain": "load_weight=0.1, cuda_graph={decode=31.8}"}
