"""The GPU carry kit (gpu/): pack's planning and checks with no download, the shims, and
run's stages, time guard and failure recording against a fake server (no GPU, no sglang
server, no network)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "gpu"
sys.path.insert(0, str(GPU))

from gpu_kit import guard, pack, pins, wheels  # noqa: E402
from gpu_kit.models import GEOMETRIES, prompts, weight_bytes  # noqa: E402

FAKE_SERVER = Path(__file__).with_name("gpu_kit_fake_server.py")


# -- pins and plan --------------------------------------------------------------------
def test_pins_parse_and_reject() -> None:
    got = pins.parse_pins("# c\nFoo_Bar==1.2  # why\n\nbaz==0.1.post7\n")
    assert [(p.key, p.version) for p in got] == [("foo-bar", "1.2"), ("baz", "0.1.post7")]
    with pytest.raises(ValueError, match="twice"):
        pins.parse_pins("a==1\nA==2\n")
    with pytest.raises(ValueError, match="NAME==VERSION"):
        pins.parse_pins("a>=1\n")


def test_carry_pins_are_versioned_and_not_on_the_image_unless_overridden() -> None:
    carried = {p.key: p.version for p in pins.load_pins()}
    assert carried["sglang"] == "0.5.23"
    image = pins.load_image()
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"
    # carried although the image has it: only to get another version, and said so
    overlap = set(carried) & set(image)
    assert overlap == {"typing-extensions"}
    assert "4.16" in (GPU / "carry.txt").read_text().split("typing-extensions==")[1][:6]


def test_plan_lists_every_wheel_without_network(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl").write_bytes(b"")
    plan = pack.plan(pins.load_pins(), True, cache)
    specs = [r["spec"] for r in plan["wheels"]]
    assert specs[0] == "sglang==0.5.23" and specs[-1] == "sglang-kernel==0.4.5"
    assert "sglang==0.5.23" not in plan["to_download"]  # cached
    assert len(plan["to_download"]) == len(specs) - 1
    cmd = plan["command"]
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version", "3.12"):
        assert flag in cmd
    assert "manylinux_2_34_x86_64" in cmd and "manylinux2014_x86_64" in cmd
    assert cmd[-len(plan["to_download"]) :] == plan["to_download"]


def test_pack_plan_cli_prints_json() -> None:
    out = subprocess.run([sys.executable, str(GPU / "pack"), "--plan", "--no-sgl-kernel"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    plan = json.loads(out)
    assert plan["sgl_kernel"] is False
    assert not any(r["spec"].startswith("sglang-kernel") for r in plan["wheels"])


# -- wheels ---------------------------------------------------------------------------
def _wheel(
    path: Path, name: str, version: str, requires: list[str], files: dict[str, bytes]
) -> Path:
    whl = path / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        for rel, data in files.items():
            zf.writestr(rel, data)
    return whl


def test_requires_dist_check(tmp_path: Path) -> None:
    a = _wheel(tmp_path, "alpha", "1.0", [
        "beta>=2", "torch==2.14.1", "numpy", "gamma", "flashinfer-python", "delta>=9",
        "winonly; sys_platform == 'win32'", "extra-thing; extra == 'dev'",
        "old; python_version < '3.11'"], {})  # fmt: skip
    b = _wheel(tmp_path, "beta", "2.5", [], {})
    infos = [wheels.read_wheel(a), wheels.read_wheel(b)]
    assert [str(r) for r in infos[0].requires][-1] == "delta>=9"  # markers filtered
    report = wheels.check_requirements(infos, {"numpy": None, "torch": "2.11.0", "delta": "1"})
    status = {r["requirement"]: r["status"] for r in report["alpha==1.0"]}
    assert status == {"beta>=2": "carried", "torch==2.14.1": "not-carried",
                      "numpy": "image-version-unknown", "gamma": "MISSING",
                      "flashinfer-python": "not-carried", "delta>=9": "version-mismatch"}  # fmt: skip
    bad = wheels.problems(report)
    assert len(bad) == 2 and any("gamma" in p for p in bad) and any("delta" in p for p in bad)


def test_unpack_prunes_and_lays_out_data_dirs(tmp_path: Path) -> None:
    whl = _wheel(tmp_path, "sglang", "0.5.23", [], {
        "sglang/srt/x.py": b"x = 1\n",
        "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so": b"elf",
        "sglang/srt/rust_extensions/loader.py": b"",
        "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so": b"elf",
        "sglang/multimodal_gen/big.py": b"#",
        "sglang/srt/__pycache__/x.cpython-312.pyc": b"",
        "sglang-0.5.23.data/purelib/extra_mod.py": b"",
        "sglang-0.5.23.data/scripts/tool": b"",
    })  # fmt: skip
    site = tmp_path / "site"
    _, pruned = wheels.unpack(whl, site, wheels.SGLANG_PRUNE)
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert "sglang/srt/x.py" in files and "extra_mod.py" in files
    assert "sglang/srt/rust_extensions/loader.py" in files
    assert any("rust_tree_core" in f for f in files)
    assert not any("_server" in f or "multimodal_gen" in f or f.endswith(".pyc") for f in files)
    assert not any("scripts" in f for f in files)
    assert len(pruned) == 2


def test_sgl_kernel_subset() -> None:
    names = ["sgl_kernel/__init__.py", "sgl_kernel/flash_ops.abi3.so",
             "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
             "sgl_kernel/spatial_ops.abi3.so", "sgl_kernel/infllm_v2/_loader.py",
             "sglang_kernel-0.4.5.dist-info/METADATA", "triton_kernels/x.py"]  # fmt: skip
    assert wheels.sgl_kernel_members(names) == [
        "sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so",
        "sgl_kernel/spatial_ops.abi3.so", "sgl_kernel/infllm_v2/_loader.py",
        "sglang_kernel-0.4.5.dist-info/METADATA"]  # fmt: skip


def test_size_table_counts_carry_and_tracked_tree(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "site.tar.xz").write_bytes(b"\0" * 2**20)
    rows, total = pack.size_table(carry)
    assert rows[0] == ("carry/site.tar.xz", 1.0)
    assert any(r[0].startswith("tracked tree") and r[1] > 1 for r in rows)
    assert total == pytest.approx(sum(r[1] for r in rows)) and total < pack.LIMIT_MIB


# -- shims ----------------------------------------------------------------------------
def _run(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": ":".join(str(p) for p in paths), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_ipython_stub_serves_sglang_utils_import() -> None:
    p = _run("import IPython, sys\nfrom IPython.display import HTML, display\n"
             "display(HTML('x'))\nassert IPython.GPU_KIT_STUB\nprint('ok')",
             GPU / "shims" / "common")  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr


def test_sgl_kernel_fallback_computes_the_few_ops_and_refuses_the_rest() -> None:
    code = """
import torch, sgl_kernel
from sgl_kernel import rmsnorm, fused_add_rmsnorm, weak_ref_tensor, FallbackCalled
from sgl_kernel.elementwise import silu_and_mul
from sgl_kernel.utils import is_arch_support_pdl
from sgl_kernel.speculative import build_tree_kernel_efficient
from sgl_kernel.deep.nested import thing
x, w, r = torch.randn(3, 8), torch.rand(8), torch.randn(3, 8)
ref = torch.nn.functional.rms_norm(x, (8,), w, 1e-6)
assert torch.allclose(rmsnorm(x, w, 1e-6), ref, atol=1e-5)
x2, r2 = x.clone(), r.clone()
fused_add_rmsnorm(x2, r2, w, 1e-6)
assert torch.allclose(r2, x + r) and torch.allclose(x2, torch.nn.functional.rms_norm(x + r, (8,), w, 1e-6), atol=1e-5)
g = torch.randn(2, 6)
assert torch.allclose(silu_and_mul(g), torch.nn.functional.silu(g[:, :3]) * g[:, 3:])
assert weak_ref_tensor(x) is x and is_arch_support_pdl() is False
try:
    build_tree_kernel_efficient(1)
except FallbackCalled as e:
    assert "build_tree_kernel_efficient" in str(e)
else:
    raise AssertionError("a missing op must refuse")
assert sgl_kernel.__version__.endswith("gpu-kit-fallback")
print("ok")
"""
    p = _run(code, GPU / "shims" / "sgl_kernel_fallback", *map(Path, sys.path[1:]))
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_importcheck_hides_what_image_and_carry_lack(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    check = str(GPU / "gpu_kit" / "importcheck.py")
    base = [sys.executable, check, "--image", str(empty), "--carry", str(empty), "json", "tqdm"]
    p = subprocess.run(base, capture_output=True, text=True)
    report = json.loads(p.stdout)
    assert p.returncode == 1 and report["failed"] == ["tqdm"]
    assert report["missing_modules"] == ["tqdm"] and report["modules"]["json"]["ok"]
    p = subprocess.run(
        [*base, "--allow", "tqdm", "--allow", "torch"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout[-2000:]


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

    results = guard.Results(tmp_path)
    stages = [guard.Stage("a", ok, 0), guard.Stage("b", boom, 0), guard.Stage("c", ok, 99),
              guard.Stage("d", ok, 0, needs=("b",)), guard.Stage("e", slow, 0),
              guard.Stage("f", ok, 0)]  # fmt: skip
    cleaned = []
    t0 = time.monotonic()
    status = guard.run_stages(stages, Ctx(), results, guard.Budget(1.5),
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
FAST = ["--set", "curve_new_tokens=24", "--set", "toks_new_tokens=16", "--set",
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
        env={**__import__("os").environ, **(env or {})},
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
    assert p.stdout.strip() == "1 ['ModelRunner', 'Scheduler']", p.stderr


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

    from gpu_kit import stages
    from gpu_kit.run import Kit
    from gpu_kit.servers import ServerError

    server_args = pytest.importorskip("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    ns = argparse.Namespace(dry=False, set=[], work=tmp_path / "w", carry=tmp_path / "c",
                            server_cmd=None)  # fmt: skip
    kit = Kit(ns, tmp_path, guard.Results(tmp_path))
    seen = []

    class Recorder:
        live: dict = {}
        history: list = []

        def get_many(self, specs):
            seen.extend(specs)
            return {s.label: ServerError("not started (test)") for s in specs}

        def stop_all(self):
            return None

    kit.pool = Recorder()
    for fn in (stages.stage_parity, stages.stage_curve, stages.stage_hosttime,
               stages.stage_toks, stages.stage_adaptive):  # fmt: skip
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
    assert dict(next(s for s in seen if s.label == "plain").env) == {"TRITON_F32_DEFAULT": "ieee"}


def test_time_guard_stops_a_hanging_stage_and_its_servers(tmp_path: Path) -> None:
    t0 = time.monotonic()
    data = _run_kit(tmp_path, "parity,toks", {"FAKE_SERVER_HANG_ALGO": "NGRAM"}, budget="25")
    assert time.monotonic() - t0 < 60
    st = data["stages"]
    assert st["parity"]["status"] == "time-up" and "time guard" in st["parity"]["error"]
    assert st["parity"]["results"]["SUFFIX-4"]["identical"] is True  # kept before the hang
    assert st["toks"]["status"] == "skipped"
    assert all(row["ready_s"] is not None for row in data["meta"]["servers"])
