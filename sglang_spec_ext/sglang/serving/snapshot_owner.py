"""Whose snapshot a process keeps: the model it was written for, the file of this process's
drafter, and whether this process writes it.

With tensor parallelism every rank loads the file, only the first TP rank writes it. A
server runs a drafter per data-parallel replica (``--dp-size``) and, under DP attention,
per attention-DP rank (each schedules and drafts for its own requests): each has its own
file, the path with ``.dp<index>`` appended, written by its first rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sglang_spec_ext.config import ConfigError

PATH_ENV = "SGLANG_SPEC_EXT_SNAPSHOT_PATH"
#: Identity keys a snapshot must match to be loaded (others in the header are informative).
IDENTITY_KEYS = ("model_path", "tokenizer_path", "vocab_size")


def snapshot_identity(worker: Any) -> dict[str, Any]:
    """What a snapshot must have been written for: the host worker's model path,
    tokenizer path and vocabulary size. Attributes the worker lacks (a HYBRID
    drafting-only worker, a test double) are left out: a partial identity."""
    identity: dict[str, Any] = {}
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        target = getattr(worker, "_target_worker", None) or getattr(worker, "target_worker", None)
        runner = getattr(target, "model_runner", None)
    model_config = getattr(runner, "model_config", None)
    server_args = getattr(worker, "server_args", None) or getattr(runner, "server_args", None)
    if server_args is None:  # a drafting-only worker (HYBRID): the process's server args
        server_args = _host_server_args()
    model_path = getattr(model_config, "model_path", None) or getattr(
        server_args, "model_path", None
    )
    if isinstance(model_path, str | os.PathLike):
        identity["model_path"] = str(model_path)
    tokenizer_path = getattr(server_args, "tokenizer_path", None)
    if isinstance(tokenizer_path, str | os.PathLike):
        identity["tokenizer_path"] = str(tokenizer_path)
    vocab_size = getattr(model_config, "vocab_size", None)
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool):
        identity["vocab_size"] = vocab_size
    return identity


def _host_server_args() -> Any:
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:  # noqa: BLE001 - no host runtime context (tests, tools)
        return None


def _rank_role() -> tuple[bool, int | None]:
    """(whether this process writes the snapshot, its drafter's index where a server runs
    several drafters, else None).

    A drafter per data-parallel replica (``--dp-size``) and, under DP attention, per
    attention-DP rank (each schedules and drafts for its own requests); the first rank
    of each writes (its attention-TP peers hold the same trees)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
    except Exception:  # noqa: BLE001 - no host runtime context: one process
        return True, None
    return rank_role(parallel)


def rank_role(parallel: Any) -> tuple[bool, int | None]:
    """:func:`_rank_role` for a given host parallel context (values it lacks read as one
    replica, rank 0)."""

    def read(name: str, default: int) -> int:
        try:
            value = getattr(parallel, name)
            return default if value is None else int(value)
        except Exception:  # noqa: BLE001 - not published (tests, tools)
            return default

    dp_size, attn_dp = read("dp_size", 1), read("attn_dp_size", 1)
    dp_rank = read("dp_rank", 0) if dp_size > 1 else 0
    if attn_dp > 1:
        writer = read("attn_tp_rank", 0) == 0 and read("attn_cp_rank", 0) == 0
        index = dp_rank * attn_dp + read("attn_dp_rank", 0)
    else:
        writer = read("tp_rank", 0) == 0
        index = dp_rank
    return writer, (index if dp_size * attn_dp > 1 else None)


def check_snapshot_path(raw: str, *, writable: bool = True) -> Path:
    """The snapshot file for ``raw`` (the configured value); :class:`ConfigError`
    naming the variable when its directory is missing or not writable."""
    path = Path(raw).expanduser()
    where = f"{PATH_ENV}={raw!r} (snapshot_path)"
    if path.is_dir():
        raise ConfigError(
            f"{where} is a directory; name a file in it, e.g. {str(path / 'suffix.snap')!r}"
        )
    directory = path.parent
    if not directory.is_dir():
        raise ConfigError(
            f"{where}: directory {str(directory)!r} does not exist; create it or point "
            "the variable at an existing one (empty turns warm restarts off)"
        )
    if writable and not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{where}: directory {str(directory)!r} is not writable by this process; "
            "the snapshot is written there as a temp file and renamed"
        )
    return path
