"""Servers launched by ``bench``/``tune`` themselves, with a stand-in for
``python -m sglang.launch_server`` (put first on the launched server's PYTHONPATH
with ``--pythonpath``): arguments, environment, config files, readiness, and that
every launched server is stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_spec_ext.bench.servers import LaunchedServer, ServerError, parse_env
from sglang_spec_ext.cli import main
from sglang_spec_ext.config import CONFIG_FILE_ENV, load_config

REPO = Path(__file__).resolve().parents[2]

FAKE_LAUNCHER = """
import json, os, sys, time
from tests.unit.test_bench_fake_server import FakeServer

argv = sys.argv[1:]
cfg = os.environ.get("SGLANG_SPEC_EXT_CONFIG")
with open(os.environ["FAKE_LAUNCH_LOG"], "a") as f:
    f.write(json.dumps({"argv": argv, "pid": os.getpid(),
                        "config": json.load(open(cfg)) if cfg else None}) + "\\n")
if os.environ.get("FAKE_LAUNCH_FAIL"):
    print("fake server refuses to start")
    sys.exit(3)
FakeServer(chunk=3 if "--speculative-algorithm" in argv else 1,
           port=int(argv[argv.index("--port") + 1])).start()
while True:
    time.sleep(1)
"""


@pytest.fixture
def fake_host(tmp_path: Path) -> tuple[list[str], Path]:
    pkg = tmp_path / "fakehost" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_LAUNCHER)
    log = tmp_path / "launches.jsonl"
    opts = ["--pythonpath", str(pkg.parent), "--pythonpath", str(REPO),
            "--server-env", f"FAKE_LAUNCH_LOG={log}", "--server-timeout", "60"]  # fmt: skip
    return opts, log


def _launches(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_parse_env() -> None:
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError):
        parse_env(["novalue"])


def test_bench_launches_both_servers_and_stops_them(fake_host, tmp_path: Path, capsys) -> None:
    opts, log = fake_host
    out = tmp_path / "out"
    rc = main(["bench", "--model-path", "fake-model", *opts, "--server-args", "--device cpu",
               "--spec-args", "--speculative-algorithm SUFFIX", "--vocab-size", "40",
               "--scenario", "s:8:6", "--rates", "inf", "--num-prompts", "2", "--check-parity",
               "--out", str(out), "--no-progress"])  # fmt: skip
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    launches = _launches(log)
    assert len(launches) == 2
    assert launches[0]["argv"][:2] == ["--model-path", "fake-model"]
    assert (
        "--device" in launches[0]["argv"] and "--speculative-algorithm" not in launches[0]["argv"]
    )
    assert launches[1]["argv"][-2:] == ["--speculative-algorithm", "SUFFIX"]
    assert all(_gone(x["pid"]) for x in launches)
    doc = json.loads((out / "results.json").read_text())
    assert doc["endpoints"]["baseline"]["launched"] and doc["parity"]["ok"]
    assert doc["cells"][0]["speculative"]["accept_length"] == pytest.approx(2.0)
    assert (out / "baseline-server.log").exists() and (out / "bench.png").exists()


def test_server_that_fails_to_start(fake_host, tmp_path: Path, capsys) -> None:
    opts, log = fake_host
    rc = main(["bench", "--model-path", "m", *opts, "--server-env", "FAKE_LAUNCH_FAIL=1",
               "--vocab-size", "40", "--scenario", "s:8:6", "--rates", "inf",
               "--out", str(tmp_path), "--no-progress"])  # fmt: skip
    assert rc == 3
    assert "fake server refuses to start" in capsys.readouterr().err
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["status"] == "failed" and "exited with code 3" in doc["error"]
    assert len(_launches(log)) == 1  # the speculative server was never started


def test_launched_server_times_out_and_is_stopped(tmp_path: Path) -> None:
    pkg = tmp_path / "slow" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text("import time\ntime.sleep(600)\n")
    server = LaunchedServer("m", pythonpath=[str(pkg.parent)], log_path=tmp_path / "s.log")
    with pytest.raises(ServerError, match="not healthy after 2s"):
        server.start(timeout_s=2)
    assert server.proc is None


def test_tune_live_grid_writes_config(fake_host, tmp_path: Path, capsys) -> None:
    opts, log = fake_host
    cfg = tmp_path / "tuned.json"
    rc = main(["tune", "--model-path", "fake-model", *opts, "--widths", "4,8",
               "--spec-factor", "1,2", "--batch-sizes", "1,2", "--num-prompts", "2",
               "--input-len", "8", "--output-len", "6", "--vocab-size", "40",
               "--write-config", str(cfg), "--json", str(tmp_path / "tune.json")])  # fmt: skip
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    launches = _launches(log)
    assert len(launches) == 5  # plain + 2 settings x 2 widths
    assert launches[0]["config"] is None
    spec = launches[1:]
    assert sorted((x["config"]["spec_factor"], x["argv"][-1]) for x in spec) == [
        (1.0, "4"),
        (1.0, "8"),
        (2.0, "4"),
        (2.0, "8"),
    ]
    assert all("--speculative-num-draft-tokens" in x["argv"] for x in spec)
    assert all(_gone(x["pid"]) for x in launches)
    lines = cap.out.strip().splitlines()
    assert lines[-4].split()[:2] == ["batch", "width"]
    assert [ln.split()[0] for ln in lines[-2:]] == ["1", "2"]
    loaded = load_config({CONFIG_FILE_ENV: str(cfg)})
    assert loaded.spec_factor in (1.0, 2.0) and loaded.sources["spec_factor"] == "file"
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["best_per_batch"][0]["speedup"] is not None


def test_free_port_is_below_the_ephemeral_and_the_hosts_child_port_ranges():
    """Launched servers bind their HTTP port last; an ephemeral port (bind(0)) can be
    handed to one of the server's own sockets meanwhile ("address already in use")."""
    import socket

    from sglang_spec_ext.bench.servers import SERVER_PORTS, free_port

    lo, hi = SERVER_PORTS
    assert hi < 22000  # SGLang picks ports for its children in 22000-29999
    ports = {free_port() for _ in range(20)}
    assert all(lo <= p <= hi for p in ports) and len(ports) > 1
    with socket.socket() as s:  # and it is free
        s.bind(("127.0.0.1", ports.pop()))
