"""The suffix drafter's snapshot file format (sglang_spec_ext/suffix/snapshot.py):
round trips, every refusal, atomic writes, and the speed of a large file."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from sglang_spec_ext.suffix import snapshot as snap
from sglang_spec_ext.suffix.snapshot import (
    FORMAT_VERSION,
    MAGIC,
    SnapshotError,
    read_header,
    read_snapshot,
    write_snapshot,
)

META = {"model_path": "/models/a", "tokenizer_path": "/models/a", "vocab_size": 1000}
ENTRIES = [
    ("", [1, 2, 3, 4]),
    ("tenant-a", [5, 6]),
    ("", []),
    ("ünïcode scope", [999, 0, 7]),
    ("tenant-a", list(range(100))),
]
BIG = {"max_bytes": 1 << 30, "max_entries": 1 << 20}


def _read(path: Path, **kw):
    args = {**BIG, "expect": META, **kw}
    return read_snapshot(path, **args)


def _write(tmp_path: Path, entries=ENTRIES, meta=META) -> Path:
    path = tmp_path / "suffix.snap"
    write_snapshot(path, entries, meta)
    return path


def test_round_trip_keeps_order_scopes_and_tokens(tmp_path: Path) -> None:
    path = tmp_path / "suffix.snap"
    nbytes = write_snapshot(path, ENTRIES, {**META, "max_depth": 64})
    assert nbytes == path.stat().st_size
    assert _read(path) == ENTRIES
    header = read_header(path)
    assert header["entries"] == len(ENTRIES)
    assert header["scopes"] == 3
    assert header["tokens"] == sum(len(t) for _, t in ENTRIES)
    assert header["meta"]["max_depth"] == 64
    assert abs(header["created"] - time.time()) < 60


def test_round_trip_of_numpy_arrays_and_empty_snapshot(tmp_path: Path) -> None:
    entries = [("", np.arange(10, dtype=np.int64)), ("x", np.array([3], dtype=np.int32))]
    path = _write(tmp_path, entries)
    assert _read(path) == [("", list(range(10))), ("x", [3])]
    empty = _write(tmp_path, [])
    assert _read(empty) == []


def test_expect_compares_only_its_own_keys(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert _read(path, expect={}) == ENTRIES  # a partial identity checks less
    assert _read(path, expect={"model_path": "/models/a"}) == ENTRIES


def _refused(path: Path, *needles: str, **kw) -> str:
    with pytest.raises(SnapshotError) as info:
        _read(path, **kw)
    message = str(info.value)
    assert str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_refuses_a_file_that_is_not_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a snapshot\n")
    _refused(path, "not a sglang-spec-ext snapshot", "magic")
    empty = tmp_path / "empty.snap"
    empty.write_bytes(b"")
    _refused(empty, "magic")


def test_refuses_another_format_version(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))
    _refused(path, f"format version {FORMAT_VERSION + 1}", "newer")
    data[8:12] = struct.pack("<I", 0)
    path.write_bytes(bytes(data))
    _refused(path, "format version 0")


@pytest.mark.parametrize("keep", [4, 12, 40, -1, -30])
def test_refuses_a_truncated_file(tmp_path: Path, keep: int) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    message = _refused(path)
    assert "truncated" in message or "magic" in message


def test_refuses_trailing_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path)
    path.write_bytes(path.read_bytes() + b"\x00\x00\x00\x00")
    _refused(path, "unexpected bytes")


def test_refuses_a_corrupt_payload(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # a token id
    path.write_bytes(bytes(data))
    _refused(path, "payload checksum mismatch")


def test_refuses_a_corrupt_header(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    at = data.index(b'"/models/a"')
    path.write_bytes(data[:at] + b'"/models/b"' + data[at + 11 :])
    _refused(path, "header checksum mismatch")


def test_refuses_a_file_larger_than_max_bytes_before_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path)
    size = path.stat().st_size
    opened = []
    real_open = open
    monkeypatch.setattr(snap, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k),
                        raising=False)  # fmt: skip
    _refused(path, f"{size} bytes", f"{size - 1}", max_bytes=size - 1)
    assert opened == [], "the file was opened although it is too large"
    assert _read(path, max_bytes=size) == ENTRIES


def test_refuses_more_entries_than_max_entries(tmp_path: Path) -> None:
    path = _write(tmp_path)
    _refused(path, f"holds {len(ENTRIES)} sequences", "more than the 4", max_entries=4)
    assert _read(path, max_entries=len(ENTRIES)) == ENTRIES


@pytest.mark.parametrize(
    ("key", "value"),
    [("model_path", "/models/b"), ("vocab_size", 32000), ("tokenizer_path", "/tok/other")],
)
def test_refuses_a_snapshot_of_another_model(tmp_path: Path, key: str, value) -> None:
    path = _write(tmp_path)
    _refused(path, key, repr(META[key]), repr(value), expect={**META, key: value})


def test_refuses_a_snapshot_without_an_expected_key(tmp_path: Path) -> None:
    path = _write(tmp_path, meta={"model_path": "/models/a", "tokenizer_path": "/models/a"})
    _refused(path, "without 'vocab_size'")


def test_refuses_token_ids_out_of_range(tmp_path: Path) -> None:
    # A hand-made file (the writer refuses them): a negative id with a valid checksum.
    path = tmp_path / "neg.snap"
    path.write_bytes(_forged([("", [1, -5, 2])]))
    _refused(path, "token id -5", "outside [0, 2147483647]")
    # An id outside the expected vocabulary would crash the verify's embedding lookup.
    path = _write(tmp_path, [("", [1, 5000, 2])])
    _refused(path, "token id 5000", "vocab_size=1000")
    assert _read(path, expect={"model_path": "/models/a"}) == [("", [1, 5000, 2])]


def test_writer_refuses_token_ids_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "s.snap"
    for bad in ([1, -1], [2**31], [1.5]):
        with pytest.raises(ValueError, match="token ids"):
            write_snapshot(path, [("", bad)], META)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def _forged(entries) -> bytes:
    """A well-formed file whose payload the writer would refuse to produce."""
    real = snap._as_int32
    try:
        snap._as_int32 = lambda tokens, where: np.asarray(tokens, dtype="<i4")
        return snap.encode_snapshot(entries, META)
    finally:
        snap._as_int32 = real


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        _read(tmp_path / "absent.snap")


def test_atomic_write_keeps_the_old_snapshot_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path)
    before = path.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snap.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_snapshot(path, [("", [42] * 1000)], META)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suffix.snap"], "temp file left"
    monkeypatch.undo()
    assert _read(path) == ENTRIES


def test_atomic_write_keeps_the_old_snapshot_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path)
    before = path.read_bytes()

    def failing_replace(src, dst) -> None:
        raise KeyboardInterrupt  # even an interrupt between write and rename

    monkeypatch.setattr(snap.os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        write_snapshot(path, [("", [42] * 1000)], META)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suffix.snap"]


def test_write_into_a_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_snapshot(tmp_path / "nope" / "s.snap", ENTRIES, META)


def test_header_is_json_with_the_documented_fields(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    _, version, header_len = struct.unpack("<8sII", data[:16])
    header = json.loads(data[16 : 16 + header_len])
    assert version == FORMAT_VERSION
    assert set(header) >= {"meta", "entries", "scopes", "tokens", "payload_bytes",
                           "payload_sha256", "created"}  # fmt: skip
    assert len(data) == 16 + header_len + 32 + header["payload_bytes"]


def test_large_round_trip_is_fast(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    entries = [
        ("" if i % 4 else f"tenant-{i % 5}", rng.integers(0, 50_000, 400).tolist())
        for i in range(2500)
    ]  # 1M tokens
    path = tmp_path / "big.snap"
    t0 = time.perf_counter()
    nbytes = write_snapshot(path, entries, META | {"vocab_size": 50_000})
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = read_snapshot(path, max_bytes=nbytes, max_entries=2500,
                        expect=META | {"vocab_size": 50_000})  # fmt: skip
    t_read = time.perf_counter() - t0
    print(f"1M tokens: {nbytes} bytes, write {t_write:.3f} s, read {t_read:.3f} s")
    assert out == entries
    assert nbytes < 4 * 1_000_000 + 2500 * 8 + 4096
    assert t_write < 2.0 and t_read < 2.0, (t_write, t_read)


def test_no_temp_files_after_many_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.snap"
    for i in range(5):
        write_snapshot(path, [("", [i])], META)
    assert os.listdir(tmp_path) == ["s.snap"]
    assert _read(path) == [("", [4])]
