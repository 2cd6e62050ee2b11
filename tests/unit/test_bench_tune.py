"""``sglang-spec-ext tune`` on small synthetic traces (exact offline replay)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sglang_spec_ext.cli import main
from sglang_spec_ext.config import CONFIG_FILE_ENV, load_config
from sglang_spec_ext.replay import (
    DrafterOptions,
    TraceRecord,
    drafter_factory,
    replay,
    write_trace,
)
from sglang_spec_ext.tune.search import (
    AnalyticCost,
    DraftSetting,
    Evaluation,
    LinearCost,
    SearchSpace,
    best_across_widths,
    best_per_batch,
    evaluate,
    search,
)


def _records(n: int = 6, seed: int = 0) -> list[TraceRecord]:
    """Requests whose outputs repeat a few phrases (so drafts get accepted)."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(100) for _ in range(rng.randint(3, 8))] for _ in range(4)]
    out = []
    for i in range(n):
        prompt = [rng.randrange(100) for _ in range(10)]
        output: list[int] = []
        while len(output) < 60:
            output += rng.choice(phrases) if rng.random() < 0.8 else [rng.randrange(100)]
        out.append(TraceRecord(tuple(prompt), tuple(output[:60]), "a" if i % 2 else "b"))
    return out


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    write_trace(path, _records())
    return path


def test_accept_lengths_match_replay() -> None:
    recs = _records()
    setting = DraftSetting(max_depth=16, spec_factor=1.0, spec_offset=1.0, min_token_prob=0.1)
    ev = evaluate(recs, setting, [1, 2, 4, 8])
    assert ev.accept[1] == 1.0
    for w in (2, 4, 8):
        ref = replay(recs, drafter_factory("suffix", setting.options(width=w)), w)
        assert ev.accept[w] == pytest.approx(ref.overall.summary()["accept_len"])
    assert ev.accept[8] > 1.3


def test_cost_models() -> None:
    lin = LinearCost(alpha=0.1)
    assert lin.relative(1, 1) == 1.0 and lin.relative(1, 5) == pytest.approx(1.4)
    assert lin.relative(4, 5) == pytest.approx(2.6)
    with pytest.raises(ValueError):
        LinearCost(-1)
    ana = AnalyticCost()
    assert ana.relative(1, 1) == pytest.approx(1.0)
    assert 1.0 <= ana.relative(1, 8) < ana.relative(256, 8)
    with pytest.raises(ValueError):
        AnalyticCost("no-such-preset")


def test_best_per_batch_turns_speculation_off_when_too_costly() -> None:
    space = SearchSpace([2, 4, 8], [16], [1.0], [0.0, 2.0], [0.1])
    evals = search(_records(), space)
    assert len(evals) == 3  # two grid points + the plugin default
    rows = best_per_batch(evals, space.widths, [1, 64], LinearCost(alpha=0.05))
    assert rows[0]["speculate"] and rows[0]["goodput"] > 1.0
    assert not rows[1]["speculate"] and rows[1]["width"] == 2
    assert rows[0]["goodput"] == pytest.approx(rows[0]["accept_length"] / rows[0]["cost"])


def test_tune_writes_loadable_config(trace: Path, tmp_path: Path, capsys) -> None:
    cfg, report = tmp_path / "out" / "cfg.json", tmp_path / "tune.json"
    rc = main(["tune", "--trace", str(trace), "--widths", "2,4,8", "--max-depth", "8,32",
               "--spec-factor", "1,2", "--spec-offset", "0", "--min-token-prob", "0.1",
               "--use-tree", "true,false", "--global-prompt-cap", "0,64",
               "--batch-sizes", "1,8", "--write-config", str(cfg),
               "--json", str(report), "--no-progress"])  # fmt: skip
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-4].split()[:3] == ["batch", "width", "max_depth"]
    assert lines[-3].startswith("-----")
    assert [ln.split()[0] for ln in lines[-2:]] == ["1", "8"]
    written = json.loads(cfg.read_text())
    assert set(written) == {
        "max_depth", "spec_factor", "spec_offset", "min_token_prob", "use_tree", "global_prompt_cap",
    }  # fmt: skip
    loaded = load_config({CONFIG_FILE_ENV: str(cfg)})
    assert loaded.max_depth == written["max_depth"] and loaded.sources["max_depth"] == "file"
    assert loaded.global_prompt_cap == written["global_prompt_cap"]
    doc = json.loads(report.read_text())
    assert doc["settings_evaluated"] == 17 and doc["chosen"]["batch_size"] == 1
    across = doc["across_widths"]
    assert set(across["accept_length"]) == {"2", "4", "8"}
    assert 0.0 < across["relative_to_best_per_width"] <= 1.0
    assert doc["config"] == written and doc["machine"]["python"]
    assert "1 + 0.01 * B * (W - 1)" in doc["cost_model"]


def test_tune_adaptive_is_optional(trace: Path, capsys) -> None:
    rc = main(["tune", "--trace", str(trace), "--widths", "2,4", "--max-depth", "16",
               "--spec-factor", "1", "--spec-offset", "0", "--min-token-prob", "0.1",
               "--batch-sizes", "1", "--adaptive", "--adaptive-steps", "50", "--no-progress"])  # fmt: skip
    assert rc == 0
    assert "adaptive controller" in capsys.readouterr().out


def test_tune_usage_errors(trace: Path, capsys) -> None:
    assert main(["tune"]) == 2
    assert main(["tune", "--url", "http://127.0.0.1:1"]) == 2
    assert "cannot change the settings of a running server" in capsys.readouterr().err
    assert main(["tune", "--trace", str(trace), "--widths", "1"]) == 2
    assert main(["tune", "--trace", str(trace.parent / "missing.jsonl")]) == 2


def test_plugin_default_setting_matches_config() -> None:
    d = DraftSetting.plugin_default()
    cfg = load_config({})
    assert d.config_dict() == {k: getattr(cfg, k) for k in d.config_dict()}
    assert isinstance(d.options(), DrafterOptions)


def test_one_setting_for_all_widths_is_the_best_geometric_mean() -> None:
    """A setting best at one width but poor at another loses to one close to the best
    at every width; exact ties go to the earlier grid point."""
    a = Evaluation(DraftSetting(spec_factor=1.0), {8: 3.0, 32: 3.0})  # best at 8 only
    b = Evaluation(DraftSetting(spec_factor=2.0), {8: 2.0, 32: 4.0})  # best at 32 only
    c = Evaluation(DraftSetting(spec_factor=4.0), {8: 2.9, 32: 3.9})  # close at both
    d = Evaluation(DraftSetting(spec_factor=8.0), {8: 2.9, 32: 3.9})  # tie with c
    score, best = best_across_widths([a, b, c, d], [1, 8, 32])
    assert best is c
    assert score == pytest.approx(((2.9 / 3.0) * (3.9 / 4.0)) ** 0.5)
    assert best_across_widths([], [8, 16]) is None
    assert best_across_widths([a], [1]) is None
