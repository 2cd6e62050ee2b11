"""Prefill-decode disaggregation on SGLang's CPU engine: stand-ins for the CUDA the host's
``srt/disaggregation`` code assumes.

With Mooncake's TCP transport (``--disaggregation-transfer-backend mooncake_tcp``, which
sets ``MC_FORCE_TCP=1``; PyPI's ``mooncake-transfer-engine-non-cuda``) the host moves KV
between a prefill and a decode server on the CPU engine, except at three places where
SGLang 0.5.23 reaches for CUDA (each found by starting a plain PD pair on CPU):

``retraction_backup`` (AROUND on ``kv_cache_builder.resolve_decode_retraction_backup``)
    A decode server defaults its retraction backup to ``host_pool``, a HiCache host pool
    registered with ``cudaHostRegister`` (``pool_host/common.py``): the decode server dies
    at start-up with "Torch not compiled with CUDA enabled". On the CPU engine the KV pool
    already is host memory; the backup resolves to ``cpu_tensor`` (the host's other
    backend: copies into CPU tensors) unless the user chose one.
    (``--disaggregation-decode-retraction-backup cpu_tensor`` does the same by hand.)

``host_index_copy`` (AFTER on ``MooncakeKVSender.__init__``)
    Mooncake's sender declares ``supports_host_tensor_indices``, so the prefill side's
    ``_send_kv_chunk`` copies each chunk's page indices into a *pinned* CPU tensor and
    records a ``torch.cuda.Event`` for the transfer thread to wait on; pinned memory
    needs an accelerator, and the prefill scheduler dies at its first transfer. On the
    CPU engine each sender says it does not, and the host takes its plain path
    (``kv_to_page_indices``), the indices already being CPU tensors.

``sync_event`` (REPLACE of ``torch.cuda.Event`` in a CPU-only torch)
    With overlap scheduling (the prefill server's default), the early send of a
    cached prefix (``maybe_send_cached_prefix_chunk``, ``SGLANG_DISAGG_PREFILL_EARLY_SEND_
    CACHED_PREFIX``, default on) records a ``torch.cuda.Event`` on the forward stream;
    a CPU-only torch cannot build one. It becomes ``torch.cpu.Event``, whose ``record``,
    ``wait`` and ``synchronize`` are no-ops and ``query`` is True: exact on the CPU
    engine, where a forward has finished writing its KV when its call returns.

What this cannot show: RDMA or NVLink transports, GPU memory registration, the
transfer overlapping a running forward; only a GPU pair shows those (docs/distributed.md).
Nothing is installed unless the host runs its CPU engine.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger("sglang_spec_ext")

RETRACTION_BACKUP_TARGET = "sglang.srt.mem_cache.kv_cache_builder.resolve_decode_retraction_backup"
MOONCAKE_SENDER_INIT_TARGET = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
CUDA_EVENT_TARGET = "torch.cuda.Event"
#: What the retraction backup resolves to on the CPU engine.
CPU_RETRACTION_BACKUP = "cpu_tensor"


def retraction_backup_hook(original: Any, *args: Any, **kwargs: Any) -> str:
    """AROUND ``resolve_decode_retraction_backup``: ``cpu_tensor`` unless the user chose."""
    from sglang.srt.runtime_context import get_context, get_disagg

    if get_disagg().disaggregation_decode_retraction_backup is None:
        get_context().override(
            "sglang_spec_ext.cpu.disaggregation",
            disaggregation_decode_retraction_backup=CPU_RETRACTION_BACKUP,
        )
        logger.info(
            "sglang-spec-ext: CPU engine: decode retraction backup %s (the host_pool "
            "backup registers host memory with CUDA)",
            CPU_RETRACTION_BACKUP,
        )
    return original(*args, **kwargs)


def sender_init_hook(result: Any, sender: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MooncakeKVSender.__init__``: no pinned host copy of the page indices."""
    sender.supports_host_tensor_indices = False


def torch_lacks_cuda() -> bool:
    """True for a torch built without CUDA (its ``cuda.Event`` cannot be built)."""
    return torch.version.cuda is None and not torch.cuda.is_available()


def install_cpu_disaggregation() -> list[str]:
    """Install the stand-ins (the caller checks the host runs its CPU engine); return
    what was installed."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_on_import, register_hooks_once

    feature = "prefill-decode disaggregation on the CPU engine"
    # Mooncake's module is hooked when a PD server imports it, never imported here: its
    # import at plugin load turned the host's multi-process metrics off on every server.
    register_hooks_on_import(
        MOONCAKE_SENDER_INIT_TARGET.rsplit(".", 2)[0],
        [(MOONCAKE_SENDER_INIT_TARGET, sender_init_hook, HookType.AFTER)],
        feature,
    )
    hooks: list[tuple[str, Any, Any]] = [
        (RETRACTION_BACKUP_TARGET, retraction_backup_hook, HookType.AROUND),
    ]
    installed = ["pd_retraction_backup", "pd_host_index_copy"]
    if torch_lacks_cuda():
        hooks.append((CUDA_EVENT_TARGET, torch.cpu.Event, HookType.REPLACE))
        installed.append("pd_sync_event")
    register_hooks_once(hooks, feature)
    return installed
