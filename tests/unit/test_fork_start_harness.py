"""The test servers' fork start (tests/harness/fork_start): the host's ``spawn`` becomes
``fork``, arguments that spawn could not pickle still fail, the site chain goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.harness.server import FORK_START_ENV, FORK_START_SITE, SHIM_DIR, quick_server_env

CHILD = textwrap.dedent(
    """
    import multiprocessing as mp, os, sys
    mp.set_start_method("spawn", force=True)  # what the host's launcher does
    print("method", mp.get_start_method())
    if mp.get_start_method() != "fork":
        sys.exit(0)  # a spawned child of "python -c" could not find child() below

    def child(value, pipe):
        pipe.send((os.getpid() != PARENT, value))

    PARENT = os.getpid()
    reader, writer = mp.Pipe(duplex=False)
    proc = mp.Process(target=child, args=({"ok": 1}, writer))
    proc.start(); proc.join()
    print("child", reader.recv())
    try:
        mp.Process(target=child, args=(lambda: 0, writer)).start()
        print("unpicklable started")
    except Exception as exc:
        print("unpicklable refused", type(exc).__name__)
    """
)


def _run(env_value: str, tmp_path) -> str:
    (tmp_path / "sitecustomize.py").write_text("print('next site ran')\n")
    pythonpath = os.pathsep.join([str(FORK_START_SITE), str(tmp_path)])
    env = {**os.environ, "PYTHONPATH": pythonpath, FORK_START_ENV: env_value}
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout  # fmt: skip


def test_fork_start_turns_spawn_into_fork_and_still_pickles_arguments(tmp_path):
    out = _run("1", tmp_path)
    assert "next site ran" in out  # the chain of sitecustomize modules goes on
    assert "method fork" in out
    assert "child (True, {'ok': 1})" in out
    assert "unpicklable refused" in out  # as spawn would refuse it


def test_without_the_switch_the_hosts_spawn_stays(tmp_path):
    out = _run("0", tmp_path)
    assert "next site ran" in out and "method spawn" in out


def test_test_servers_get_the_fork_site_after_the_cpu_site():
    env = quick_server_env()
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts.index(str(FORK_START_SITE)) == parts.index(str(SHIM_DIR)) + 1
    assert env[FORK_START_ENV] == "1"
    # a PYTHONPATH a test sets itself (tests/harness/host_reads) gets it too, once
    env = quick_server_env({"PYTHONPATH": os.pathsep.join([str(SHIM_DIR), "/x"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SHIM_DIR), str(FORK_START_SITE), "/x"]
    assert quick_server_env({FORK_START_ENV: "0"})[FORK_START_ENV] == "0"
