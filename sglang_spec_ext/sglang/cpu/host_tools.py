"""``sglang-spec-ext cpu-env -- COMMAND``: run one of SGLang's own tools on a CPU-only
machine, e.g. its serving benchmark against a CPU server:

    sglang-spec-ext cpu-env -- python -m sglang.benchmark.serving --backend sglang \\
        --base-url http://127.0.0.1:30000 --dataset-name random --num-prompts 32

The host's tools import modules that need packages a CPU-only set-up does not have
(``torchvision`` through the model configs, ``sgl_kernel``); the command runs with the
environment ``serve-cpu`` gives a server (:func:`~sglang_spec_ext.sglang.cpu.serving.
cpu_serving_env`: the placeholder modules first on ``PYTHONPATH``, the CPU engine on).
This module does not import SGLang.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a command (one of SGLang's own tools, e.g. `python -m sglang.benchmark.serving`) "
        "with the environment serve-cpu gives a server on a CPU-only machine: placeholder "
        "modules for the host's GPU-only imports (sgl_kernel, torchvision) and "
        "SGLANG_USE_CPU_ENGINE=1. Example: sglang-spec-ext cpu-env -- python -m "
        "sglang.benchmark.serving --backend sglang --base-url http://127.0.0.1:30000 "
        "--dataset-name random --num-prompts 32"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command, after `--`"
    )


def run(args: argparse.Namespace) -> int:
    from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env

    cmd = list(args.command)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        print(
            "cpu-env: no command; usage: sglang-spec-ext cpu-env -- COMMAND [ARGS]", file=sys.stderr
        )
        return 2
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable  # the interpreter sglang-spec-ext runs in (its venv)
    exe = shutil.which(cmd[0])
    if exe is None:
        print(f"cpu-env: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(exe, cmd, cpu_serving_env())
    return 0  # pragma: no cover - execve does not return
