"""Warm restarts of SUFFIX on the real SGLang CPU server (tiny model).

A server with ``SGLANG_SPEC_EXT_SNAPSHOT_PATH`` serves a few requests and is shut
down the normal way (SIGTERM to the launcher: the host drains, sends its schedulers
a ShutdownReq, the scheduler exits and the plugin's atexit hook writes the
snapshot). A restarted server loads it, and the first repeated request drafts from
the restored global tree at once: its accept length is above the one the same
request had on the fresh server. A corrupt snapshot file makes the server start
empty with one warning line, and a SIGTERM to the whole process group (what the
test harness, ``kill -TERM -PGID`` and systemd send) still writes a new snapshot.
"""

from __future__ import annotations

import os
import signal
import statistics
from pathlib import Path

from sglang_spec_ext.suffix.snapshot import read_header
from tests.e2e.spec_metrics import accept_length
from tests.harness.server import NO_CRASH_DIAGNOSTICS_ENV

WIDTH = 8
NEW_TOKENS = 48
SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
# Prompts whose answers do not loop on the random-weight model (a looping answer is
# accepted from its own tokens on any server): what helps is having seen the answer.
PROMPTS = [
    "def reverse(items):\n    result = []\n    for item in items:\n",
    "The quick brown fox jumps over the lazy dog. " * 2,
    "A speculative decoder proposes several tokens and the target model",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n",
    "Suffix trees index the text seen so far; the longest",
]


def _env(path: Path) -> dict[str, str]:
    # interval 0: written only at shutdown, so the file is the shutdown write's work.
    # The host's default crash diagnostics (the harness turns them off): shut down as a
    # production server does, pause before the launcher kills its tree included. The
    # scheduler starts by the harness's fork, which runs the child's atexit hooks as the
    # host's spawn does (tests/harness/fork_start), so the shutdown write is the product's.
    return {
        "SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(path),
        "SGLANG_SPEC_EXT_SNAPSHOT_INTERVAL_S": "0",
        **dict.fromkeys(NO_CRASH_DIAGNOSTICS_ENV, "1"),
    }


def _greedy(server, ids: list[int]) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def _log(server) -> str:
    return server.log_path.read_text(errors="replace")


def _stop_launcher(server, timeout: float = 90.0) -> None:
    """The normal shutdown: SIGTERM to the launcher process only."""
    os.kill(server.proc.pid, signal.SIGTERM)
    server.proc.wait(timeout=timeout)


def test_restart_drafts_from_the_snapshot(tiny_model_dir, tok, start_server, tmp_path) -> None:
    snap = tmp_path / "snapshots" / "suffix.snap"
    snap.parent.mkdir()
    ids = [tok(p)["input_ids"] for p in PROMPTS]

    first = start_server(tiny_model_dir, *SUFFIX_ARGS, env=_env(snap))
    assert "no snapshot yet" in _log(first)
    fresh = [_greedy(first, x) for x in ids]
    _stop_launcher(first)
    log = _log(first)
    assert "SUFFIX snapshot: wrote" in log, log[-3000:]
    header = read_header(snap)
    assert header["entries"] >= len(PROMPTS)
    assert header["meta"]["model_path"] == str(tiny_model_dir)
    assert header["meta"]["vocab_size"] > 0

    second = start_server(tiny_model_dir, *SUFFIX_ARGS, env=_env(snap))
    log = _log(second)
    assert f"SUFFIX snapshot: loaded {header['entries']} sequences" in log, log[-3000:]
    again = [_greedy(second, x) for x in ids]

    rows = []
    for text, f, a in zip(PROMPTS, fresh, again, strict=True):
        assert a["output_ids"] == f["output_ids"], "greedy output changed across the restart"
        rows.append((text[:30], accept_length(f["meta_info"]), accept_length(a["meta_info"])))
    print(f"\naccept length (tiny model, width {WIDTH}, {NEW_TOKENS} tokens per request):")
    print(f"  {'prompt':<32} {'fresh server':>12} {'after restart':>14}")
    for text, f, a in rows:
        print(f"  {text!r:<32} {f:12.2f} {a:14.2f}")
    # The first repeated request drafts from the restored tree.
    assert rows[0][2] > rows[0][1] + 0.5, rows[0]
    assert rows[0][2] > 2.0, rows[0]
    assert statistics.mean(r[2] for r in rows) > statistics.mean(r[1] for r in rows) + 0.5


def test_corrupt_snapshot_starts_empty_and_group_sigterm_writes_anew(
    tiny_model_dir, tok, start_server, tmp_path
) -> None:
    snap = tmp_path / "suffix.snap"
    snap.write_bytes(b"SSXSNAP\x00" + b"\x01\x00\x00\x00" + b"\xff" * 64)
    server = start_server(tiny_model_dir, *SUFFIX_ARGS, env=_env(snap))
    warnings = [line for line in _log(server).splitlines() if "SUFFIX snapshot refused" in line]
    assert len(warnings) == 1, warnings
    assert str(snap) in warnings[0] and "the global trees start empty" in warnings[0]
    assert "header" in warnings[0] or "truncated" in warnings[0], warnings[0]
    out = _greedy(server, tok(PROMPTS[0])["input_ids"])
    assert len(out["output_ids"]) == NEW_TOKENS and server.healthy()

    server.stop()  # SIGTERM to the whole process group, then SIGKILL after 20 s
    assert "SUFFIX snapshot: wrote" in _log(server), _log(server)[-3000:]
    assert read_header(snap)["entries"] >= 1
