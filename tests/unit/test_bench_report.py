"""Table, JSON and plot writing, and parity comparison, of ``sglang-spec-ext bench``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sglang_spec_ext.bench import parity, report
from sglang_spec_ext.bench.metrics import RequestResult
from sglang_spec_ext.bench.plot import plot_results
from sglang_spec_ext.bench.workload import Load, Scenario


def _metrics(tput: float, lat: float, accept: float | None = None) -> dict:
    return {
        "output_throughput": tput, "accept_length": accept, "failed": 0,
        "e2e_latency_s": {"mean": lat, "median": lat, "p99": 2 * lat},
        "ttft_ms": {"mean": 50.0, "median": 40.0, "p99": 90.0},
        "itl_ms": {"mean": 5.0, "median": 4.0, "p99": 9.0},
    }  # fmt: skip


def _doc() -> dict:
    doc = report.new_document({"num_prompts": 4}, label="unit test")
    sc = Scenario("summarization", 102, 13)
    for load in (Load("rate", 1.0), Load("rate", math.inf), Load("concurrency", 2)):
        report.record_cell(doc, sc, load, "baseline", _metrics(100.0, 1.0))
        report.record_cell(doc, sc, load, "speculative", _metrics(150.0, 0.7, 1.8))
    report.record_cell(doc, Scenario("generation", 13, 102), Load("rate", 1.0), "baseline",
                       _metrics(90.0, 2.0))  # fmt: skip
    return doc


def test_document_has_machine_versions_and_cells() -> None:
    doc = _doc()
    assert doc["machine"]["cpu_count"] and "sglang" in doc["versions"]
    assert len(doc["cells"]) == 4
    cell = doc["cells"][0]
    assert cell["speedup"] == pytest.approx(1.5)
    assert doc["cells"][3]["speedup"] is None  # only the baseline was measured
    with pytest.raises(ValueError):
        report.record_cell(doc, Scenario("x", 1, 1), Load("rate", 1), "other", {})


def test_table_rows_and_rendering() -> None:
    text = report.render_table(_doc())
    lines = text.splitlines()
    assert lines[0] == "bench (running): unit test"
    assert lines[1].split()[:3] == ["scenario", "load", "in/out"]
    row = lines[3].split()
    assert row[:8] == [
        "summarization",
        "rate=1",
        "102/13",
        "100.0",
        "150.0",
        "1.50x",
        "1.80",
        "1.00/0.70",
    ]
    assert "rate=inf" in lines[4] and "conc=2" in lines[5]
    assert lines[6].split()[4:7] == ["-", "-", "-"]  # no speculative figures


def test_write_json_is_atomic_and_parses(tmp_path: Path) -> None:
    doc = _doc()
    path = report.write_json(doc, tmp_path / "sub" / "results.json")
    back = json.loads(path.read_text())
    assert back["cells"][1]["load"] == {"kind": "rate", "value": "inf"}
    assert not list(path.parent.glob("*.tmp"))


def test_plot_writes_png(tmp_path: Path) -> None:
    png = plot_results(_doc(), tmp_path / "bench.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_results(report.new_document({}), tmp_path / "empty.png") is None


def _res(ids: list[int] | None, ok: bool = True) -> RequestResult:
    return RequestResult(ok=ok, output_ids=ids, error=None if ok else "HTTP 500")


def test_first_difference() -> None:
    assert parity.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert parity.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert parity.first_difference([1, 2], [1, 2, 3]) == 2


def test_parity_compare_reports_position() -> None:
    ok = parity.compare([_res([1, 2]), _res([3])], [_res([1, 2]), _res([3])])
    assert ok["ok"] and ok["mismatches"] == 0
    assert "OK, 2 greedy prompts" in parity.describe(ok)
    bad = parity.compare([_res([1, 2, 3]), _res([3])], [_res([1, 9, 3]), _res(None, ok=False)])
    assert not bad["ok"] and bad["mismatches"] == 2
    assert bad["cases"][0]["first_diff"] == 1
    text = parity.describe(bad)
    assert "first difference at output token 1" in text and "request failed" in text


def test_parity_caveats_name_the_settings_that_rule_out_bit_identity() -> None:
    cpu = {"device": "cpu", "dtype": "float32", "kv_cache_dtype": "auto",
           "enable_deterministic_inference": False}  # fmt: skip
    assert parity.bit_identity_caveats("speculative", cpu) == []
    gpu = {**cpu, "device": "cuda", "dtype": "bfloat16"}
    caveats = parity.bit_identity_caveats("speculative", gpu)
    assert len(caveats) == 2
    assert "--dtype bfloat16" in caveats[0] and "--enable-deterministic-inference" in caveats[1]
    det = {**gpu, "dtype": "float32", "enable_deterministic_inference": True}
    assert parity.bit_identity_caveats("baseline", det) == []
    fp8 = {**cpu, "kv_cache_dtype": "fp8_e4m3"}
    assert "--kv-cache-dtype fp8_e4m3" in parity.bit_identity_caveats("baseline", fp8)[0]
    assert "unknown" in parity.bit_identity_caveats("baseline", None)[0]
    result = {**parity.compare([_res([1])], [_res([1])]), "caveats": caveats}
    text = parity.describe(result)
    assert text.startswith("parity: OK") and "cannot be expected to be bit-identical" in text
