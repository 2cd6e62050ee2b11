"""Replay simulator and the adaptive replay benchmark (synthetic mode, small)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from sglang_spec_ext.adaptive.simulator import (
    AcceptanceTable,
    FixedPolicy,
    load_tables,
    replay,
)
from sglang_spec_ext.adaptive.synthetic import best_first_order, generate, write_jsonl

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "adaptive_replay.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("adaptive_replay_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_token_accounting_on_a_handmade_table() -> None:
    # one request of 6 output tokens; ks = (0, 2, 4): a(p, 2) = 2 and a(p, 4) = 4 everywhere
    acc = [[0, min(2, 5 - p), min(4, 5 - p)] for p in range(6)]
    table = AcceptanceTable.from_rows([{"set": "t", "ks": [0, 2, 4], "accepted": acc}])
    assert table.ks.tolist() == [0, 2, 4] and table.column(3) == 1 and table.column(1) == 0

    def cost(bs: int, k: int) -> float:
        return 1.0

    # decoding starts at position 1: 5 tokens to commit per request
    r = replay(table, 1, FixedPolicy(4), cost, steps=2)
    assert (r.tokens, r.seconds) == (10, 2.0)  # 1 + 4 tokens, done; the refill: 5 more
    r = replay(table, 1, FixedPolicy(3), cost, steps=2)  # uses the k=2 column
    assert r.tokens == 3 + 2  # p=1: a=2 -> 3 tokens; p=4: a=1 -> 2 tokens (the end)
    r0 = replay(table, 3, FixedPolicy(0), cost, steps=7)
    assert r0.tokens == 21 and r0.goodput == 3.0  # plain decoding: one token per request


def test_repair_cost_charges_the_first_drafting_step_after_zero_steps() -> None:
    """``repair_cost``: each zero step leaves one token per request without draft KV;
    the next step with k > 0 is charged for rebuilding them (and the policy gets no step
    time for it, but the whole step's with the repair's size); refilled requests start
    with nothing to rebuild."""
    acc = [[0, min(1, 40 - p)] for p in range(41)]
    table = AcceptanceTable.from_rows([{"set": "t", "ks": [0, 1], "accepted": acc}] * 3)

    class Pattern:
        name = "0,0,0,1"

        def __init__(self) -> None:
            self.i, self.times, self.repairs, self.unwritten = 0, [], [], []

        def choose(self, batch_size, req_ids):
            self.i += 1
            return 1 if self.i % 4 == 0 else 0

        def observe(self, bs, k, accepted, step_time_s, ids, finished, within=None):
            self.times.append(step_time_s)

        def observe_repair_step(self, bs, k, seconds, tokens, requests):
            self.repairs.append((bs, k, seconds, tokens, requests))

        def note_unwritten(self, tokens, requests):
            self.unwritten.append((tokens, requests))

    charged: list[tuple[int, int]] = []

    def repair(tokens: int, requests: int) -> float:
        charged.append((tokens, requests))
        return 10.0

    pol = Pattern()
    r = replay(
        table, 2, pol, lambda bs, k: 1.0, steps=8, noise=0.0, outlier_rate=0.0, repair_cost=repair
    )
    assert charged == [(6, 2), (6, 2)]  # 3 zero steps x 2 requests, twice
    assert r.seconds == 8 * 1.0 + 2 * 10.0
    assert pol.times[3] is None and pol.times[7] is None and pol.times[0] == 1.0
    assert pol.repairs == [(2, 1, 11.0, 6, 2), (2, 1, 11.0, 6, 2)]  # step + repair time
    # before each decision the policy is told what a repair would rebuild, as the
    # server's gauge does
    assert pol.unwritten == [(0, 0), (2, 2), (4, 2), (6, 2)] * 2
    r = replay(table, 2, FixedPolicy(0), lambda bs, k: 1.0, steps=8, repair_cost=repair)
    assert len(charged) == 2 and r.seconds == 8.0  # never drafting: never repairing


def test_plain_decoding_goodput_is_batch_over_step_time() -> None:
    table = AcceptanceTable.from_rows(generate("chat", 5, seed=0))
    r = replay(table, 16, FixedPolicy(0), lambda bs, k: 0.02, steps=50)
    assert r.goodput == pytest.approx(16 / 0.02)
    assert r.k_hist == {0: 50}


def test_synthetic_tables_are_nested_and_round_trip(tmp_path: Path) -> None:
    order = best_first_order((0.5, 0.2), 10)
    assert list(order)[:3] == [(1,), (1, 1), (2,)]
    rows = generate("mixed", 6, ks=[1, 2, 4, 8], seed=3, mean_len=60)
    for row in rows:
        a = np.array(row["accepted"])
        assert np.all(np.diff(a, axis=1) >= 0)  # nested trees never accept less
        assert np.all(a <= np.array([1, 2, 4, 8]))
        assert np.all(a[:, -1] <= len(a) - 1 - np.arange(len(a)))
    write_jsonl(rows, tmp_path / "m.jsonl")
    tables = load_tables([tmp_path / "m.jsonl"])
    assert list(tables) == ["mixed"] and len(tables["mixed"].lengths) == 6


def test_benchmark_synthetic_small_meets_the_bars(tmp_path: Path) -> None:
    bench = load_bench()
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["--synthetic", "--sets", "mixed", "--batch-sizes", "1,16,256"]
    args += ["--steps", "2000", "--requests", "100"]
    args += ["--out", str(out), "--plot", str(png)]
    if not bench.host_ema_available():
        args.append("--no-host-ema")
    report = bench.main(args)
    saved = json.loads(out.read_text())
    assert saved["label"] == "analytic step-cost model (projection, not measured)"
    assert png.stat().st_size > 10_000
    assert set(saved["results"]) == {"mixed"}
    assert set(saved["results"]["mixed"]) == {"1", "16", "256"}
    for set_name, rows in report["bars"].items():
        for bs, bars in rows.items():
            assert bars["ok_best_fixed"], (set_name, bs, bars)
            assert bars["ok_plain"], (set_name, bs, bars)
            if "ok_host_ema" in bars:
                assert bars["ok_host_ema"], (set_name, bs, bars)
    assert report["all_bars_ok"]


def test_benchmark_model_draft_mode_charges_draft_forwards(tmp_path: Path) -> None:
    """--model-drafts: STANDALONE-shaped tables from the committed trace proposals and an
    EAGLE-shaped synthetic set; zero steps through the speculative worker costs a draft
    forward (warm) unless skipped, and "plain" is a server without speculation."""
    bench = load_bench()
    common = ["--model-drafts", "--batch-sizes", "1,128", "--steps", "600", "--requests", "40"]
    if not bench.host_ema_available():
        common.append("--no-host-ema")
    reports = {}
    for zero in ("warm", "skip", "repair"):
        out = tmp_path / f"{zero}.json"
        no_plot = [] if zero == "skip" else ["--plot", ""]  # skip: the plot follows --out
        reports[zero] = bench.main([*common, "--zero-step", zero, "--out", str(out), *no_plot])
    assert (tmp_path / "skip.png").stat().st_size > 10_000 and not (tmp_path / "warm.png").exists()
    warm, skip = reports["warm"]["results"], reports["skip"]["results"]
    assert set(warm) == {"standalone:agentic", "standalone:chat", "standalone:code-edit",
                         "standalone:repeat", "eagle3:synthetic"}  # fmt: skip
    for set_name in warm:
        for bs in ("1", "128"):
            w, s = warm[set_name][bs], skip[set_name][bs]
            assert w["plain"]["goodput_tok_s"] == s["plain"]["goodput_tok_s"]
            # k = 0 on the speculative worker: plain + a draft forward, or exactly plain
            assert w["fixed k=0"]["goodput_tok_s"] < 0.99 * w["plain"]["goodput_tok_s"]
            assert s["fixed k=0"]["goodput_tok_s"] == pytest.approx(s["plain"]["goodput_tok_s"])
            best = max(v["goodput_tok_s"] for n, v in w.items() if n.startswith("fixed"))
            assert w["controller"]["goodput_tok_s"] >= 0.95 * best, (set_name, bs)
    # repair: zero steps are plain decoding there too, and the controller meets the
    # plain bar where the draft extend at zero steps puts warm below it
    repair = reports["repair"]["results"]
    for set_name in repair:
        for bs in ("1", "128"):
            row = repair[set_name][bs]
            assert row["fixed k=0"]["goodput_tok_s"] == pytest.approx(row["plain"]["goodput_tok_s"])
            assert row["controller"]["goodput_tok_s"] >= 0.98 * row["plain"]["goodput_tok_s"]
    # the EAGLE-shaped head pays off at batch 1 with several steps
    assert warm["eagle3:synthetic"]["1"]["controller"]["mean_k"] > 3


def test_mtp_preset_charges_one_target_layer_input_proj_and_the_full_vocab_head() -> None:
    """An MTP layer of Llama-3-8B (hidden 4096, 8 KV heads of 128, MLP 14336, vocab
    128256) in bf16: one decoder layer + input_proj [H, 2H] + the target's own LM head,
    not EAGLE-3's 32k-vocab head; one layer of KV; the draft extend runs at zero steps."""
    from sglang_spec_ext.adaptive.prior import PRESETS, step_time

    h, kv, mlp, vocab = 4096, 8 * 128, 14336, 128256
    layer = h * h * 2 + h * kv * 2 + 3 * h * mlp
    expected = 2 * (layer + h * 2 * h + vocab * h)
    mtp, eagle = PRESETS["llama3-8b-h100-mtp"], PRESETS["llama3-8b-h100-eagle3"]
    assert mtp.draft_weight_bytes == pytest.approx(expected, rel=2e-3)
    assert mtp.draft_kv_bytes_per_token == 2 * kv * 2 == 4096
    assert mtp.zero_step_draft == 1.0
    # the target's constants are the 8B preset's; only the draft differs
    for name in ("weight_bytes", "kv_bytes_per_token", "fixed_s", "spec_fixed_s"):
        assert getattr(mtp, name) == getattr(PRESETS["llama3-8b-h100"], name)
    # the full-vocabulary head makes each draft forward dearer than an EAGLE-3 head's
    assert step_time(mtp, 1, 3)[0] > step_time(eagle, 1, 3)[0]
    bench = load_bench()
    assert bench.SHAPE_PRESETS["mtp"] == "llama3-8b-h100-mtp"


def _mtp_trace(path: Path, draft: str, n: int, seed: int) -> None:
    """``n`` records of 40 output tokens whose chains of 4 match the output 0-4 deep."""
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        for _ in range(n):
            out = [int(t) for t in rng.integers(10, 90, size=40)]
            chains = []
            for p in range(len(out)):
                good = int(rng.integers(0, 5))
                chain = [out[p + j] if p + j < len(out) and j < good else 99 for j in range(4)]
                chains.append(chain)
            rec = {"set": path.stem, "prompt_ids": [1, 2, 3], "output_ids": out,
                   "model_drafts": {draft: {"k": 4, "tokens": chains,
                                            "probs": [[0.5] * 4] * len(out)}}}  # fmt: skip
            fh.write(json.dumps(rec) + "\n")


def test_benchmark_mtp_drafts_option_replays_recorded_proposals(tmp_path: Path) -> None:
    """--mtp-drafts NAME: one MTP-shaped set per trace file from model_drafts[NAME],
    charged with the MTP preset (the controller's prior from it, deliberately wrong),
    against every fixed step count, plain decoding and the host EMA; a name the traces
    lack is refused with the file named."""
    bench = load_bench()
    traces = tmp_path / "traces"
    traces.mkdir()
    _mtp_trace(traces / "alpha.jsonl", "fake-mtp", 12, seed=1)
    _mtp_trace(traces / "beta.jsonl", "fake-mtp", 12, seed=2)
    out = tmp_path / "mtp.json"
    args = ["--mtp-drafts", "fake-mtp", "--trace-dir", str(traces), "--batch-sizes", "1,256"]
    args += ["--steps", "400", "--out", str(out), "--plot", ""]
    ema = bench.host_ema_available()
    report = bench.main(args if ema else [*args, "--no-host-ema"])
    saved = json.loads(out.read_text())
    assert set(saved["results"]) == {"mtp:alpha", "mtp:beta"}
    params = saved["parameters"]
    assert params["mtp_draft"] == "fake-mtp"
    assert params["shapes"] == {"mtp:alpha": "mtp", "mtp:beta": "mtp"}
    assert set(params["truth_presets"].values()) == {"llama3-8b-h100-mtp"}
    assert any("model_drafts[fake-mtp]" in s for s in saved["source"])
    table = saved["tables"]["mtp:alpha"]
    assert table["ks"] == [1, 2, 3, 4] and table["candidate_ks"] == [0, 1, 2, 3, 4]
    truth = bench.PRESETS["llama3-8b-h100-mtp"]
    prior = table["controller_cost_prior"]
    for name, scale in bench.CONTROLLER_DRAFT_PRIOR_SCALE.items():
        assert prior[name] == pytest.approx(getattr(truth, name) * scale)
    row = report["results"]["mtp:alpha"]["1"]
    want = {"plain", "controller", *(f"fixed k={k}" for k in range(5))}
    assert want | ({"host EMA"} if ema else set()) == set(row)
    # charged as the MTP layer: k = 0 on the speculative worker is plain + a draft forward
    t0 = bench.step_time(truth, 1, 0)[0]
    assert row["fixed k=0"]["goodput_tok_s"] == pytest.approx(1 / t0, rel=1e-6)
    assert row["fixed k=0"]["goodput_tok_s"] < row["plain"]["goodput_tok_s"]
    for rows in report["bars"].values():  # a short replay: looser than the bars
        for bars in rows.values():
            assert bars["ctl_over_best_fixed"] >= 0.95 and bars["ctl_over_plain"] >= 0.95, bars
    with pytest.raises(SystemExit):
        bench.main(["--mtp-drafts", "smollm2-mtp", "--trace-dir", str(traces), "--out", ""])


def test_check_bars_counts_a_near_tie_as_level_only_where_the_ema_sits_on_the_optimum() -> None:
    bench = load_bench()

    def row(ctl: float, ema: float, fixed1: float) -> dict[str, dict]:
        return {"plain": {"goodput_tok_s": 100.0}, "fixed k=0": {"goodput_tok_s": 100.0},
                "fixed k=1": {"goodput_tok_s": fixed1}, "controller": {"goodput_tok_s": ctl},
                "host EMA": {"goodput_tok_s": ema}}  # fmt: skip

    above = bench.check_bars(row(100.0, 99.9, 90.0))
    assert above["vs_host_ema"] == "above" and above["ok"]
    level = bench.check_bars(row(99.7, 100.0, 90.0))  # the EMA on plain, the optimum
    assert level["vs_host_ema"] == "level" and level["ok"]
    # 0.6 % below: not level even on the optimum
    assert bench.check_bars(row(99.4, 100.0, 90.0))["vs_host_ema"] == "below"
    # fixed k=1 the optimum at 120: an EMA at 119.5 is within 0.5 % of it (on it) ...
    assert bench.check_bars(row(119.0, 119.5, 120.0))["vs_host_ema"] == "level"
    # ... an EMA at 117.5 is not, and any shortfall from it is below
    off = bench.check_bars(row(117.0, 117.5, 120.0))
    assert off["vs_host_ema"] == "below" and not off["ok_host_ema"] and not off["ok"]
