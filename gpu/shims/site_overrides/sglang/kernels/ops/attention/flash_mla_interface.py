"""Stand-in for sglang 0.5.23's ``sglang.kernels.ops.attention.flash_mla_interface`` on the
lent GPU machine (gpu/run overlays it on the carried sglang).

The real module imports the ``sgl-flash-mla`` wheel (``import flash_mla``) at module level.
The lent image has no such wheel, and sglang's EAGLE v2 worker (which HYBRID builds on)
imports ``flashmla_backend`` -> this module only to list the attention-backend classes its
draft-extend CUDA graph supports (``eagle_worker_v2._capture_cuda_graphs``): the second GPU
run's HYBRID server died there. Nothing on the lent run uses MLA attention (dense Llama,
triton backend), so the names exist and every call says why it cannot run.
"""

from __future__ import annotations

SPLIT_KV_MIN_TOPK = 641


class FlashMLASchedMeta:  # noqa: D101 - placeholder type, never built here
    def __init__(self, *args, **kwargs):
        _unavailable("FlashMLASchedMeta")


def _unavailable(name: str):
    raise RuntimeError(
        f"{name}: FlashMLA (the sgl-flash-mla wheel) is not carried to the lent GPU machine "
        "(gpu/shims/site_overrides); use an MLA-free model or carry the wheel"
    )


def get_mla_metadata(*args, **kwargs):
    _unavailable("get_mla_metadata")


def flash_mla_with_kvcache(*args, **kwargs):
    _unavailable("flash_mla_with_kvcache")


def flash_mla_sparse_fwd(*args, **kwargs):
    _unavailable("flash_mla_sparse_fwd")


def flash_mla_mega_prefill(*args, **kwargs):
    _unavailable("flash_mla_mega_prefill")


def flash_mla_mega_decode(*args, **kwargs):
    _unavailable("flash_mla_mega_decode")
