"""The shared acceptance calibration (sglang_spec_ext.hybrid.calibration)."""

from __future__ import annotations

import random

import pytest

from sglang_spec_ext.hybrid.calibration import AcceptanceCalibrator, accepted_path


def test_accepted_path_follows_the_committed_tokens():
    #        root
    #       /    \
    #     5(0)   6(1)
    #     |       |
    #     7(2)   7(3)
    tokens, parents = [5, 6, 7, 7], [-1, -1, 0, 1]
    assert accepted_path(tokens, parents, [6, 7, 9]) == [1, 3]
    assert accepted_path(tokens, parents, [5, 7]) == [0, 2]
    assert accepted_path(tokens, parents, [8, 5]) == []
    assert accepted_path(tokens, parents, []) == []


def test_unseen_source_returns_the_raw_probability():
    cal = AcceptanceCalibrator()
    assert cal.calibrated("suffix", 0.37) == 0.37
    assert cal.expected_accepted("suffix", [1.0, 0.5]) == 1.5


def test_evidence_moves_an_overconfident_source_down_and_keeps_sources_apart():
    rng = random.Random(0)
    cal = AcceptanceCalibrator(bins=10, prior_weight=4.0)
    for _ in range(2000):  # "a" claims 0.9 but is right 30% of the time; "b" is honest
        cal.observe("a", 0.9, rng.random() < 0.3)
        cal.observe("b", 0.9, rng.random() < 0.9)
    assert cal.calibrated("a", 0.95) == pytest.approx(0.3, abs=0.04)
    assert cal.calibrated("b", 0.92) == pytest.approx(0.9, abs=0.04)
    assert cal.calibrated("a", 0.15) == 0.15  # other bins keep their prior
    table = cal.table()
    assert [r["seen"] for r in table["a"]] == [2000]
    assert table["a"][0]["mean_raw"] == pytest.approx(0.9)


def test_observe_draft_counts_every_node():
    cal = AcceptanceCalibrator(bins=2, prior_weight=1.0)
    n = cal.observe_draft("s", [5, 6, 7], [-1, -1, 0], [0.8, 0.6, 0.7], committed=[5, 7, 1])
    assert n == 2
    (row,) = cal.table()["s"]  # all three in the upper bin: 2 of 3 accepted
    assert row["seen"] == 3 and row["accept_rate"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        cal.observe("s", 1.5, True)
    with pytest.raises(ValueError):
        AcceptanceCalibrator(bins=0)
