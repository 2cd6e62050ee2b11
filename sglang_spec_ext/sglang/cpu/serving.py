"""Serve with SGLang's CPU engine on a machine without sgl-kernel's CPU build.

``sglang-spec-ext serve-cpu -- <launch_server args>`` runs
``python -m sglang.launch_server`` with:

* ``SGLANG_USE_CPU_ENGINE=1``;
* :data:`~sglang_spec_ext.sglang.cpu.site.SITE_DIR` first on ``PYTHONPATH``, whose
  ``sitecustomize`` installs the placeholder modules of
  :mod:`sglang_spec_ext.sglang.cpu.placeholders` in the server and every process it
  spawns (the host imports ``sgl_kernel`` and ``torchvision`` although its CPU engine
  does not call them; a placeholder raises if anything does);
* the CPU defaults :data:`CPU_DEFAULTS` for each flag the arguments do not set, and for
  a model with Mamba-style state (Qwen3-Next, ...) :data:`MAMBA_CPU_DEFAULTS`.

The plugin's pure-torch kernel fallbacks (installed by the plugin itself on the CPU
engine) cover what speculative decoding needs from sgl-kernel. This module does not
import SGLang; the test harness, the demo and ``bench --serve-cpu`` use its helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Flags added unless the user's launch arguments set them (float32: fp16/bf16 KV on the
#: CPU engine drifts from the reference; torch_native: the CPU engine's pure-torch backend).
CPU_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--dtype", "float32"),
)


def placeholder_site_dir() -> Path:
    """The directory whose ``sitecustomize`` installs the placeholders."""
    from sglang_spec_ext.sglang.cpu.site import SITE_DIR

    return SITE_DIR


def _source_checkout_root() -> Path | None:
    """The checkout holding ``sglang_spec_ext`` when running from source, else None."""
    import sglang_spec_ext

    root = Path(sglang_spec_ext.__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def cpu_serving_env(
    base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: this process's environment) set up for CPU serving.

    Sets ``SGLANG_USE_CPU_ENGINE=1`` and puts the placeholder site directory (and the
    directory holding ``sglang_spec_ext``, so a source checkout works uninstalled)
    first on ``PYTHONPATH``; ``extra`` is applied last.
    """
    env = dict(os.environ if base is None else base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    checkout = _source_checkout_root()
    first = [str(placeholder_site_dir()), *([str(checkout)] if checkout else [])]
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    env["PYTHONPATH"] = os.pathsep.join([*first, *old])
    env.update(extra or {})
    return env


def _sets_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


#: Architectures with Mamba-style recurrent state (linear attention, SSM layers).
HYBRID_LINEAR_ARCHITECTURES = frozenset({
    "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "NemotronHForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
    "KimiLinearForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM",
})  # fmt: skip

#: What the CPU engine needs for those: the host's Mamba radix cache without state
#: snapshots (``extra_buffer`` needs platform support the CPU lacks), which in turn
#: needs overlap scheduling off (``srt/arg_groups/mamba_hook.py``).
MAMBA_CPU_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--mamba-radix-cache-strategy", "no_buffer"),
    ("--disable-overlap-schedule", None),
)


def hybrid_linear_architecture(model_path: str | Path | None) -> str | None:
    """The architecture of a local model with Mamba-style state, else None (also for a
    path without a readable ``config.json``: a hub name is not looked up)."""
    if not model_path:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for arch in config.get("architectures") or ():
        if arch in HYBRID_LINEAR_ARCHITECTURES:
            return arch
    return None


def mamba_cpu_flags(args: Sequence[str], model_path: str | Path | None = None) -> list[str]:
    """The :data:`MAMBA_CPU_DEFAULTS` flags ``args`` need and do not set (none for a
    model without Mamba-style state); the model is ``model_path`` or ``--model-path``."""
    model = model_path or _flag_value(args, "--model-path") or _flag_value(args, "--model")
    if hybrid_linear_architecture(model) is None:
        return []
    out: list[str] = []
    for flag, value in MAMBA_CPU_DEFAULTS:
        if not _sets_flag(args, flag):
            out += [flag] if value is None else [flag, value]
    return out


def with_cpu_defaults(args: Sequence[str], model_path: str | Path | None = None) -> list[str]:
    """``args`` plus each :data:`CPU_DEFAULTS` flag they do not set themselves, and for a
    model with Mamba-style state (``model_path``, or the one ``args`` name) the
    :data:`MAMBA_CPU_DEFAULTS` ones."""
    out = list(args)
    for flag, value in CPU_DEFAULTS:
        if not _sets_flag(out, flag):
            out += [flag, value]
    return out + mamba_cpu_flags(out, model_path)


def launch_command(args: Sequence[str], python: str | None = None) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for ``args`` on CPU."""
    return [python or sys.executable, "-m", "sglang.launch_server", *with_cpu_defaults(args)]


# -- the `serve-cpu` subcommand ---------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run `python -m sglang.launch_server` on SGLang's CPU engine without sgl-kernel's "
        "CPU build: sets SGLANG_USE_CPU_ENGINE=1, installs placeholder modules for the "
        "host's GPU-only imports (sgl_kernel, torchvision) that raise if called, and adds "
        + ", ".join(f"{f} {v}" for f, v in CPU_DEFAULTS)
        + " unless given. Example: sglang-spec-ext serve-cpu -- --model-path DIR "
        "--max-total-tokens 8192 --speculative-algorithm SUFFIX"
    )
    parser.add_argument(
        "--print-command",
        action="store_true",
        help="print the environment changes and the command instead of running it",
    )
    parser.add_argument(
        "launch_args",
        nargs=argparse.REMAINDER,
        metavar="-- LAUNCH_SERVER_ARGS",
        help="arguments for sglang.launch_server, after `--`",
    )


#: The host's per-rank core binding for CPU ranks (``srt/utils``: without it, it wants a
#: NUMA node per rank and stops at start-up otherwise).
OMP_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def cpu_ranks(args: Sequence[str]) -> int:
    """How many scheduler processes ``args`` start: ``tp * pp`` times ``dp`` (under DP
    attention the DP ranks are the TP ranks)."""

    def size(*flags: str) -> int:
        for flag in flags:
            value = _flag_value(args, flag)
            if value is not None:
                return max(int(value), 1)
        return 1

    tp, pp = size("--tp-size", "--tp"), size("--pp-size", "--pp")
    dp_attention = _sets_flag(args, "--enable-dp-attention") or size("--attn-dp-size") > 1
    dp = 1 if dp_attention else size("--dp-size", "--dp")
    return tp * pp * dp


def _numa_nodes() -> int:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return max(len(nodes), 1)


def omp_bind_for(ranks: int, cores: Sequence[int], numa_nodes: int) -> str | None:
    """A ``SGLANG_CPU_OMP_THREADS_BIND`` value giving each of ``ranks`` ranks its own
    share of ``cores`` (``"0-3|4-7"``; ranks share cores round robin when there are
    fewer cores than ranks), or None where the host's default (a NUMA node per rank)
    applies."""
    if ranks <= numa_nodes or not cores:
        return None
    cores = sorted(cores)
    if len(cores) < ranks:
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    per = len(cores) // ranks
    groups = [cores[i * per : (i + 1) * per] for i in range(ranks)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def bind_ranks(launch_args: Sequence[str], env: dict[str, str]) -> None:
    """Set :data:`OMP_BIND_ENV` for a multi-rank server where the user did not and the
    host would otherwise stop (more ranks than NUMA nodes), saying so on stderr."""
    if env.get(OMP_BIND_ENV):
        return
    ranks, nodes = cpu_ranks(launch_args), _numa_nodes()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    value = omp_bind_for(ranks, cores, nodes)
    if value is not None:
        env[OMP_BIND_ENV] = value
        print(f"serve-cpu: {ranks} ranks on {len(cores)} cores and {nodes} NUMA "
              f"node(s): {OMP_BIND_ENV}={value} (set it yourself to choose)", file=sys.stderr)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    launch_args = list(args.launch_args)
    if launch_args[:1] == ["--"]:
        launch_args = launch_args[1:]
    if not _sets_flag(launch_args, "--model-path") and not _sets_flag(launch_args, "--model"):
        print(
            "serve-cpu: no --model-path among the launch_server arguments; usage: "
            "sglang-spec-ext serve-cpu -- --model-path DIR [other launch_server args]",
            file=sys.stderr,
        )
        return 2
    cmd = launch_command(launch_args)
    env = cpu_serving_env()
    bind_ranks(launch_args, env)
    if args.print_command:
        print(f"SGLANG_USE_CPU_ENGINE={env['SGLANG_USE_CPU_ENGINE']}")
        print(f"PYTHONPATH={env['PYTHONPATH']}")
        if env.get(OMP_BIND_ENV):
            print(f"{OMP_BIND_ENV}={env[OMP_BIND_ENV]}")
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover - execve does not return


#: The GPU default path on the CPU engine, by name: the switches that make the CPU
#: engine run speculative decoding with overlap scheduling (``cpu/overlap.py``) and/or
#: emulated graph runners (``cpu/graphs.py``), as a GPU server does by default. The soak
#: harness (``--gpu-path``) and the test suite (``pytest --gpu-path``) use these names.
GPU_PATH_ENV: dict[str, dict[str, str]] = {
    "off": {},
    "overlap": {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1"},
    "graphs": {"SGLANG_SPEC_EXT_CPU_GRAPHS": "1"},
    "both": {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "1"},
}
