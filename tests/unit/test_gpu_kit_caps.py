"""gpu/run's time caps and incremental results (issue 60): a stage cut at its own cap while
the next still runs, every finished cell on disk at once, a run killed (SIGKILL) or
stopped (SIGTERM) that still leaves valid results, the first-request check, the warm
machine's reuse, and the readiness probe's contract with the installed host. No GPU, no
sglang server: the guard directly, or gpu/run against tests/unit/gpu_kit_fake_server.py."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "gpu"
sys.path.insert(0, str(GPU))

from gpu_kit import guard, results, warm  # noqa: E402
from gpu_kit.servers import kill_leftovers  # noqa: E402

FAKE_SERVER = Path(__file__).with_name("gpu_kit_fake_server.py")
#: tests/unit/gpu_kit_fake_server.py with two more failure modes, by environment:
#: ``CAPS_HANG_ALGO=NAME`` answers the kit's first request, then never another (a server
#: that stays up but stops answering); ``CAPS_FAIL_ALGO=NAME`` answers every /generate
#: with a 500 (ready, then dead on its first request, as the second GPU run's servers).
WRAPPER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import gpu_kit_fake_server as fake
from http.server import ThreadingHTTPServer

seen = [0]
serve = fake.Handler.do_POST

def do_post(self):
    seen[0] += 1
    if os.environ.get("CAPS_FAIL_ALGO") == fake.ALGO and fake.ALGO:
        self.rfile.read(int(self.headers["Content-Length"]))
        return self._json(500, {{"error": "fails on purpose"}})
    if os.environ.get("CAPS_HANG_ALGO") == fake.ALGO and fake.ALGO and seen[0] > 1:
        time.sleep(600)
    return serve(self)

fake.Handler.do_POST = do_post
ThreadingHTTPServer(("127.0.0.1", fake.ARGS.port), fake.Handler).serve_forever()
"""
FAST = ["--set", "curve_new_tokens=64", "--set", "toks_new_tokens=48", "--set",
        "host_new_tokens=6", "--set", "parity_new_tokens=12", "--set", "ready_timeout_s=30",
        "--set", "first_request_timeout_s=20", "--set", "request_timeout_s=60"]  # fmt: skip


def _cmd(tmp_path: Path, stages: str, *extra: str, budget: str = "200") -> list[str]:
    server = tmp_path / "fake_server.py"
    server.write_text(WRAPPER.format(tests=str(FAKE_SERVER.parent)))
    return [sys.executable, str(GPU / "run"), "--dry", "--out", str(tmp_path / "out"),
            "--work", str(tmp_path / "work"), "--stages", stages, "--budget", budget,
            "--reserve", "5", "--min-stage-seconds", "3",
            "--server-cmd", f"{sys.executable} {server}", *FAST, *extra]  # fmt: skip


def _alive(pids_file: Path) -> list[int]:
    out = []
    for line in pids_file.read_text().splitlines() if pids_file.is_file() else []:
        pid = int(line.split()[0])
        try:
            os.kill(pid, 0)
            if b"--port" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except (OSError, ValueError):
            pass
    return out


# -- the guard ------------------------------------------------------------------------
def test_a_stage_cut_at_its_cap_leaves_the_next_stage_its_time(tmp_path: Path) -> None:
    def hangs(ctx, rec):
        res.cell("first", {"figure": 1})
        time.sleep(30)

    def quick(ctx, rec):
        res.cell("after", {"figure": 2})

    res = results.Results(tmp_path)
    stages = [
        guard.Stage("a", hangs, 0, cap_seconds=1.0),
        guard.Stage("b", quick, 0, cap_seconds=5),
    ]
    t0 = time.monotonic()
    status = guard.run_stages(stages, None, res, guard.Budget(20), log=lambda m: None)
    assert time.monotonic() - t0 < 5
    assert status == {"a": "capped", "b": "passed"}
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["stages"]["a"]["status"] == "capped" and "stage cap" in data["stages"]["a"]["error"]
    assert data["stages"]["a"]["cap_s"] == 1.0
    cells = results.read_cells(tmp_path)
    assert [(c["stage"], c["cell"], c["value"]) for c in cells] == [
        ("a", "first", {"figure": 1}), ("b", "after", {"figure": 2})]  # fmt: skip


def test_the_runs_budget_still_ends_the_run_inside_a_long_cap(tmp_path: Path) -> None:
    res = results.Results(tmp_path)
    stages = [guard.Stage("a", lambda c, r: time.sleep(30), 0, cap_seconds=100),
              guard.Stage("b", lambda c, r: None, 0)]  # fmt: skip
    status = guard.run_stages(stages, None, res, guard.Budget(1.0), log=lambda m: None)
    assert status == {"a": "time-up", "b": "skipped"}


def test_partial_results_read_back_whatever_the_state(tmp_path: Path) -> None:
    res = results.Results(tmp_path)
    res.current = "curve"
    res.cell("1x1", {"ms_per_token": 2.0})
    with open(tmp_path / "cells.jsonl", "a") as f:
        f.write('{"t": 1, "stage": "curve", "cell": "4x1", "val')  # cut by a kill
    data = results.load_partial(tmp_path)
    assert [c["cell"] for c in data["cells"]] == ["1x1"]
    (tmp_path / "results.json").write_text('{"meta": {')  # as if torn (rename prevents it)
    data = results.load_partial(tmp_path)
    assert data["stages"] == {"curve": {"status": "unknown (run killed)"}}
    assert data["cells"][0]["value"] == {"ms_per_token": 2.0}


# -- gpu/run end to end against fake servers ------------------------------------------
def test_a_hanging_parity_stage_is_cut_and_the_curve_still_measures(tmp_path: Path) -> None:
    """A server that stays up but stops answering (CAPS_HANG_ALGO) used to hold
    the whole run: now the parity stage is cut at its cap and the curve runs after it."""
    cmd = _cmd(tmp_path, "parity,curve", "--cap", "parity=8", "--cap", "curve=60")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150,
                       env={**os.environ, "CAPS_HANG_ALGO": "SUFFIX"})  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert time.monotonic() - t0 < 90
    out = tmp_path / "out"
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["status"] == {"parity": "capped", "curve": "passed"}
    assert "stage cap" in data["stages"]["parity"]["error"]
    assert data["stages"]["curve"]["ratio"]["4"]["1"] > 0
    cells = results.read_cells(out)
    assert {c["cell"] for c in cells if c["stage"] == "curve"} >= {"1x1", "4x1", "1x2", "4x2"}
    assert (out / "calibration.json").is_file() and (out / "server-logs.txt").is_file()
    assert not _alive(tmp_path / "work" / "servers.pids")


def test_a_server_that_dies_on_its_first_request_is_reported_as_such(tmp_path: Path) -> None:
    p = subprocess.run(_cmd(tmp_path, "parity"), capture_output=True, text=True, timeout=150,
                       env={**os.environ, "CAPS_FAIL_ALGO": "NGRAM"})  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    row = data["stages"]["parity"]["results"]["NGRAM"]
    assert row["identical"] is None and "then its first request failed" in row["error"]
    assert data["stages"]["parity"]["results"]["SUFFIX-4"]["identical"] is True
    servers = {s["label"]: s for s in data["meta"]["servers"]}
    assert servers["NGRAM"]["ready_s"] is not None and servers["NGRAM"]["error"]
    assert servers["plain"]["first_request_s"] is not None


def _start_and_wait_for_a_cell(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(_cmd(tmp_path, "curve,toks"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **env})  # fmt: skip
    cells = tmp_path / "out" / "cells.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (cells.is_file() and "1x1" in cells.read_text()):
        time.sleep(0.2)
    assert cells.is_file(), "no cell written in 90 s"
    return proc


def test_a_killed_run_leaves_valid_partial_results(tmp_path: Path) -> None:
    """SIGKILL mid-stage (the device tool's hard limit): results.json still parses and
    holds the cells measured; the next call on the machine ends the orphaned servers."""
    proc = _start_and_wait_for_a_cell(tmp_path, {"CAPS_HANG_ALGO": "NGRAM"})
    proc.kill()
    proc.wait(timeout=30)
    out, pids = tmp_path / "out", tmp_path / "work" / "servers.pids"
    data = json.loads((out / "results.json").read_text())  # valid JSON
    assert data["stages"]["curve"]["status"] == "running"
    assert data["stages"]["curve"]["step_ms"]["1"]["1"]["ms_per_token"] > 0
    assert results.load_partial(out)["cells"][0]["cell"] == "1x1"
    assert _alive(pids)  # servers run in their own sessions: they outlive the kill
    assert set(kill_leftovers(pids)) >= {"plain-timing", "NGRAM-4-acc1"}
    time.sleep(0.5)
    assert not _alive(pids)


def test_sigterm_wraps_up_the_run(tmp_path: Path) -> None:
    """The outer ``timeout`` sends SIGTERM: the run records it, stops its servers and
    writes the logs before it exits."""
    proc = _start_and_wait_for_a_cell(tmp_path, {"CAPS_HANG_ALGO": "NGRAM"})
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 0
    out = tmp_path / "out"
    data = json.loads((out / "results.json").read_text())
    assert data["stages"]["curve"]["status"] == "time-up"
    assert "SIGTERM" in data["stages"]["curve"]["error"]
    assert data["stages"]["toks"]["status"] == "skipped"
    assert (out / "server-logs.txt").is_file() and "summary" in (out / "run.log").read_text()
    assert not _alive(tmp_path / "work" / "servers.pids")


# -- the warm machine -----------------------------------------------------------------
def test_warm_plan_leaves_out_what_passed_and_reuses_the_install(tmp_path: Path) -> None:
    import argparse

    from gpu_kit.install import Layout, extract_carry
    from gpu_kit.run import choose_stages

    work = tmp_path / "work"
    state = warm.load_state(work)
    warm.record_call(work, state, {"env": "passed", "curve": "passed", "hosttime": "failed"})
    warm.record_call(work, warm.load_state(work), {"toks": "passed", "hybrid": "capped"})
    assert warm.previous_passed(warm.load_state(work)) == {"env", "curve", "toks"}

    class K:
        dry, state = False, warm.load_state(work)

    ns = argparse.Namespace(stages=None, warm=True, dry=False, rehearse=False)
    plan, left_out = choose_stages(ns, K())
    assert plan == ["env", "hosttime", "adaptive", "hybrid"] and set(left_out) == {"toks"}
    K.state["kernel"] = "carried"
    assert choose_stages(ns, K())[0] == ["hosttime", "adaptive", "hybrid"]
    ns.warm = False
    assert choose_stages(ns, K())[0] == ["env", "curve", "parity", "hosttime", "hybrid"]

    carry = tmp_path / "carry"
    (carry / "src" / "site").mkdir(parents=True)
    (carry / "src" / "site" / "m.py").write_text("x = 1\n")
    subprocess.run(["tar", "-C", str(carry / "src"), "-cJf", str(carry / "site.tar.xz"),
                    "site"], check=True)  # fmt: skip
    (carry / "manifest.json").write_text(json.dumps({"made": "t1", "wheels": []}))
    layout = Layout(work, carry)
    first = extract_carry(layout, None)
    assert first["site.tar.xz"]["mib"] >= 0 and first["stamp"] == warm.carry_stamp(carry)
    again = extract_carry(layout, first["stamp"])
    assert "kept" in again["site.tar.xz"]
    (carry / "manifest.json").write_text(json.dumps({"made": "t2", "wheels": []}))
    assert isinstance(extract_carry(layout, first["stamp"])["site.tar.xz"], dict)  # new carry
    assert warm.plugin_digest() == warm.plugin_digest()


# -- readiness: the host's contract ---------------------------------------------------
def test_readiness_probe_matches_the_hosts_health_endpoint(tmp_path: Path) -> None:
    """sglang 0.5.23's /health runs a one-token generation unless
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off (srt/entrypoints/http_server.py,
    health_generate; default on in srt/environ.py): every kit server turns it off."""
    import argparse

    from gpu_kit.kit import Kit
    from gpu_kit.servers import HEALTH_PATH

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    http = (root / "srt/entrypoints/http_server.py").read_text()
    environ = (root / "srt/environ.py").read_text()
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True)" in environ
    body = http.split("async def health_generate", 1)[1].split("\nasync def ", 1)[0]
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in body and '"/health"' in body
    assert HEALTH_PATH == "/health"
    ns = argparse.Namespace(dry=False, set=[], work=tmp_path / "w", carry=tmp_path / "c",
                            server_cmd="x")  # fmt: skip
    kit = Kit(ns, tmp_path, results.Results(tmp_path))
    env = kit.server_env(kit.spec("plain", "tiny", "bfloat16"))
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"
    assert env["SGLANG_JIT_CACHE_DIR"].startswith(str(tmp_path / "w" / "cache"))
    assert env["TRITON_CACHE_DIR"].startswith(str(tmp_path / "w" / "cache"))


def test_a_second_call_keeps_the_plugin_build(tmp_path: Path, monkeypatch) -> None:
    """On a warm machine the plugin built by the first call is kept while its source
    digest is the same (no pip build), and the sgl_kernel choice comes from state.json."""
    import argparse

    from gpu_kit import kit as kit_module
    from gpu_kit.kit import Kit

    builds: list[Path] = []
    monkeypatch.setattr(kit_module, "start_plugin_build", lambda layout: builds.append(layout.work))
    work = tmp_path / "work"
    (work / "plugin").mkdir(parents=True)
    kept = {"digest": warm.plugin_digest(), "ok": True, "native_core": True}
    warm.save_state(work, {"calls": [], "plugin": kept, "kernel": "fallback"})
    ns = argparse.Namespace(dry=False, set=[], work=work, carry=tmp_path / "carry",
                            server_cmd="x")  # fmt: skip
    kit = Kit(ns, tmp_path / "out", results.Results(tmp_path / "out"))
    assert kit.kernel == "fallback"
    report = kit.install()
    assert report["plugin_build"] == "kept" and builds == []
    assert kit.plugin_ready()["kept_from_previous_call"] and kit.plugin_ready()["native_core"]
    kit.state["plugin"]["digest"] = "other"  # the source changed: built again
    warm.save_state(work, kit.state)
    Kit(ns, tmp_path / "out", results.Results(tmp_path / "out"))._start_plugin()
    assert builds == [work]


def test_relative_paths_are_made_absolute(tmp_path: Path) -> None:
    """Servers start in the kit's log folder: a relative --work or --carry would point
    their model path and PYTHONPATH nowhere (found rehearsing a second call on CPU)."""
    cmd = _cmd(tmp_path, "curve")
    for flag, rel in (("--out", "out"), ("--work", "work")):
        cmd[cmd.index(flag) + 1] = rel
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["meta"]["status"] == {"curve": "passed"}
    for server in data["meta"]["servers"]:
        model = server["args"][server["args"].index("--model-path") + 1]
        assert model == str(tmp_path / "work" / "models" / "tiny")
