"""Server-argument handling for our algorithms.

The host runs ``validate_server_args`` first, then ``handle_server_args``; both
receive a stand-in for ``ServerArgs`` whose reads see the current resolution and
whose writes to existing fields are recorded as decisions (other names are
dropped). Every rejection names the flag and what to use instead.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sglang_spec_ext.config import ConfigError, PluginConfig, load_config

logger = logging.getLogger("sglang_spec_ext")

#: Verify width (tokens per request per verify, the root included) used when
#: ``--speculative-num-draft-tokens`` is not given.
DEFAULT_NUM_DRAFT_TOKENS = 16
#: Largest accepted verify width: the tree mask is width^2 per request.
MAX_NUM_DRAFT_TOKENS = 128
#: Tree breadth bound reported to the host as ``speculative_eagle_topk``.
MAX_TREE_BREADTH = 8
#: Host default for NGRAM-shaped algorithms; the same reasoning applies.
DEFAULT_MAX_RUNNING_REQUESTS = 48
SUPPORTED_DEVICES = ("cuda", "cpu", "xpu")
HYBRID = "HYBRID"
#: Set by validate_server_args in the launcher to the resolved HYBRID draft kind.
HYBRID_KIND_ENV = "SGLANG_SPEC_EXT_HYBRID_DRAFT"
#: Draft steps when --speculative-num-steps is not given (the host's EAGLE default chain).
HYBRID_DEFAULT_STEPS = 3


class IncompatibleServerArgs(ValueError):
    """A server flag cannot be combined with our algorithm."""


def _get(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def plugin_config() -> PluginConfig:
    """The validated plugin config, with errors phrased for a server start-up."""
    try:
        return load_config()
    except ConfigError as e:
        raise ConfigError(f"sglang-spec-ext configuration error: {e}") from None


def _mamba_cpu_problems(algo: str, args: Any, device: str) -> list[str]:
    """The CPU test bed's emulations a model with Mamba-style state (GDN) cannot take:
    overlap needs the host's ``extra_buffer`` state snapshots, which its CPU platform lacks
    (``--mamba-radix-cache-strategy no_buffer`` refuses overlap); the graph emulation's
    verify metadata does not cover the GDN backend (neither tried nor made correct)."""
    if device != "cpu":
        return []
    from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
    from sglang_spec_ext.sglang.cpu.graph_capture import cpu_graphs_requested
    from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
    from sglang_spec_ext.sglang.cpu.overlap import cpu_overlap_requested
    from sglang_spec_ext.sglang.cpu.serving import hybrid_linear_architecture

    arch = hybrid_linear_architecture(_get(args, "model_path"))
    if arch is None:
        return []
    problems = []
    if cpu_overlap_requested():
        problems.append(
            f"{OVERLAP_ENV}=1 with {arch} (Mamba-style state): overlap scheduling needs "
            "--mamba-radix-cache-strategy extra_buffer, whose state snapshots the CPU "
            f"platform lacks; unset {OVERLAP_ENV} ({algo} runs eagerly on it)"
        )
    if cpu_graphs_requested():
        problems.append(
            f"{GRAPHS_ENV}=1 with {arch} (Mamba-style state): the CPU graph emulation does "
            f"not cover the GDN backend's verify; unset {GRAPHS_ENV}"
        )
    return problems


def _flag_problems(algo: str, args: Any) -> list[str]:
    """Every flag that cannot be combined with ``algo``, each with its fix."""
    problems = []
    device = str(_get(args, "device") or "cuda").split(":", 1)[0]
    problems += _mamba_cpu_problems(algo, args, device)
    if device not in SUPPORTED_DEVICES:
        problems.append(
            f"--device {device}: {algo} supports {', '.join(SUPPORTED_DEVICES)}; "
            "use one of those or another --speculative-algorithm"
        )
    if (_get(args, "pp_size") or 1) > 1:
        problems.append(
            f"--pp-size {_get(args, 'pp_size')}: {algo} does not support pipeline "
            "parallelism; use --pp-size 1 (tensor parallelism with --tp-size works)"
        )
    attn_dp = _get(args, "attn_dp_size") or 1
    if (_get(args, "enable_dp_attention") or attn_dp > 1) and algo == HYBRID:
        # The host turns --enable-dp-attention into --attn-dp-size N (the flag reads
        # False after that): check both spellings.
        problems.append(
            f"--enable-dp-attention / --attn-dp-size {attn_dp}: HYBRID does not support DP "
            "attention yet (its model draft's forwards would need their own token counts "
            "for the gathered MLP; docs/distributed.md); use --speculative-algorithm SUFFIX, "
            "or drop the flag (plain data parallelism: --dp-size)"
        )
    if _get(args, "speculative_use_block_verification"):
        problems.append(
            f"--speculative-use-block-verification: not available with {algo} "
            "(its drafts carry no proposal distribution); drop the flag"
        )
    if _get(args, "enable_watermark"):
        problems.append(
            f"--enable-watermark: watermarking is not supported with {algo}; drop the flag "
            "or run without speculative decoding"
        )
    if _get(args, "speculative_adaptive"):
        problems.append(
            "--speculative-adaptive: the host's adaptive steps only drive EAGLE chains; "
            f"for {algo} drop the flag and set SGLANG_SPEC_EXT_ADAPTIVE=1"
        )
    if algo == HYBRID:
        problems += _hybrid_problems(args)
    elif _get(args, "speculative_draft_model_path"):
        problems.append(
            f"--speculative-draft-model-path: {algo} is model-free and loads no draft "
            "model; drop the flag"
        )
    problems += _disaggregation_problems(algo, args)
    if _get(args, "enable_two_batch_overlap"):
        problems.append(f"--enable-two-batch-overlap: not supported with {algo}; drop the flag")
    width = _get(args, "speculative_num_draft_tokens")
    if algo != HYBRID and width is not None and not (2 <= int(width) <= MAX_NUM_DRAFT_TOKENS):
        problems.append(
            f"--speculative-num-draft-tokens {width}: the verify width (root included) "
            f"must be in [2, {MAX_NUM_DRAFT_TOKENS}] for {algo}"
        )
    return problems


def _disaggregation_problems(algo: str, args: Any) -> list[str]:
    """Prefill-decode disaggregation: SUFFIX drafts on the decode server, whose sessions
    start from the prompt and the prefill server's first token (docs/distributed.md)."""
    mode = _get(args, "disaggregation_mode") or "null"
    if mode == "null":
        return []
    if algo == HYBRID:
        return [
            f"--disaggregation-mode {mode}: HYBRID's model draft would need its state from "
            "the prefill server (the draft's KV cache, and for EAGLE drafts the first "
            "step's top-k and hidden states); HYBRID's workers are not wired or tested to "
            "send it (prefill) or seed their drafts from it (decode); use "
            "--speculative-algorithm SUFFIX on the decode server"
        ]
    if mode == "prefill":
        return [
            f"--disaggregation-mode prefill: {algo} drafts only on the decode server and "
            "the prefill server needs no speculative settings (the decode side receives no "
            "draft state from it); drop --speculative-algorithm on the prefill server"
        ]
    # --disaggregation-decode-enable-radix-cache: the host itself refuses it for every
    # speculative algorithm but EAGLE/EAGLE3/DSPARK (arg_groups/speculative_hook.py).
    return []


def validate_server_args(args: Any) -> None:
    """Host hook ``validate_server_args``: reject bad config and incompatible flags."""
    algo = str(_get(args, "speculative_algorithm") or "SUFFIX").upper()
    config = plugin_config()
    problems = _flag_problems(algo, args)
    if problems:
        raise IncompatibleServerArgs(
            f"--speculative-algorithm {algo} cannot start:\n  - " + "\n  - ".join(problems)
        )
    if algo == HYBRID:
        from sglang_spec_ext.sglang.model_drafts.draft_kind import draft_kind

        draft_path, revision = hybrid_draft_source(args, announce=True)
        # Resolved once, here in the launcher; the scheduler processes inherit it.
        kind = draft_kind(
            draft_path,
            config.hybrid_draft,
            revision=revision,
            trust_remote_code=bool(_get(args, "trust_remote_code")),
        )
        os.environ[HYBRID_KIND_ENV] = kind
        logger.info("HYBRID: the model draft runs as the host's %s draft", kind.upper())


def _target_mtp_draft(args: Any) -> tuple[str | None, str]:
    """``target_mtp_draft`` of the target (``--model-path``, ``--revision``)."""
    from sglang_spec_ext.sglang.model_drafts.draft_kind import target_mtp_draft

    model_path = _get(args, "model_path")
    if not model_path:
        return None, "no --model-path"
    return target_mtp_draft(
        model_path,
        revision=_get(args, "revision"),
        trust_remote_code=bool(_get(args, "trust_remote_code")),
    )


def hybrid_draft_source(args: Any, announce: bool = False) -> tuple[str | None, str | None]:
    """HYBRID's draft checkpoint and revision: ``--speculative-draft-model-path`` when
    given; else, for a target with MTP layers, the target itself (``--model-path``,
    ``--revision``), whose MTP layers the host loads as the draft as it does for NEXTN;
    else ``(None, None)`` (``_hybrid_problems`` refuses that). ``announce`` logs the
    choice (once, from ``validate_server_args``)."""
    path = _get(args, "speculative_draft_model_path")
    if path:
        return path, _get(args, "speculative_draft_model_revision")
    mtp, target_arch = _target_mtp_draft(args)
    if mtp is None:
        return None, None
    if announce:
        logger.info(
            "HYBRID: no --speculative-draft-model-path; the target's own MTP layers draft "
            "(%s as %s, on the host's EAGLE path, as NEXTN serves them)",
            target_arch,
            mtp,
        )
    return _get(args, "model_path"), _get(args, "revision")


def hybrid_kind() -> str:
    """The model-draft kind HYBRID runs (resolved by ``validate_server_args``)."""
    kind = os.environ.get(HYBRID_KIND_ENV, "auto")
    return "standalone" if kind == "auto" else kind


def _hybrid_problems(args: Any) -> list[str]:
    problems = []
    if not _get(args, "speculative_draft_model_path"):
        mtp, target_arch = _target_mtp_draft(args)
        if mtp is None:
            problems.append(
                "--speculative-draft-model-path is missing: HYBRID needs a draft model (a "
                "small causal LM with the target's vocabulary, or an EAGLE/EAGLE3 head) "
                f"unless the target carries MTP layers, and {_get(args, 'model_path')!r} "
                f"({target_arch}) has none the host can load as a draft; pass "
                "--speculative-draft-model-path, or for drafts without a model use "
                "--speculative-algorithm SUFFIX"
            )
    if _get(args, "speculative_use_rejection_sampling"):
        problems.append(
            "--speculative-use-rejection-sampling: suffix drafts carry no proposal "
            "distribution; drop the flag (sampled requests are verified exactly without it)"
        )
    if _get(args, "enable_multi_layer_eagle"):
        problems.append("--enable-multi-layer-eagle: not supported with HYBRID; drop the flag")
    steps = _get(args, "speculative_num_steps")
    topk = _get(args, "speculative_eagle_topk")
    width = _get(args, "speculative_num_draft_tokens")
    for flag, value, lo, hi in (
        ("--speculative-num-steps", steps, 1, MAX_NUM_DRAFT_TOKENS - 1),
        ("--speculative-eagle-topk", topk, 1, MAX_TREE_BREADTH),
        ("--speculative-num-draft-tokens", width, 2, MAX_NUM_DRAFT_TOKENS),
    ):
        if value is not None and not lo <= int(value) <= hi:
            problems.append(f"{flag} {value}: must be in [{lo}, {hi}] for HYBRID")
    return problems


def _scheduling_defaults(algo: str, args: Any) -> None:
    """What every algorithm of ours sets alike: a running-request default, no mixed chunks."""
    if _get(args, "max_running_requests") is None:
        args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
        logger.warning(
            "%s: --max-running-requests defaults to %d; set it explicitly to change.",
            algo,
            DEFAULT_MAX_RUNNING_REQUESTS,
        )
    if _get(args, "enable_mixed_chunk"):
        logger.warning("%s: mixed chunked prefill is turned off (host limitation).", algo)
    args.enable_mixed_chunk = False


def _cpu_overlap_policy(algo: str, args: Any) -> None:
    """The host has no overlap scheduling for speculative decoding on CPU: turn it off
    there unless SGLANG_SPEC_EXT_CPU_OVERLAP=1 emulates it (cpu/overlap.py)."""
    device = str(_get(args, "device") or "cuda").split(":", 1)[0]
    if device != "cpu" or _get(args, "disable_overlap_schedule"):
        return
    from sglang_spec_ext.sglang.cpu.overlap import ENV, cpu_overlap_requested

    if cpu_overlap_requested():
        logger.warning("%s on CPU: overlap scheduling kept on (%s=1).", algo, ENV)
    else:
        args.disable_overlap_schedule = True
        logger.warning("%s on CPU: overlap scheduling turned off (host limitation).", algo)


def handle_hybrid_server_args(algo: str, args: Any) -> None:
    """Host hook ``handle_server_args`` for HYBRID: the host's model-draft settings
    (as its STANDALONE/EAGLE handling resolves them) plus what HYBRID needs."""
    # HYBRID keeps overlap scheduling (the host's default for its V2 model-draft workers):
    # its suffix sessions take committed tokens from the worker's own outputs
    # (hybrid_commits.py). On CPU the host has no overlap for speculative decoding.
    _cpu_overlap_policy(algo, args)
    _scheduling_defaults(algo, args)
    if not _get(args, "speculative_draft_model_path") and _get(args, "model_path"):
        # An MTP target (validate_server_args refused any other without a draft path): the
        # draft worker loads the target's checkpoint as its MTP class, as for NEXTN.
        path, revision = hybrid_draft_source(args)
        if path:
            args.speculative_draft_model_path = path
            args.speculative_draft_model_revision = revision
    steps = _get(args, "speculative_num_steps")
    topk = _get(args, "speculative_eagle_topk")
    width = _get(args, "speculative_num_draft_tokens")
    if steps is None:
        steps = HYBRID_DEFAULT_STEPS
        args.speculative_num_steps = steps
    if topk is None:
        topk = 1
        args.speculative_eagle_topk = topk
    if topk == 1 and width != steps + 1:
        if width is not None:
            logger.warning(
                "%s: --speculative-num-draft-tokens is %d with --speculative-eagle-topk 1: "
                "the host verifies a chain of --speculative-num-steps + 1 = %d tokens",
                algo,
                width,
                steps + 1,
            )
        args.speculative_num_draft_tokens = steps + 1
    elif width is None:
        args.speculative_num_draft_tokens = min(steps * topk + 1, MAX_NUM_DRAFT_TOKENS)
    page_size = _get(args, "page_size") or 1
    backend = _get(args, "attention_backend")
    if topk > 1 and page_size > 1 and backend not in (None, "flashinfer", "fa3", "triton"):
        raise IncompatibleServerArgs(
            f"--page-size {page_size} with --attention-backend {backend}: tree drafts "
            "(--speculative-eagle-topk > 1) need page size 1 or the flashinfer, fa3 or triton "
            "backend; use --page-size 1 or --speculative-eagle-topk 1"
        )


def handle_server_args(algo: str, args: Any) -> None:
    """Host hook ``handle_server_args``: set every field the NGRAM-shaped path needs."""
    config = plugin_config()
    # SUFFIX keeps overlap scheduling (the GPU default): its drafter splices the relayed
    # accepted tokens as the host's NGRAM does.
    _cpu_overlap_policy(algo, args)
    _scheduling_defaults(algo, args)

    width = _get(args, "speculative_num_draft_tokens")
    if width is None:
        width = DEFAULT_NUM_DRAFT_TOKENS
        args.speculative_num_draft_tokens = width
    breadth = max(1, min(MAX_TREE_BREADTH, width - 1)) if config.use_tree else 1
    args.speculative_eagle_topk = breadth
    args.speculative_num_steps = max(1, width // breadth)
    # The host's NGRAM fields size its own corpus, which our worker never builds.
    args.speculative_ngram_max_trie_depth = config.max_depth

    page_size = _get(args, "page_size") or 1
    backend = _get(args, "attention_backend")
    if breadth > 1 and page_size > 1 and backend not in (None, "flashinfer"):
        raise IncompatibleServerArgs(
            f"--page-size {page_size} with --attention-backend {backend}: tree verification "
            "is only correct with page size 1 or the flashinfer backend; use --page-size 1, "
            "--attention-backend flashinfer, or chain drafts (SGLANG_SPEC_EXT_USE_TREE=0)"
        )
