"""Ragged verify under CUDA graphs: verify graphs keyed by the batch's total verify tokens.

The host's decode graph runner captures target-verify graphs per batch size at
``bs x width`` tokens, so a ragged verify (``verify/ragged.py``: ``sum L_i`` tokens)
cannot replay one. The host has the other keying: its *compact ragged mode*
(``DecodeCudaGraphRunner.ragged_verify_mode``, built for DSPARK): one graph per token
bucket (``bs x width`` for every captured ``bs``), each with ``min(tokens, max_bs)``
request slots, replayed for a batch whose verify carries a ``RaggedVerifyLayout``
(``srt/speculative/ragged_verify.py``) rounded up to the next bucket; the runner stages
the live per-request lengths into the captured layout's tensors before each replay. An
algorithm opts in through its spec class's ``supports_ragged_verify()``.

SUFFIX (and adaptive SUFFIX) opt in where every part of that path exists
(:func:`ragged_graphs_wanted`): ragged verify and ``SGLANG_SPEC_EXT_RAGGED_GRAPHS`` on,
no LoRA (the host's compact runner refuses it), and an attention backend with a ragged
verify in graphs for the drafts served: the CPU engine's ``torch_native`` under the graph
emulation (trees, ``cpu/ragged_attention.py``), or the host's FA3 / trtllm_mha for chain
drafts (their ragged verify is causal, ``ragged_backends.py``; SUFFIX drafts chains with
``SGLANG_SPEC_EXT_USE_TREE=0``). flashinfer refuses a ragged verify in graphs; triton has
none. What this module adds to the host:

* :func:`compact_graphs_hook` (AROUND ``ragged_verify_compact_graphs_enabled``): the
  host turns compact mode on with ``SGLANG_RAGGED_VERIFY_MODE=compact`` for every
  algorithm that supports it; for ours, the plugin's own decision stands instead, so
  users set nothing and DSPARK's mode is untouched;
* :func:`capture_spec_info_hook` (AROUND ``DecodeCudaGraphRunner.get_spec_info``): the
  host attaches a capture layout to DFLASH-family verify inputs only; an NGRAM verify
  input (what SUFFIX verifies with) gets the runner's own capture layout too;
* :func:`bucket_layout`: the step's layout, for ``RaggedTarget``, which pads the
  compact forward's tokens to the bucket (padding tokens write KV slot 0, the pool's
  reserved padding slot, and belong to no request).

In compact mode the runner replays only verify batches that carry a layout, so every
verify step of such a worker carries one (uniform lengths where nothing is padded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

#: The host's gate of the compact (token-bucket) verify graphs.
COMPACT_GATE_TARGET = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.ragged_verify_compact_graphs_enabled"
)
#: Where the decode graph runner builds the verify input it captures with.
CAPTURE_SPEC_INFO_TARGET = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
)


def ragged_graphs_wanted(server_args: Any | None = None) -> bool:
    """Whether SUFFIX's verify graphs are token-bucket graphs in this server: ragged
    verify and ragged graphs on, no LoRA, and an attention backend with a ragged verify in
    graphs for these drafts: the CPU engine's graph emulation with ``torch_native`` (trees
    and chains), or on a GPU the host's FA3 / trtllm_mha with chain drafts
    (``--speculative-eagle-topk 1``: ``SGLANG_SPEC_EXT_USE_TREE=0``; their ragged verify is
    causal, ``ragged_backends.py``)."""
    from sglang_spec_ext.sglang.cpu.graphs import cpu_graphs_enabled
    from sglang_spec_ext.sglang.serving.server_args import plugin_config
    from sglang_spec_ext.sglang.verify.ragged_backends import HOST_LAYOUT_BACKEND_FLAGS

    config = plugin_config()
    if not (config.ragged_verify and config.ragged_graphs):
        return False
    if server_args is None:
        server_args = _host_server_args()
    if server_args is None:
        return False
    if getattr(server_args, "enable_lora", None) or getattr(server_args, "lora_paths", None):
        return False
    if int(getattr(server_args, "speculative_num_draft_tokens", None) or 0) < 2:
        return False  # nothing to verify ragged (the worker keeps ragged verify off)
    backend = getattr(server_args, "attention_backend", None)
    if cpu_graphs_enabled():
        return backend in (None, "torch_native")
    if str(getattr(server_args, "device", None) or "cuda").split(":", 1)[0] != "cuda":
        return False
    chains = int(getattr(server_args, "speculative_eagle_topk", None) or 1) <= 1
    graphs = not getattr(server_args, "disable_cuda_graph", False)
    return chains and graphs and backend in HOST_LAYOUT_BACKEND_FLAGS


def _host_server_args() -> Any:
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:  # noqa: BLE001 - no host runtime context
        return None


#: The spec classes that opt in (by name: ``serving/spec_class.py`` imports this module).
OPTING_SPEC_CLASSES = ("sglang_spec_ext.sglang.serving.spec_class.ModelFreeSpecAlgo",)


def _is_plugin_algorithm(spec_algorithm: Any) -> bool:
    return any(
        f"{cls.__module__}.{cls.__qualname__}" in OPTING_SPEC_CLASSES
        for cls in type(spec_algorithm).__mro__
    )


def compact_graphs_hook(original: Callable[..., bool], spec_algorithm: Any) -> bool:
    """AROUND the host's compact-mode gate: ours decide by ``supports_ragged_verify()``
    alone (no host environment variable); the host's algorithms as the host decides."""
    if _is_plugin_algorithm(spec_algorithm):
        return bool(spec_algorithm.supports_ragged_verify())
    return bool(original(spec_algorithm))


def capture_spec_info_hook(original: Callable[..., Any], runner: Any, num_tokens: int) -> Any:
    """AROUND ``DecodeCudaGraphRunner.get_spec_info``: in compact mode, a capture verify
    input without a layout gets the runner's capture layout for ``num_tokens``."""
    spec_info = original(runner, num_tokens)
    if (
        spec_info is not None
        and getattr(runner, "ragged_verify_mode", False)
        and getattr(spec_info, "ragged_verify_layout", None) is None
        and _is_plugin_algorithm(runner.model_runner.spec_algorithm)
    ):
        spec_info.ragged_verify_layout = runner._capture_ragged_verify_layout(num_tokens)
    return spec_info


def compact_runner(target_worker: Any) -> Any:
    """The target's verify graph runner if it keys graphs by tokens (else None)."""
    model_runner = getattr(target_worker, "model_runner", None)
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    if runner is None or not getattr(runner, "ragged_verify_mode", False):
        return None
    return runner


def bucket_layout(target_worker: Any, lens: list[int], device: Any) -> Any:
    """The host layout of a verify with per-request ``lens`` (root included), its
    ``graph_num_tokens`` the token bucket the runner replays; None where the target's
    runner has no token buckets or the batch exceeds its slots (the verify runs eager)."""
    runner = compact_runner(target_worker)
    if runner is None:
        return None
    grid = runner.capture_num_tokens
    if not grid or len(lens) > runner.max_bs or sum(lens) > grid[-1]:
        return None
    from sglang.srt.speculative.ragged_verify import round_up_grid

    from sglang_spec_ext.sglang.verify.ragged_backends import layout_from_lens

    return layout_from_lens(lens, device, round_up_grid(total=int(sum(lens)), grid=grid))


def ragged_graph_hooks() -> list[tuple[str, Any, Any]]:
    """``(target, hook, HookType)`` for ``host/hooks.register_hooks_once``."""
    from sglang.srt.plugins.hook_registry import HookType

    return [
        (COMPACT_GATE_TARGET, compact_graphs_hook, HookType.AROUND),
        (CAPTURE_SPEC_INFO_TARGET, capture_spec_info_hook, HookType.AROUND),
    ]


def install_ragged_graphs() -> list[str]:
    """Register the hooks (inert unless a SUFFIX spec class opts in at a runner's start)."""
    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once(ragged_graph_hooks())
    return ["ragged_graphs"]
