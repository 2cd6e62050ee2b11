"""The embedded SmolLM2-135M-Instruct with a trained MTP layer, as a MiMo checkpoint.

SmolLM2 is a Llama model; MiMo (``MiMoForCausalLM``) is Qwen2 layers plus MTP layers,
and Qwen2 differs from Llama only by biases on the q/k/v projections. With those
biases zero the Qwen2-shaped copy computes the same function (:func:`write_mimo_dir`;
``tests/unit/test_smollm2_mtp.py`` checks the logits), and the host serves it with
``--speculative-algorithm NEXTN`` and no draft path, like MiMo-7B.

The MTP layer is trained here, once, on this machine's CPU
(:mod:`sglang_spec_ext.models.mtp_training`) from text that installed pip packages ship and the
model's own greedy answers to chat prompts built from that text
(:mod:`sglang_spec_ext.models.mtp_corpus`; none of the committed trace sets' sources is read). The result is
cached next to the converted model (``$SGLANG_SPEC_EXT_CACHE_DIR``, default
``~/.cache/sglang-spec-ext``) with ``TRAINING.json`` (data, settings, CPU time,
held-out step-1 agreement); the corpus depends on the installed packages' versions, so
two machines may train slightly different layers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sglang_spec_ext.models.mtp_corpus import DataConfig, build_training_data
from sglang_spec_ext.models.smollm2 import (
    SMOLLM2_DIR_NAME,
    _file_lock,
    default_cache_dir,
    ensure_smollm2_dir,
    publish_dir,
)

SMOLLM2_MTP_DIR_NAME = f"{SMOLLM2_DIR_NAME}-mimo-mtp"


def write_mimo_dir(src_dir: Path, out_dir: Path, mtp_tensors: dict[str, Any] | None) -> Path:
    """SmolLM2 (Llama) in ``src_dir`` as a MiMo checkpoint in ``out_dir``: Qwen2 config,
    zero q/k/v biases, and the MTP layer's tensors when given."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src_dir / "config.json").read_text())
    tensors = load_file(str(src_dir / "model.safetensors"))
    for key in list(tensors):
        if key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            bias = key.removesuffix("weight") + "bias"
            tensors[bias] = torch.zeros(tensors[key].shape[0], dtype=tensors[key].dtype)
    if mtp_tensors:
        tensors.update(mtp_tensors)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    drop = ("attention_bias", "mlp_bias", "pretraining_tp", "head_dim", "dtype")
    qwen2 = {k: v for k, v in config.items() if k not in drop}
    qwen2.update(
        model_type="qwen2",
        architectures=["MiMoForCausalLM"],
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=config["num_hidden_layers"],
        torch_dtype="float32",
        num_nextn_predict_layers=1 if mtp_tensors else 0,
    )
    (out_dir / "config.json").write_text(json.dumps(qwen2, indent=2) + "\n")
    for name in os.listdir(src_dir):
        if (
            name not in ("config.json", "model.safetensors", "SOURCE.txt")
            and (src_dir / name).is_file()
        ):
            shutil.copy2(src_dir / name, out_dir / name)
    return out_dir


def train_smollm2_mtp(
    data: DataConfig | None = None,
    train: Any = None,
    *,
    progress: bool = True,
    data_cache: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the data and train the layer: ``(mtp tensors, report)``. ``data_cache``: a
    file the built data is saved to, or loaded from when it exists for the same
    ``data`` settings (for repeated training experiments)."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_spec_ext.models.mtp_training import TrainConfig, step1_agreement, train_mtp

    data = data or DataConfig()
    train = train or TrainConfig()
    src = ensure_smollm2_dir()
    cpu0, wall0 = time.process_time(), time.time()
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(src)
    key = json.dumps({k: v for k, v in asdict(data).items() if k != "stats"}, sort_keys=True)
    cached = (
        torch.load(data_cache, weights_only=False)
        if data_cache and Path(data_cache).is_file()
        else None
    )
    if cached is not None and cached["key"] == key:
        samples, held_samples = cached["samples"], cached["held"]
        data.stats.update(cached["stats"], loaded_from=str(data_cache))
    else:
        samples, held_samples = build_training_data(data, model, tokenizer, progress=progress)
        if data_cache:
            torch.save({"key": key, "samples": samples, "held": held_samples, "stats": data.stats},
                       data_cache)  # fmt: skip
    with tqdm(
        total=None, desc="mtp training", unit="step", disable=not progress, file=sys.stderr
    ) as bar:

        def tick(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

        mtp = train_mtp(model, samples, train, progress=tick)
    chat_train = [s for s in samples if s.out_start < len(s.ids)][: len(held_samples)]
    report = {
        "target": src.name,
        "data": asdict(data),
        "train": asdict(train),
        "held_out_step1_agreement": step1_agreement(mtp, held_samples),
        "train_step1_agreement_chat": step1_agreement(mtp, chat_train),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "wall_s": round(time.time() - wall0, 1),
        "torch_threads": torch.get_num_threads(),
    }
    return mtp.mtp_state_dict(), report


def _is_complete(model_dir: Path) -> bool:
    return all(
        (model_dir / f).is_file() for f in ("config.json", "model.safetensors", "TRAINING.json")
    )


def ensure_smollm2_mtp(
    cache_dir: Path | None = None,
    *,
    progress: bool = True,
    force: bool = False,
    data: DataConfig | None = None,
    train: Any = None,
    data_cache: Path | None = None,
) -> Path:
    """SmolLM2 as MiMo with its trained MTP layer: trained once (tens of CPU minutes,
    with progress bars), then cached; concurrent callers wait on a file lock.
    ``force``: train again even if cached (``data``/``train``/``data_cache``: see
    :func:`train_smollm2_mtp`; ``benchmarks/train_smollm2_mtp.py`` uses them)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / SMOLLM2_MTP_DIR_NAME
    if _is_complete(target) and not force:
        return target
    with _file_lock(cache_dir / f".{SMOLLM2_MTP_DIR_NAME}.lock"):
        if _is_complete(target) and not force:
            return target
        tensors, report = train_smollm2_mtp(data, train, progress=progress, data_cache=data_cache)
        source = ensure_smollm2_dir(cache_dir)

        def build(tmp: Path) -> None:
            write_mimo_dir(source, tmp, tensors)
            (tmp / "TRAINING.json").write_text(json.dumps(report, indent=2) + "\n")

        publish_dir(target, build)
    return target


def load_smollm2_mtp(model_dir: Path | None = None) -> tuple[Any, Any]:
    """``(target, mtp layer)`` from a directory :func:`ensure_smollm2_mtp` wrote (default:
    the cached one), float32, eval mode, for offline proposals."""
    from sglang_spec_ext.models.mtp_layer import load_mimo_checkpoint

    return load_mimo_checkpoint(Path(model_dir) if model_dir is not None else ensure_smollm2_mtp())
