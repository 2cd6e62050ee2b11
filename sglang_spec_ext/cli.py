"""The ``sglang-spec-ext`` console script.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only dispatches, and imports a subcommand's
module only when that subcommand runs (so ``doctor`` works without torch).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("sglang_spec_ext.doctor", "check host version, plugin registration and config"),
    "simulate": ("sglang_spec_ext.replay.cli", "replay token traces through a drafter offline"),
    "bench": ("sglang_spec_ext.bench.cli", "compare baseline and speculative serving"),
    "tune": ("sglang_spec_ext.tune", "search draft settings on traces or a launched server"),
    "make-model": (
        "sglang_spec_ext.models.make_model",
        "write an embedded model (smollm2, smollm2-mtp, weak drafts) to a directory",
    ),
    "serve-cpu": (
        "sglang_spec_ext.sglang.cpu.serving",
        "serve on the CPU engine without sgl-kernel: serve-cpu -- <launch_server args>",
    ),
    "cpu-env": (
        "sglang_spec_ext.sglang.cpu.host_tools",
        "run one of SGLang's own tools (e.g. its serving benchmark) on a CPU-only machine",
    ),
}

DESCRIPTION = """sglang-spec-ext: speculative decoding for an unmodified SGLang server.

Algorithms (python -m sglang.launch_server ... --speculative-algorithm NAME):
  SUFFIX   model-free drafts from suffix trees over past requests and the request's own
           text; no draft model, no GPU memory (code edits, agents, RAG, repeats)
  HYBRID   per request and step, the suffix draft or the host's model draft (STANDALONE,
           EAGLE, EAGLE3, or the target's own MTP layer), whichever should be accepted more
Also: a goodput controller for draft widths and steps (SGLANG_SPEC_EXT_ADAPTIVE=1, over
SUFFIX or the host's model drafts), ragged verify (each request verifies its own draft
length), per-request speculation control, grammar-aware drafts for structured output,
tenant isolation on shared servers, external corpora, warm restarts, /metrics.

Docs: README.md and docs/ in the source (docs/tools.md for these commands,
docs/configuration.md for every setting). Start with: sglang-spec-ext doctor"""


def _build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, object | None]:
    parser = argparse.ArgumentParser(
        prog="sglang-spec-ext",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv else None
    module = None
    for name, (mod_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(mod_name)
            module.add_arguments(sp)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = _build_parser(argv)
    args = parser.parse_args(argv)
    if module is None:
        parser.print_help()
        return 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
