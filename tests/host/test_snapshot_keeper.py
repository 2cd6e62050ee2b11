"""SnapshotKeeper (sglang_spec_ext/sglang/serving/snapshots.py) with a real SuffixDrafter:
load at start-up, refusals, periodic background writes, the final write, shutdown
hooks in a real process, and the host attributes snapshot_identity reads."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_spec_ext.config import ConfigError, load_config
from sglang_spec_ext.sglang.serving import shutdown_hooks, snapshots
from sglang_spec_ext.sglang.serving.snapshot_owner import snapshot_identity
from sglang_spec_ext.sglang.serving.snapshots import SnapshotKeeper
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter
from sglang_spec_ext.suffix.snapshot import read_header, read_snapshot, write_snapshot

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = {"model_path": "/models/tiny", "tokenizer_path": "/models/tiny", "vocab_size": 512}
LOGGER = "sglang_spec_ext"
ANSWER = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]


def _drafter(**kw) -> SuffixDrafter:
    return SuffixDrafter(SuffixConfig(max_cached_tokens=10_000, max_cached_requests=100, **kw))


def _served(n: int = 3) -> SuffixDrafter:
    """A drafter that has served ``n`` requests answering ANSWER, one in a tenant scope."""
    d = _drafter()
    for i in range(n):
        d.start_request(f"r{i}", [1, 2, 3, 4 + i], scope="tenant" if i == 1 else "")
        d.extend_request(f"r{i}", ANSWER)
        d.finish_request(f"r{i}")
    return d


def _keeper(tmp_path: Path, **kw) -> SnapshotKeeper:
    args = {"interval_s": 10.0, "identity": IDENTITY, "shutdown_hooks": False, **kw}
    return SnapshotKeeper(tmp_path / "suffix.snap", **args)


def _draft_len(d: SuffixDrafter, prompt: list[int]) -> int:
    d.start_request("probe", prompt)
    tree = d.speculate("probe", 8)
    d.abort_request("probe")
    return len(tree.tokens)


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_close_then_load_restores_the_global_trees(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    old = _served()
    keeper = _keeper(tmp_path)
    keeper.close(old)
    assert keeper.writes == 1
    assert any("wrote 3 sequences" in m for m in _records(caplog, logging.INFO))
    header = read_header(keeper.path)
    assert header["meta"] == {**IDENTITY, "max_depth": 64, "plugin": "sglang-spec-ext",
                              "plugin_version": header["meta"]["plugin_version"]}  # fmt: skip

    fresh = _drafter()
    assert _draft_len(fresh, [1, 2, 3, 4]) == 0
    caplog.clear()
    assert _keeper(tmp_path).load_into(fresh) == 3
    assert fresh.export_cached() == old.export_cached()
    assert _draft_len(fresh, [1, 2, 3, 4]) > 4  # drafts the earlier answer at once
    (line,) = [m for m in _records(caplog, logging.INFO) if "loaded" in m]
    assert f"loaded 3 sequences ({sum(len(t) for _, t in old.export_cached())} tokens)" in line
    assert str(keeper.path) in line and line.endswith(" s")


def test_missing_file_starts_empty_with_an_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    d = _drafter()
    assert _keeper(tmp_path).load_into(d) == 0
    assert d.stats()["cached_requests"] == 0
    assert any("no snapshot yet" in m for m in _records(caplog, logging.INFO))
    assert _records(caplog, logging.WARNING) == []


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("corrupt", "payload checksum mismatch"),
        ("garbage", "not a sglang-spec-ext snapshot"),
        ("truncated", "truncated"),
        ("other-model", "model_path='/models/other'"),
        ("too-large", "bytes, more than the"),
        ("too-many", "sequences, more than the 2"),
    ],
)
def test_refused_snapshot_starts_empty_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, reason: str
) -> None:
    path = tmp_path / "suffix.snap"
    _keeper(tmp_path).close(_served())
    data = path.read_bytes()
    config: dict = {}
    if damage == "corrupt":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    elif damage == "garbage":
        path.write_bytes(b"{}\n" * 10)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "other-model":
        write_snapshot(path, _served().export_cached(), {**IDENTITY, "model_path": "/models/other"})
    elif damage == "too-large":
        config = {"max_cached_tokens": 10}  # max_bytes: 40 + 256 per entry + 1 MiB slack
        write_snapshot(path, [("", [1] * 400_000)], IDENTITY)
    elif damage == "too-many":
        config = {"max_cached_requests": 2}
    caplog.set_level(logging.INFO, LOGGER)
    cfg = {"max_cached_tokens": 10_000, "max_cached_requests": 100, **config}
    d = SuffixDrafter(SuffixConfig(**cfg))
    assert _keeper(tmp_path).load_into(d) == 0
    assert d.stats()["cached_requests"] == 0
    (warning,) = _records(caplog, logging.WARNING)
    assert "SUFFIX snapshot refused, the global trees start empty" in warning
    assert str(path) in warning and reason in warning, warning
    assert "\n" not in warning


def test_limits_follow_the_drafter_bounds() -> None:
    d = SuffixDrafter(SuffixConfig(max_cached_tokens=1000, max_cached_requests=10))
    max_bytes, max_entries = SnapshotKeeper.limits(d)
    assert max_entries == 10
    assert max_bytes == 4 * 1000 + snapshots.BYTES_PER_ENTRY * 10 + snapshots.SLACK_BYTES


def test_a_full_drafter_snapshot_fits_its_own_limits(tmp_path: Path) -> None:
    d = SuffixDrafter(SuffixConfig(max_cached_tokens=2000, max_cached_requests=50))
    for i in range(200):  # far past both bounds: the oldest are evicted
        d.start_request(i, [i % 300, 1, 2], scope=f"scope-{i % 7}-" + "x" * 200)
        d.extend_request(i, [(i * 7 + k) % 500 for k in range(60)])
        d.finish_request(i)
    keeper = _keeper(tmp_path)
    keeper.close(d)
    fresh = SuffixDrafter(d.config)
    assert _keeper(tmp_path).load_into(fresh) == d.stats()["cached_requests"]
    assert fresh.export_cached() == d.export_cached()


def test_periodic_write_runs_in_the_background_when_due(tmp_path: Path) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=10.0)
    keeper.load_into(_drafter())  # starts the clock
    t0 = time.monotonic()
    assert not keeper.maybe_save(d, now=t0 + 5)
    assert not keeper.path.exists()
    assert keeper.maybe_save(d, now=t0 + 11)
    assert keeper.wait(10)
    assert keeper.writes == 1
    assert len(read_snapshot(keeper.path, max_bytes=1 << 20, max_entries=10, expect={})) == 3
    assert not keeper.maybe_save(d, now=t0 + 15)  # the next one is 10 s later
    assert keeper.maybe_save(d, now=t0 + 22)
    assert keeper.wait(10) and keeper.writes == 2


def test_maybe_save_is_cheap_when_not_due(tmp_path: Path) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=300.0)
    keeper.load_into(d)
    t0 = time.perf_counter()
    for _ in range(100_000):
        keeper.maybe_save(d)
    per_call = (time.perf_counter() - t0) / 100_000
    print(f"maybe_save when not due: {per_call * 1e9:.0f} ns per call")
    assert per_call < 20e-6
    assert keeper.writes == 0


def test_interval_zero_writes_only_at_close(tmp_path: Path) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=0.0)
    keeper.load_into(_drafter())
    assert not keeper.maybe_save(d, now=time.monotonic() + 10**6)
    assert not keeper.path.exists()
    keeper.close(d)
    assert keeper.path.exists()


def test_export_happens_on_the_caller_thread_and_one_write_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=1.0)
    keeper.load_into(_drafter())
    export_threads = []
    real_export = d.export_cached

    def export() -> list:
        export_threads.append(threading.current_thread())
        return real_export()

    d.export_cached = export  # type: ignore[method-assign]
    release = threading.Event()
    writer_threads = []
    real_write = snapshots.write_snapshot

    def slow_write(*args, **kwargs) -> int:
        writer_threads.append(threading.current_thread())
        release.wait(30)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(snapshots, "write_snapshot", slow_write)
    t0 = time.monotonic()
    assert keeper.maybe_save(d, now=t0 + 2)
    assert export_threads == [threading.current_thread()]
    assert not keeper.maybe_save(d, now=t0 + 10)  # due, but the first write is in flight
    assert len(export_threads) == 1
    release.set()
    assert keeper.wait(10)
    assert writer_threads[0] is not threading.current_thread()
    assert keeper.maybe_save(d, now=t0 + 11)
    assert keeper.wait(10) and keeper.writes == 2


def test_a_failed_write_warns_keeps_the_old_file_and_serving_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=1.0)
    keeper.close(d)  # a good snapshot on disk
    before = keeper.path.read_bytes()
    keeper = _keeper(tmp_path, interval_s=1.0)
    keeper.load_into(_drafter())
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sglang_spec_ext.suffix.snapshot.os.fsync", full_disk)
    caplog.set_level(logging.INFO, LOGGER)
    assert keeper.maybe_save(d, now=time.monotonic() + 5)
    assert keeper.wait(10)
    assert keeper.write_errors == 1 and keeper.writes == 0
    (warning,) = _records(caplog, logging.WARNING)
    assert "No space left on device" in warning and "serving goes on" in warning
    assert keeper.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suffix.snap"]
    # the drafter is untouched and keeps serving
    assert _draft_len(d, [1, 2, 3, 4]) > 4
    monkeypatch.setattr("sglang_spec_ext.suffix.snapshot.os.fsync", real_fsync)
    assert keeper.maybe_save(d, now=time.monotonic() + 50)
    assert keeper.wait(10) and keeper.writes == 1


def test_a_failed_export_warns_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = _served()
    keeper = _keeper(tmp_path, interval_s=1.0)
    keeper.load_into(_drafter())

    def broken() -> list:
        raise MemoryError("bad_alloc")

    d.export_cached = broken  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, LOGGER)
    assert not keeper.maybe_save(d, now=time.monotonic() + 5)
    keeper.close(d)
    assert keeper.write_errors == 2
    assert all("bad_alloc" in m for m in _records(caplog, logging.WARNING))
    assert not keeper.path.exists()


def test_close_waits_for_the_write_in_flight_and_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _served(2)
    keeper = _keeper(tmp_path, interval_s=1.0)
    keeper.load_into(_drafter())
    release = threading.Event()
    real_write = snapshots.write_snapshot

    def slow_write(*args, **kwargs) -> int:
        release.wait(30)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(snapshots, "write_snapshot", slow_write)
    assert keeper.maybe_save(d, now=time.monotonic() + 5)  # 2 sequences, held back
    d.start_request("late", [40, 41])
    d.extend_request("late", [42, 43])
    d.finish_request("late")
    threading.Timer(0.3, release.set).start()
    keeper.close(d)  # waits, then writes the newer state
    assert keeper.writes == 2
    entries = read_snapshot(keeper.path, max_bytes=1 << 20, max_entries=10, expect=IDENTITY)
    assert len(entries) == 3
    keeper.close(d)
    assert keeper.writes == 2
    assert not keeper.maybe_save(d, now=time.monotonic() + 100)


def test_an_older_export_never_replaces_a_newer_one(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path)
    new = keeper._export(_served(3))
    old_meta = keeper.meta(_drafter())
    assert keeper._write(*new)
    assert not keeper._write([("", [1])], old_meta, new[2] - 1, 0.0)
    assert len(read_snapshot(keeper.path, max_bytes=1 << 20, max_entries=9, expect={})) == 3


def test_a_non_writer_rank_only_loads(tmp_path: Path) -> None:
    _keeper(tmp_path).close(_served())
    keeper = _keeper(tmp_path, writer=False, interval_s=1.0)
    d = _drafter()
    assert keeper.load_into(d) == 3
    before = keeper.path.stat().st_mtime_ns
    assert not keeper.maybe_save(d, now=time.monotonic() + 100)
    keeper.close(d)
    assert keeper.path.stat().st_mtime_ns == before and keeper.writes == 0


def test_stale_temp_files_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / ".suffix.snap.abc123.tmp"
    stale.write_bytes(b"half a snapshot")
    other = tmp_path / ".other.snap.x.tmp"
    other.write_bytes(b"not ours")
    _keeper(tmp_path).load_into(_drafter())
    assert not stale.exists() and other.exists()


# -- configuration -----------------------------------------------------------------
def test_from_plugin_config_off_by_default() -> None:
    assert SnapshotKeeper.from_plugin_config(load_config({}), IDENTITY) is None


def test_from_plugin_config_builds_a_keeper(tmp_path: Path) -> None:
    env = {
        "SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(tmp_path / "s.snap"),
        "SGLANG_SPEC_EXT_SNAPSHOT_INTERVAL_S": "60",
    }
    keeper = SnapshotKeeper.from_plugin_config(load_config(env), IDENTITY)
    try:
        assert keeper is not None
        assert keeper.path == tmp_path / "s.snap" and keeper.interval_s == 60.0
        assert keeper.identity == IDENTITY and keeper.writer
    finally:
        keeper._closing = True  # no final write at this test process's exit
        shutdown_hooks.unregister(keeper)


def test_missing_directory_is_a_start_up_error(tmp_path: Path) -> None:
    cfg = load_config({"SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(tmp_path / "nope" / "s.snap")})
    with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_SNAPSHOT_PATH.*does not exist"):
        SnapshotKeeper.from_plugin_config(cfg, IDENTITY)


def test_a_directory_as_path_is_a_start_up_error(tmp_path: Path) -> None:
    cfg = load_config({"SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(tmp_path)})
    with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_SNAPSHOT_PATH.*is a directory"):
        SnapshotKeeper.from_plugin_config(cfg, IDENTITY)


def test_unwritable_directory_is_a_start_up_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # os.access, not chmod: the test may run as root, for whom every directory is writable.
    monkeypatch.setattr(snapshots.os, "access", lambda path, mode: False)
    cfg = load_config({"SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(tmp_path / "s.snap")})
    with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_SNAPSHOT_PATH.*not writable"):
        SnapshotKeeper.from_plugin_config(cfg, IDENTITY)


# -- identity --------------------------------------------------------------------
def test_snapshot_identity_from_a_host_shaped_worker() -> None:
    model_config = SimpleNamespace(model_path="/m/llama", vocab_size=32000)
    worker = SimpleNamespace(
        model_runner=SimpleNamespace(model_config=model_config),
        server_args=SimpleNamespace(model_path="/m/llama", tokenizer_path="/m/tok"),
    )
    assert snapshot_identity(worker) == {
        "model_path": "/m/llama",
        "tokenizer_path": "/m/tok",
        "vocab_size": 32000,
    }
    via_target = SimpleNamespace(
        _target_worker=SimpleNamespace(model_runner=SimpleNamespace(model_config=model_config))
    )
    assert snapshot_identity(via_target) == {"model_path": "/m/llama", "vocab_size": 32000}


def test_snapshot_identity_is_partial_without_host_attributes() -> None:
    assert snapshot_identity(object()) == {}
    partial = SimpleNamespace(server_args=SimpleNamespace(model_path="/m", tokenizer_path=None))
    assert snapshot_identity(partial) == {"model_path": "/m"}


def test_host_still_has_the_attributes_snapshot_identity_reads() -> None:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    config_src = inspect.getsource(ModelConfig)
    assert "self.model_path = " in config_src and "self.vocab_size = " in config_src
    runner_src = inspect.getsource(ModelRunner.__init__)
    assert "self.model_config = " in runner_src and "self.server_args = " in runner_src
    assert "self.model_runner = " in inspect.getsource(NGRAMWorker.__init__)
    args = ServerArgs(model_path="dummy")
    assert hasattr(args, "tokenizer_path") and args.model_path == "dummy"


# -- shutdown hooks in a real process ------------------------------------------------
CHILD = textwrap.dedent(
    """
    import logging, os, signal, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    from sglang_spec_ext.sglang.serving.snapshots import SnapshotKeeper
    from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter

    path, how = sys.argv[1], sys.argv[2]
    if how == "chained":
        def mine(signum, frame):
            print("previous handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, mine)
    d = SuffixDrafter(SuffixConfig(max_cached_tokens=10000, max_cached_requests=100))
    keeper = SnapshotKeeper(path, interval_s=3600, identity={"model_path": "m"})
    keeper.load_into(d)
    d.start_request("a", [1, 2, 3])
    d.extend_request("a", [4, 5, 6, 7])
    d.finish_request("a")
    keeper.maybe_save(d)
    print("ready", flush=True)
    if how == "exit":
        sys.exit(0)
    time.sleep(60)
    """
)


def _child(tmp_path: Path, how: str) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / f"{how}.snap"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    if how != "exit":
        seen = []
        while not seen or seen[-1] != "ready":
            line = proc.stdout.readline()
            assert line, "child exited early:\n" + "\n".join(seen)
            seen.append(line.strip())
    return proc, path


@pytest.mark.parametrize(
    ("how", "code"), [("exit", 0), ("sigterm", -signal.SIGTERM), ("chained", 3)]
)
def test_the_final_write_happens_at_exit_and_on_sigterm(
    tmp_path: Path, how: str, code: int
) -> None:
    proc, path = _child(tmp_path, how)
    if how != "exit":
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert read_snapshot(path, max_bytes=1 << 20, max_entries=10, expect={"model_path": "m"}) == [
        ("", [1, 2, 3, 4, 5, 6, 7])
    ], out
    assert "wrote 1 sequences" in out
    if how == "chained":
        assert "previous handler ran" in out


def test_each_drafter_of_a_server_has_its_own_snapshot_file_and_writer():
    """A drafter per ``--dp-size`` replica and, under DP attention, per attention-DP rank
    (each drafts for its own requests): its own ``.dp<index>`` file, written by its first
    rank. (Before, under DP attention only global rank 0 wrote, so the second attention-DP
    rank's trees were never saved.)"""
    from sglang_spec_ext.sglang.serving.snapshot_owner import rank_role

    one = SimpleNamespace(tp_rank=1, tp_size=2, dp_size=1, attn_dp_size=1)
    assert rank_role(one) == (False, None)  # TP only: one drafter, rank 0 writes
    assert rank_role(SimpleNamespace(tp_rank=0, dp_size=1, attn_dp_size=1)) == (True, None)
    assert rank_role(SimpleNamespace(tp_rank=0, dp_size=2, dp_rank=1, attn_dp_size=1)) == (True, 1)
    dp_attn = dict(dp_size=1, dp_rank=None, attn_dp_size=2, attn_tp_size=1, attn_cp_rank=0)
    first = SimpleNamespace(tp_rank=0, attn_dp_rank=0, attn_tp_rank=0, **dp_attn)
    second = SimpleNamespace(tp_rank=1, attn_dp_rank=1, attn_tp_rank=0, **dp_attn)
    assert rank_role(first) == (True, 0)
    assert rank_role(second) == (True, 1)
    # attention TP 2 inside each attention-DP rank: only its first rank writes
    peer = SimpleNamespace(tp_rank=3, attn_dp_rank=1, attn_tp_rank=1, **dp_attn)
    assert rank_role(peer) == (False, 1)
    assert rank_role(SimpleNamespace()) == (True, None)  # nothing published: one process
