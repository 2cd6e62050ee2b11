"""Trace files, bad input, and ``sglang-spec-ext simulate`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_spec_ext import cli
from sglang_spec_ext.replay import TraceError, TraceRecord, read_trace, write_trace
from sglang_spec_ext.replay.drafters import DrafterUnavailable, make_drafter


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def tiny_trace(tmp_path: Path) -> Path:
    body = list(range(10, 40))
    recs = [
        TraceRecord(tuple(body), tuple(body[:20] + [5, 6]), "code-edit"),
        TraceRecord((1, 2, 3), (4, 5, 6, 4, 5, 6, 4, 5, 6), "chat"),
        TraceRecord((7,), (), "chat"),
    ]
    path = tmp_path / "t.jsonl"
    write_trace(path, recs)
    return path


def test_trace_round_trip(tiny_trace: Path) -> None:
    recs = read_trace(tiny_trace)
    assert [r.set for r in recs] == ["code-edit", "chat", "chat"]
    assert recs[1].output_ids == (4, 5, 6, 4, 5, 6, 4, 5, 6)
    assert len(read_trace(tiny_trace, limit=2)) == 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt_ids": [1]}', 'missing "output_ids"'),
        ('{"prompt_ids": [1], "output_ids": "abc"}', "must be a list"),
        ('{"prompt_ids": [1, -2], "output_ids": []}', r'"prompt_ids"\[1\]'),
        ('{"prompt_ids": [1.5], "output_ids": []}', "non-negative integer"),
        ('{"prompt_ids": [true], "output_ids": []}', "non-negative integer"),
        ('{"prompt_ids": [1], "output_ids": [], "set": 3}', '"set" must be'),
    ],
)
def test_bad_line_names_line_number(tmp_path: Path, bad: str, message: str) -> None:
    good = '{"prompt_ids": [1], "output_ids": [2]}'
    path = _write_lines(tmp_path / "bad.jsonl", [good, "", bad, good])
    with pytest.raises(TraceError, match=r"bad\.jsonl:3: .*" + message):
        read_trace(path)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no records"):
        read_trace(_write_lines(tmp_path / "e.jsonl", [""]))
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(tmp_path / "absent.jsonl")


def test_unknown_drafter() -> None:
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("nope")


def test_simulate_end_to_end(
    tiny_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "r" / "report.json"
    table = tmp_path / "acc.jsonl"
    rc = cli.main(
        [
            "simulate", "--trace", str(tiny_trace), "--drafter", "prompt-lookup",
            "--width", "8", "--json", str(out_json), "--check",
            "--acceptance-table", str(table), "--ks", "1,7",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = captured.out.strip().splitlines()
    assert lines[0].startswith("drafter=prompt-lookup width=8")
    assert lines[-1].startswith("overall")  # the table is the last thing printed
    assert any(line.startswith("code-edit") for line in lines)
    report = json.loads(out_json.read_text())
    assert report["drafter"] == "prompt-lookup" and report["width"] == 8
    assert set(report["sets"]) == {"chat", "code-edit"}
    overall = report["overall"]
    assert overall["accept_len"] > 1.0 and overall["us_per_token"] > 0
    assert overall["requests"] == 3 and overall["output_tokens"] == 31
    assert report["versions"]["sglang-spec-ext"] and report["machine"]["cpu_count"]
    assert report["parameters"]["width"] == 8
    assert len(table.read_text().splitlines()) == 3


def test_simulate_set_filter(tiny_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "simulate",
            "--trace",
            str(tiny_trace),
            "--drafter",
            "prompt-lookup",
            "--set",
            "chat",
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "code-edit" not in out and "chat" in out


def test_simulate_bad_trace_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_lines(tmp_path / "b.jsonl", ['{"prompt_ids": [1], "output_ids": [2]}', "oops"])
    rc = cli.main(["simulate", "--trace", str(path), "--drafter", "prompt-lookup"])
    assert rc == 2
    assert "b.jsonl:2" in capsys.readouterr().err


def test_simulate_unavailable_drafter(
    tiny_trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sglang_spec_ext.replay import drafters

    def missing(opts: drafters.DrafterOptions) -> None:
        raise DrafterUnavailable("arctic-inference is not installed")

    monkeypatch.setitem(drafters._FACTORIES, "arctic", missing)
    rc = cli.main(["simulate", "--trace", str(tiny_trace), "--drafter", "arctic"])
    assert rc == 3
    assert "arctic-inference" in capsys.readouterr().err


def test_arctic_missing_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args, **kwargs):
        if name.startswith("arctic_inference"):
            raise ImportError("No module named 'arctic_inference'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(DrafterUnavailable, match="pip install arctic-inference"):
        make_drafter("arctic")
