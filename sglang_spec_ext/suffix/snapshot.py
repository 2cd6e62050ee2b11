"""Snapshot files of the suffix drafter's global trees (warm restarts), engine-agnostic.

A snapshot holds the sequences :meth:`SuffixDrafter.export_cached` returns, as
``(scope, token ids)`` oldest first, plus a JSON header describing who wrote it
(model and tokenizer identity, vocabulary size, the drafter's depth, plugin
version, time). Layout, every integer little-endian::

    magic          8 bytes   b"SSXSNAP\\x00"
    version        uint32    FORMAT_VERSION (a reader refuses any other)
    header_len     uint32    bytes of the JSON header
    header         JSON      {"meta": {...}, "entries": n, "scopes": s,
                              "tokens": t, "payload_bytes": p,
                              "payload_sha256": hex, "created": unix time}
    header_sha256  32 bytes  sha256 of the header bytes
    payload        p bytes   scope table: uint32 s, then per scope uint32 length +
                             UTF-8 bytes, zero-padded to a multiple of 4;
                             int32[n] scope index per entry; int32[n] entry
                             lengths; int32[t] token ids, entries back to back

:func:`write_snapshot` writes atomically (a temp file in the same directory,
fsync, ``os.replace``, fsync of the directory): a reader sees the old file or
the new one, never a mix, and a failed write leaves the old one and no temp
file. :func:`read_snapshot` checks everything before returning anything and
raises :class:`SnapshotError` naming the file and the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"SSXSNAP\x00"
FORMAT_VERSION = 1
#: magic, version, header length
_PREFIX = struct.Struct("<8sII")
_DIGEST = 32
#: Largest token id a snapshot may hold (int32).
MAX_TOKEN_ID = 2**31 - 1
#: A header larger than this is refused before it is parsed.
MAX_HEADER_BYTES = 1 << 20
_I32 = np.dtype("<i4")


class SnapshotError(ValueError):
    """A snapshot file cannot be used (the message names the file and why)."""


def _as_int32(tokens: Any, where: str) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{where}: token ids must be a flat sequence, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=_I32)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{where}: token ids must be integers, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_TOKEN_ID:
        raise ValueError(f"{where}: token ids must lie in [0, {MAX_TOKEN_ID}], got [{lo}, {hi}]")
    return arr.astype(_I32, copy=False)


def _encode_payload(entries: Iterable[tuple[str, Sequence[int]]]) -> tuple[list[bytes], dict]:
    """The payload as byte chunks (joined by the writer) and its counts."""
    scope_ids: dict[str, int] = {}
    index: list[int] = []
    lengths: list[int] = []
    arrays: list[np.ndarray] = []
    for i, (scope, tokens) in enumerate(entries):
        if not isinstance(scope, str):
            raise TypeError(f"entry {i}: scope must be a str, got {type(scope).__name__}")
        arr = _as_int32(tokens, f"entry {i}")
        index.append(scope_ids.setdefault(scope, len(scope_ids)))
        lengths.append(arr.size)
        arrays.append(arr)
    table = [struct.pack("<I", len(scope_ids))]
    for scope in scope_ids:  # insertion order = index order
        raw = scope.encode("utf-8")
        table.append(struct.pack("<I", len(raw)))
        table.append(raw)
    table_bytes = b"".join(table)
    table_bytes += b"\x00" * (-len(table_bytes) % 4)
    tokens = np.concatenate(arrays) if arrays else np.empty(0, dtype=_I32)
    chunks = [
        table_bytes,
        np.asarray(index, dtype=_I32).tobytes(),
        np.asarray(lengths, dtype=_I32).tobytes(),
        tokens.tobytes(),
    ]
    counts = {"entries": len(index), "scopes": len(scope_ids), "tokens": int(tokens.size)}
    return chunks, counts


def encode_snapshot(entries: Iterable[tuple[str, Sequence[int]]], meta: Mapping[str, Any]) -> bytes:
    """The bytes of a snapshot file holding ``entries`` with ``meta`` in its header."""
    chunks, counts = _encode_payload(entries)
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    header = {
        "meta": dict(meta),
        **counts,
        "payload_bytes": sum(len(c) for c in chunks),
        "payload_sha256": digest.hexdigest(),
        "created": time.time(),
    }
    header_bytes = json.dumps(header, sort_keys=True, default=str).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes))
    head = prefix + header_bytes + hashlib.sha256(header_bytes).digest()
    return b"".join([head, *chunks])


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def write_snapshot(
    path: str | os.PathLike[str],
    entries: Iterable[tuple[str, Sequence[int]]],
    meta: Mapping[str, Any],
) -> int:
    """Write ``entries`` (``(scope, token ids)``, oldest first) to ``path`` atomically.

    Returns the bytes written. On any failure the previous file at ``path`` is
    untouched and no temp file is left behind; the exception propagates.
    """
    path = Path(path)
    data = encode_snapshot(entries, meta)
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return len(data)


def read_header(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> dict:
    """The header of the snapshot at ``path`` (checked, payload not read)."""
    header, _, _ = _read_head(Path(path), max_bytes)
    return header


def _fail(path: Path, reason: str) -> SnapshotError:
    return SnapshotError(f"snapshot {path}: {reason}")


def _read_head(path: Path, max_bytes: int | None) -> tuple[dict, int, int]:
    """(header, payload offset, file size), after the size, magic, version and header checks."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _fail(path, f"cannot be read ({e.strerror or e})") from None
    if max_bytes is not None and size > max_bytes:
        raise _fail(
            path,
            f"file is {size} bytes, more than the {max_bytes} this drafter accepts "
            "(its bounds are smaller than the writer's, or this is not a snapshot)",
        )
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < len(MAGIC) or not prefix.startswith(MAGIC):
            raise _fail(path, "not a sglang-spec-ext snapshot (magic bytes missing)")
        if len(prefix) < _PREFIX.size:
            raise _fail(path, f"truncated: {size} bytes, shorter than the fixed prefix")
        _, version, header_len = _PREFIX.unpack(prefix)
        if version != FORMAT_VERSION:
            newer = (
                " (newer: written by a later sglang-spec-ext)" if version > FORMAT_VERSION else ""
            )
            raise _fail(
                path, f"format version {version}{newer}; this reader reads version {FORMAT_VERSION}"
            )
        if header_len > MAX_HEADER_BYTES:
            raise _fail(path, f"header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
        header_bytes = f.read(header_len)
        digest = f.read(_DIGEST)
    if len(header_bytes) < header_len or len(digest) < _DIGEST:
        raise _fail(path, f"truncated: {size} bytes, the header is incomplete")
    if hashlib.sha256(header_bytes).digest() != digest:
        raise _fail(path, "header checksum mismatch (the file is corrupt)")
    try:
        header = json.loads(header_bytes)
    except ValueError as e:  # pragma: no cover - the checksum matched: a writer bug
        raise _fail(path, f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _fail(path, "header is not a JSON object")
    keys = ("meta", "entries", "scopes", "tokens", "payload_bytes", "payload_sha256")
    missing = [k for k in keys if k not in header]
    if missing:
        raise _fail(path, f"header lacks {', '.join(missing)}")
    return header, _PREFIX.size + header_len + _DIGEST, size


def _check_meta(path: Path, meta: Any, expect: Mapping[str, Any]) -> None:
    if not isinstance(meta, dict):
        raise _fail(path, "header meta is not an object")
    for key, want in expect.items():
        if key not in meta:
            raise _fail(path, f"written without {key!r}; this server has {key}={want!r}")
        if meta[key] != want:
            raise _fail(
                path,
                f"written for {key}={meta[key]!r}, this server has {key}={want!r} "
                "(another model or tokenizer: its token ids would mean other text)",
            )


def read_snapshot(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    max_entries: int,
    expect: Mapping[str, Any],
) -> list[tuple[str, list[int]]]:
    """The ``(scope, token ids)`` entries of the snapshot at ``path``, oldest first.

    Raises ``FileNotFoundError`` when there is no file, and :class:`SnapshotError`
    when the file is larger than ``max_bytes`` (checked before reading it), is
    not a snapshot, has another format version, is truncated or corrupt, holds
    more than ``max_entries`` entries, was written with header meta that differs
    from ``expect`` in any of its keys, or holds token ids outside
    [0, 2**31 - 1] (or, when ``expect`` has ``vocab_size``, outside the vocabulary).
    """
    path = Path(path)
    header, offset, size = _read_head(path, max_bytes)
    _check_meta(path, header["meta"], expect)
    n, n_scopes, n_tokens = header["entries"], header["scopes"], header["tokens"]
    payload_bytes = header["payload_bytes"]
    ints = (n, n_scopes, n_tokens, payload_bytes)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ints):
        raise _fail(path, "header counts are not non-negative integers")
    if n > max_entries:
        raise _fail(path, f"holds {n} sequences, more than the {max_entries} this drafter accepts")
    if size < offset + payload_bytes:
        raise _fail(
            path,
            f"truncated: {size} bytes, the header promises {offset + payload_bytes}",
        )
    if size > offset + payload_bytes:
        raise _fail(path, f"{size - offset - payload_bytes} unexpected bytes after the payload")
    with open(path, "rb") as f:
        f.seek(offset)
        payload = f.read(payload_bytes)
    if len(payload) != payload_bytes:  # the file shrank under us
        raise _fail(path, f"truncated: read {len(payload)} of {payload_bytes} payload bytes")
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise _fail(path, "payload checksum mismatch (the file is corrupt)")
    scopes, index, tokens, bounds = _decode_payload(path, payload, n, n_scopes, n_tokens)
    vocab = expect.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and tokens.size:
        top = int(tokens.max())
        if top >= vocab:
            raise _fail(path, f"token id {top} outside the vocabulary (vocab_size={vocab})")
    flat = tokens.tolist()
    return [(scopes[index[i]], flat[bounds[i] : bounds[i + 1]]) for i in range(n)]


def _decode_payload(
    path: Path, payload: bytes, n: int, n_scopes: int, n_tokens: int
) -> tuple[list[str], list[int], np.ndarray, list[int]]:
    """(scope names, scope index per entry, all tokens, entry bounds); checked."""
    pos = 0

    def take(count: int, what: str) -> bytes:
        nonlocal pos
        if pos + count > len(payload):
            raise _fail(path, f"payload too short for {what}")
        out = payload[pos : pos + count]
        pos += count
        return out

    (declared,) = struct.unpack("<I", take(4, "the scope table"))
    if declared != n_scopes:
        raise _fail(path, f"scope table has {declared} scopes, the header says {n_scopes}")
    scopes = []
    for _ in range(n_scopes):
        (length,) = struct.unpack("<I", take(4, "a scope name"))
        try:
            scopes.append(take(length, "a scope name").decode("utf-8"))
        except UnicodeDecodeError:
            raise _fail(path, "a scope name is not UTF-8") from None
    take(-pos % 4, "padding")
    index = np.frombuffer(take(4 * n, "the scope indices"), dtype=_I32)
    lengths = np.frombuffer(take(4 * n, "the entry lengths"), dtype=_I32)
    tokens = np.frombuffer(take(4 * n_tokens, "the token ids"), dtype=_I32)
    if pos != len(payload):
        raise _fail(path, f"{len(payload) - pos} unexpected payload bytes")
    if n and (int(index.min()) < 0 or int(index.max()) >= n_scopes):
        raise _fail(path, "an entry names a scope outside the scope table")
    if n and int(lengths.min()) < 0:
        raise _fail(path, "an entry has a negative length")
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if int(bounds[-1]) != n_tokens:
        raise _fail(path, f"entry lengths add up to {int(bounds[-1])}, not {n_tokens} tokens")
    if n_tokens and int(tokens.min()) < 0:
        raise _fail(path, f"token id {int(tokens.min())} outside [0, {MAX_TOKEN_ID}]")
    return scopes, index.tolist(), tokens, bounds.tolist()


def import_entries(drafter: Any, entries: list) -> tuple[int, int, Exception | None]:
    """Re-add snapshot ``entries`` to ``drafter`` oldest first: (sequences, tokens) re-added
    and the drafter's exception that stopped it, if one did."""
    loaded = tokens = 0
    try:
        for scope, seq in entries:
            drafter.import_cached(scope, seq)
            loaded += 1
            tokens += len(seq)
    except Exception as e:  # noqa: BLE001 - a drafter fault: keep what went in
        return loaded, tokens, e
    return loaded, tokens, None
