"""Start-up check of the device memory that wide verify widths need.

The verify width ``W`` (``--speculative-num-draft-tokens``) multiplies the size of
buffers the host allocates *after* it has sized the KV pool, out of the memory the
KV pool leaves (``--mem-fraction-static``: the KV pool takes all free memory but
``(1 - mem_fraction_static) x`` the free memory before the model was loaded,
``mem_cache/kv_cache_configurator.py: _profile_available_bytes``). With CUDA graphs
each verify graph runner captures ``max_bs = max(capture batch sizes)`` requests of
``W`` tokens (``T = max_bs x W`` query tokens) and its attention backend sizes static
buffers for ``T`` tokens of up to ``context_len`` keys each
(``init_cuda_graph_state(max_bs, T)``), SGLang 0.5.23:

* flashinfer (``flashinfer_backend.py``): ``cuda_graph_kv_indices``, int32, ``T x
  context_len`` per wrapper (1 wrapper; 2 with sliding-window or cross attention) and
  ``cuda_graph_custom_mask``, uint8, ``T x context_len``:
  ``T x context_len x (4 x wrappers + 1)`` bytes;
* fa3 (``flashattention_backend.py``): the verify mask (``verify_mask.py``), bool,
  ``max_bs x W x (context_len + W)`` for tree drafts (topk > 1, full mask) or
  ``max_bs x W x W`` for chains, plus for trees an int32 page table of ``max_bs x W x W``
  (its other verify buffers do not grow with ``W``);
* triton (``triton_backend.py``): ``cuda_graph_kv_indices``, int64, ``T x
  context_len``; the verify mask, uint8, ``max_bs x W x (context_len + W)``; and the
  fp32 split-KV partials ``T x heads x kv_splits x (v_head_dim + 1)``;
* other backends: not estimated.

Runners sized by ``W``: the target's verify graph; for model drafts (HYBRID) also the
draft-extend graph (``eagle_draft_extend_cuda_graph_runner.py``: ``max_bs x W``
tokens); with the adaptive controller on model drafts, both again per step-count state
at that state's width (``model_draft_adaptive.tree_verify_widths``, ``steps + 1`` for
chains); with the adaptive controller on SUFFIX and graphs on, the target's verify
graph again at each width it can choose (``adaptive_worker.verify_graph_widths``). With a hybrid attention backend whose verify runs on the prefill backend,
both backends allocate.

Verify logits: the target's logits for ``max_bs x W`` rows, float32, in the graph
runners' shared output buffer (``graph_shared_output.py``: ``(max_rows, vocab)``
fp32, ``max_rows = max_bs x W``), or allocated per verify without CUDA graphs:
``max_bs x W x vocab x 4`` bytes, once.

The issue's example: flashinfer, ``max_bs`` 48, 128k context, ``W`` 64:
``3072 x 131072 x 5`` bytes = 2.01 GB (1.88 GiB) of attention buffers, plus 1.58 GB
(1.47 GiB) of logits with a 128,256-token vocabulary: 3.59 GB (3.34 GiB).

The check (:func:`check_verify_memory`) runs in each scheduler process right before
the target model runner builds its graph runners (a ``HookRegistry`` BEFORE hook on
``GraphSharedOutput.create_for_model_runner``, the first thing the host's
``capture_cuda_graphs`` does; the KV pools of target and draft and the attention
backends exist then, nothing ``W``-sized does), for our algorithms (SUFFIX, HYBRID)
on CUDA devices. It refuses to start when the estimate exceeds the free device
memory, with the flags, the numbers and settings that keep the buffers within half of it;
above half of it, it warns (activations and the graphs themselves come from the same
memory).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

CHECK_TARGET = (
    "sglang.srt.model_executor.graph_shared_output.GraphSharedOutput.create_for_model_runner"
)
#: Our algorithms; the host's own keep the host's behaviour.
CHECKED_ALGORITHMS = ("SUFFIX", "HYBRID")
#: Above this share of the free memory the estimate is logged as a warning.
WARN_SHARE = 0.5
GIB = float(1 << 30)


class VerifyMemoryError(RuntimeError):
    """The verify-width-dependent buffers do not fit the memory left after KV sizing."""


@dataclass(frozen=True)
class VerifyShape:
    """What sizes the verify-width-dependent buffers of one server process."""

    backends: tuple[str, ...]  # attention backends that allocate verify graph buffers
    max_bs: int  # largest captured batch size (--cuda-graph-max-bs-decode, --max-running-requests)
    widths: tuple[int, ...]  # verify width of each graph runner sized by it
    context_len: int  # --context-length (the model's by default)
    vocab_size: int
    topk: int = 1  # tree breadth (--speculative-eagle-topk as resolved)
    cuda_graphs: bool = True
    flashinfer_wrappers: int = 1
    triton_bytes_per_token: int = 0  # fp32 split-KV partials per query token


def attention_buffer_bytes(
    backend: str,
    max_bs: int,
    width: int,
    context_len: int,
    *,
    topk: int = 1,
    flashinfer_wrappers: int = 1,
    triton_bytes_per_token: int = 0,
) -> int:
    """Bytes of one verify graph runner's ``width``-dependent attention buffers."""
    tokens = max_bs * width
    if backend == "flashinfer":
        return tokens * context_len * (4 * flashinfer_wrappers + 1)
    if backend == "fa3":
        if topk > 1:
            return max_bs * width * (context_len + width) + max_bs * width * width * 4
        return max_bs * width * width
    if backend == "triton":
        mask = max_bs * width * (context_len + width)
        return tokens * context_len * 8 + mask + tokens * triton_bytes_per_token
    return 0


def logits_bytes(max_bs: int, width: int, vocab_size: int) -> int:
    """Bytes of the float32 verify logits of ``max_bs`` requests of ``width`` tokens."""
    return max_bs * width * vocab_size * 4


def verify_buffer_bytes(shape: VerifyShape) -> dict[str, int]:
    """The estimate by part: ``attention`` (graph buffers; 0 without CUDA graphs) and
    ``logits``."""
    attention = 0
    if shape.cuda_graphs:
        for backend in shape.backends:
            for width in shape.widths:
                attention += attention_buffer_bytes(
                    backend,
                    shape.max_bs,
                    width,
                    shape.context_len,
                    topk=shape.topk,
                    flashinfer_wrappers=shape.flashinfer_wrappers,
                    triton_bytes_per_token=shape.triton_bytes_per_token,
                )
    widest = max(shape.widths, default=0)
    return {"attention": attention, "logits": logits_bytes(shape.max_bs, widest, shape.vocab_size)}


def _total(shape: VerifyShape) -> int:
    return sum(verify_buffer_bytes(shape).values())


def _largest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """Largest ``x`` in ``[lo, hi]`` with ``fits(x)`` (monotone), or ``None``."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _scaled_widths(shape: VerifyShape, width: int) -> tuple[int, ...]:
    """The runners' widths with the start-up width replaced by ``width`` (the adaptive
    states' widths capped by it)."""
    return tuple(min(w, width) for w in shape.widths)


def check_verify_memory(
    shape: VerifyShape,
    free_bytes: float,
    *,
    mem_fraction_static: float | None = None,
    pre_model_load_bytes: float | None = None,
) -> dict[str, int]:
    """Raise :class:`VerifyMemoryError` when the estimate exceeds ``free_bytes``
    (the device memory free after KV sizing); return the estimate by part."""
    parts = verify_buffer_bytes(shape)
    need = sum(parts.values())
    if need <= free_bytes:
        if need > WARN_SHARE * free_bytes:
            logger.warning(
                "sglang-spec-ext: verify buffers for --speculative-num-draft-tokens %d take "
                "%.2f GiB of the %.2f GiB left after the KV cache; activations and CUDA "
                "graphs come from the rest (lower --mem-fraction-static if start-up or "
                "load runs out of memory)",
                max(shape.widths),
                need / GIB,
                free_bytes / GIB,
            )
        return parts
    width = max(shape.widths)
    # suggestions leave the warning's margin for activations and the graphs themselves
    budget = WARN_SHARE * free_bytes

    def fits_width(w: int) -> bool:
        return _total(replace(shape, widths=_scaled_widths(shape, w))) <= budget

    def fits_bs(bs: int) -> bool:
        return _total(replace(shape, max_bs=bs)) <= budget

    def fits_context(ctx: int) -> bool:
        return _total(replace(shape, context_len=ctx)) <= budget

    fixes = []
    best_width = _largest(fits_width, 2, width - 1)
    fixes.append(
        f"--speculative-num-draft-tokens {best_width} (largest verify width that fits)"
        if best_width is not None
        else "no --speculative-num-draft-tokens fits at this batch size and context"
    )
    best_bs = _largest(fits_bs, 1, shape.max_bs - 1)
    if best_bs is not None:
        fixes.append(f"--cuda-graph-max-bs-decode {best_bs} and --max-running-requests {best_bs}")
    if shape.cuda_graphs and parts["attention"]:
        best_ctx = _largest(fits_context, 1, shape.context_len - 1)
        if best_ctx is not None:
            fixes.append(f"--context-length {best_ctx}")
    if mem_fraction_static is not None and pre_model_load_bytes:
        lower = mem_fraction_static - (need / WARN_SHARE - free_bytes) / pre_model_load_bytes
        lower = math.floor(lower * 1000) / 1000
        if lower > 0:
            fixes.append(f"--mem-fraction-static {lower} (more memory outside the KV cache)")
    backends = "+".join(shape.backends) or "none"
    raise VerifyMemoryError(
        f"sglang-spec-ext: --speculative-num-draft-tokens {width} needs "
        f"{need / GIB:.2f} GiB of device memory for verify buffers but only "
        f"{free_bytes / GIB:.2f} GiB is left after the KV cache "
        f"(--mem-fraction-static {mem_fraction_static}): attention graph buffers "
        f"{parts['attention'] / GIB:.2f} GiB ({backends}, {len(shape.widths)} graph "
        f"runner(s) of widths {list(shape.widths)}, max batch {shape.max_bs} from "
        f"--cuda-graph-max-bs-decode / --max-running-requests, --context-length "
        f"{shape.context_len}: max_bs x W x context_len cells) and fp32 verify logits "
        f"{parts['logits'] / GIB:.2f} GiB (max_bs x W x vocab {shape.vocab_size} x 4). "
        "The server would run out of memory capturing CUDA graphs or under load. Any "
        f"one of these keeps them within {WARN_SHARE:.0%} of the memory outside the KV "
        "cache: " + "; ".join(fixes) + "."
    )


# -- the host hook ---------------------------------------------------------------------


def _backend_objects(backend: Any) -> list[Any]:
    found = [backend]
    for name in ("decode_backend", "prefill_backend"):
        inner = getattr(backend, name, None)
        if inner is not None:
            found.append(inner)
    return found


def _adaptive_widths(steps: int, topk: int, width: int) -> tuple[int, ...]:
    """Verify widths of the adaptive step-count states below the start-up one."""
    from sglang_spec_ext.sglang.model_drafts.adaptive import tree_verify_widths

    if topk > 1:
        return tuple(tree_verify_widths(steps, topk, width)[:steps])
    return tuple(s + 1 for s in range(steps))


def shape_of(model_runner: Any) -> VerifyShape | None:
    """The target runner's verify shape from the host's published config; ``None``
    where the check does not apply (not our algorithm, not CUDA, a draft runner)."""
    from sglang.srt.runtime_context import get_exec, get_spec, max_speculative_num_draft_tokens

    spec = get_spec()
    algo = str(spec.speculative_algorithm or "").upper()
    if algo not in CHECKED_ALGORITHMS or getattr(model_runner, "is_draft_worker", False):
        return None
    if not str(getattr(model_runner, "device", "cuda")).startswith("cuda"):
        return None
    width = int(max_speculative_num_draft_tokens() or spec.speculative_num_draft_tokens or 1)
    topk = int(spec.speculative_eagle_topk or 1)
    graph = get_exec().graph
    from sglang.srt.model_executor.cuda_graph_config import Backend

    config = graph.cuda_graph_config
    cuda_graphs = config is not None and config.decode.backend != Backend.DISABLED
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import (
        get_batch_sizes_to_capture,
    )

    if cuda_graphs:
        max_bs = max(get_batch_sizes_to_capture(model_runner, width)[0])
    else:
        max_bs = int(model_runner.req_to_token_pool.size)
    widths: tuple[int, ...] = (width,)
    if algo == "HYBRID":
        from sglang_spec_ext.config import load_config

        widths = (width, width)  # target verify and the draft's draft-extend graph
        steps = int(spec.speculative_num_steps or 1)
        if load_config().adaptive:
            for w in _adaptive_widths(steps, topk, width):
                widths += (w, w)
    if algo == "SUFFIX" and cuda_graphs:
        from sglang_spec_ext.config import load_config

        if load_config().adaptive:
            from sglang_spec_ext.sglang.workers.adaptive_worker import verify_graph_widths

            widths += tuple(w for w in verify_graph_widths(width) if w != width)
    backends = [str(getattr(model_runner, "decode_attention_backend_str", "") or "")]
    prefill = str(getattr(model_runner, "prefill_attention_backend_str", "") or "")
    if prefill and prefill != backends[0] and spec.speculative_attention_mode == "prefill":
        backends.append(prefill)
    objects = _backend_objects(getattr(model_runner, "attn_backend", None))
    wrappers = max([int(getattr(b, "num_wrappers", 1) or 1) for b in objects] or [1])
    per_token = 0
    for b in objects:
        if all(hasattr(b, n) for n in ("num_head", "max_kv_splits", "v_head_dim")):
            per_token = int(b.num_head) * int(b.max_kv_splits) * (int(b.v_head_dim) + 1) * 4
    mc = model_runner.model_config
    return VerifyShape(
        backends=tuple(b for b in backends if b),
        max_bs=int(max_bs),
        widths=widths,
        context_len=int(mc.context_len),
        vocab_size=int(mc.vocab_size),
        topk=topk,
        cuda_graphs=cuda_graphs,
        flashinfer_wrappers=wrappers,
        triton_bytes_per_token=per_token,
    )


def free_device_bytes(model_runner: Any) -> float:
    """Free device memory now, the minimum over ranks as the host's KV sizing reads it."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils import get_available_gpu_memory

    parallel = get_parallel()
    distributed = parallel.launch_world_size > 1
    gib = get_available_gpu_memory(
        model_runner.device,
        model_runner.gpu_id,
        distributed=distributed,
        cpu_group=parallel.world_group.cpu_group if distributed else None,
    )
    return float(gib) * GIB


#: The check ran in this process (it runs once, for the target runner).
_done = False


def _check_hook(cls: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``GraphSharedOutput.create_for_model_runner``: check once per process."""
    global _done
    model_runner = args[0] if args else kwargs.get("model_runner")
    if _done or model_runner is None:
        return None
    shape = shape_of(model_runner)
    if shape is None:
        return None
    _done = True
    from sglang.srt.runtime_context import get_schedule

    pre = getattr(model_runner, "pre_model_load_memory", None)
    parts = check_verify_memory(
        shape,
        free_device_bytes(model_runner),
        mem_fraction_static=get_schedule().mem_fraction_static,
        pre_model_load_bytes=None if pre is None else float(pre) * (1 << 30),
    )
    logger.info(
        "sglang-spec-ext verify buffers: %.2f GiB attention graph buffers, %.2f GiB verify "
        "logits (max batch %d, widths %s, context %d)",
        parts["attention"] / GIB,
        parts["logits"] / GIB,
        shape.max_bs,
        list(shape.widths),
        shape.context_len,
    )
    return None


def install_verify_memory_check() -> list[str]:
    """Register the start-up check (idempotent); return the installed name."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    register_hooks_once([(CHECK_TARGET, _check_hook, HookType.BEFORE)])
    return ["verify_memory_check"]
