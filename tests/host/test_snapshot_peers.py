"""Replicas sharing a directory (sglang_spec_ext/sglang/serving/snapshot_peers.py) with real
SuffixDrafters and SnapshotKeepers: a new replica starts warm from its peers' snapshots
(tenant scopes kept), its own file is not loaded twice, a refused peer file is one warning
and the others still load, and the configuration is checked at start-up."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from sglang_spec_ext.config import ConfigError, load_config
from sglang_spec_ext.sglang.serving.snapshot_peers import load_peer_snapshots, peer_files
from sglang_spec_ext.sglang.serving.snapshots import SnapshotKeeper
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter

IDENTITY = {"model_path": "/models/tiny", "tokenizer_path": "/models/tiny", "vocab_size": 512}


def _drafter() -> SuffixDrafter:
    return SuffixDrafter(SuffixConfig(max_cached_tokens=10_000, max_cached_requests=100))


def _keeper(path: Path, identity=IDENTITY) -> SnapshotKeeper:
    return SnapshotKeeper(path, interval_s=0.0, identity=identity, shutdown_hooks=False)


def _serve(drafter: SuffixDrafter, rid: str, prompt: list[int], answer: list[int], scope=""):
    drafter.start_request(rid, prompt, scope=scope)
    drafter.extend_request(rid, answer)
    drafter.finish_request(rid)


def _draft_len(drafter: SuffixDrafter, prompt: list[int], scope: str = "") -> int:
    drafter.start_request("probe", prompt, scope=scope)
    n = len(drafter.speculate("probe", 15).tokens)
    drafter.abort_request("probe")
    return n


A_ANSWER = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
B_ANSWER = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]


def test_a_new_replica_starts_warm_from_its_peers(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, "sglang_spec_ext")
    a, b = _drafter(), _drafter()
    _serve(a, "a1", [1, 2, 3], A_ANSWER)
    _serve(b, "b1", [5, 6, 7], B_ANSWER, scope="tenant")
    _keeper(tmp_path / "replica-a.snap").close(a)
    time.sleep(0.01)
    _keeper(tmp_path / "replica-b.snap").close(b)
    (tmp_path / ".replica-b.snap.123.tmp").write_bytes(b"half written")

    fresh = _drafter()
    own = _keeper(tmp_path / "replica-c.snap")
    assert [p.name for p in peer_files(tmp_path, own.path)] == ["replica-a.snap", "replica-b.snap"]
    assert _draft_len(fresh, [1, 2, 3]) == 0
    assert load_peer_snapshots(own, fresh, tmp_path) == 2
    assert own.load_into(fresh) == 0  # its own file does not exist yet
    assert _draft_len(fresh, [1, 2, 3]) > 4  # replica a's answer, learned there
    assert _draft_len(fresh, [5, 6, 7], scope="tenant") > 4  # b's tenant, in its scope
    assert _draft_len(fresh, [5, 6, 7]) == 0  # not in the shared scope
    assert any("loaded 2 sequences" in r.getMessage() and "2 of 2 peer files" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_replica_does_not_reload_its_own_file_as_a_peer(tmp_path: Path) -> None:
    a = _drafter()
    _serve(a, "a1", [1, 2, 3], A_ANSWER)
    keeper = _keeper(tmp_path / "replica-a.snap")
    keeper.close(a)
    assert peer_files(tmp_path, keeper.path) == []
    fresh = _drafter()
    assert load_peer_snapshots(keeper, fresh, tmp_path) == 0
    assert keeper.load_into(fresh) == 1


def test_a_refused_peer_is_one_warning_and_the_others_load(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, "sglang_spec_ext")
    a, other = _drafter(), _drafter()
    _serve(a, "a1", [1, 2, 3], A_ANSWER)
    _serve(other, "o1", [5, 6, 7], B_ANSWER)
    _keeper(tmp_path / "replica-a.snap").close(a)
    _keeper(tmp_path / "other-model.snap", {**IDENTITY, "model_path": "/models/other"}).close(other)
    (tmp_path / "garbage.snap").write_bytes(b"not a snapshot")
    fresh = _drafter()
    assert load_peer_snapshots(_keeper(tmp_path / "replica-c.snap"), fresh, tmp_path) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("refused" in w for w in warnings)
    assert all("\n" not in w for w in warnings)
    assert _draft_len(fresh, [1, 2, 3]) > 4 and _draft_len(fresh, [5, 6, 7]) == 0


def test_peers_are_checked_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_SNAPSHOT_PATH"):
        load_config({"SGLANG_SPEC_EXT_SNAPSHOT_PEERS": str(tmp_path)})
    with pytest.raises(ConfigError, match="is not a directory"):
        load_config(
            {
                "SGLANG_SPEC_EXT_SNAPSHOT_PEERS": str(tmp_path / "nope"),
                "SGLANG_SPEC_EXT_SNAPSHOT_PATH": str(tmp_path / "a.snap"),
            }
        )
    cfg = load_config(
        {
            "SGLANG_SPEC_EXT_SNAPSHOT_PEERS": str(tmp_path),
            "SGLANG_SPEC_EXT_SNAPSHOT_PATH": os.path.join(tmp_path, "a.snap"),
        }
    )
    assert cfg.snapshot_peers == str(tmp_path)
