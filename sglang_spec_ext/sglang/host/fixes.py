"""Fixes for host bugs that hit speculative serving, applied at run time.

Each fix is a named :class:`HostFix`: the host function it hooks, why, and what the
upstream fix would be. They are installed through the host's own ``HookRegistry``
in every process the plugin loads in (GPU and CPU alike: the bugs are not CPU
specific), switched off as a group with ``SGLANG_SPEC_EXT_HOST_FIXES=0``.
``tests/host/test_host_fixes.py`` fails loudly when a host version moves a target.

req-to-token row headroom (``req_to_token_row_headroom``)
    SGLang 0.5.23 sizes each row of the request-to-token table at
    ``context_len + 4 + num_draft_tokens``
    (``mem_cache/allocation_sizing.py: get_req_to_token_extra_context_len``), but
    every speculative decode step reserves ``2 * alloc_len_per_decode`` slots past
    the committed length (``eagle_utils.eagle_prepare_for_decode``, the overlap
    double buffer), and ``alloc_len_per_decode`` is ``num_draft_tokens`` for
    NGRAM-shaped algorithms and ``max(steps * topk, num_draft_tokens)`` for EAGLE.
    Only page size > 1 gets the wider row (host PR 26972). With page size 1 and
    ``num_draft_tokens > 5``, a request decoding near the context limit reserves
    past the end of its row: the slot write (``assign_req_to_token_pool``) lands in
    the next request's row (GPU kernel and CPU fallback alike) or past the table.
    The overwritten slot ids are never freed: the host's idle memory check reports
    ``pool memory leak detected!`` and the server exits, or, for the last row, the
    scheduler dies on an index error. Width 4 happens to fit (``2 * 4 <= 4 + 4``).
    Fix: rows hold ``context_len + max(4 + num_draft_tokens, reserve + page_size -
    1)``, which is what the host already does for page size > 1; the cost is a few
    int32 entries per request slot. Upstream fix: apply that ``max`` for every
    speculative algorithm and page size in ``get_req_to_token_extra_context_len``
    (and assert the row width for page size 1 in ``eagle_prepare_for_decode`` as it
    does for page size > 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("sglang_spec_ext")


@dataclass(frozen=True)
class HostFix:
    """One run-time fix of a host function."""

    name: str
    target: str  # dotted path of the host function
    hook_type: str  # a HookType member name: AFTER, AROUND, ...
    hook: Callable[..., Any]
    why: str


def _row_headroom_after(result: int, *args: Any, **kwargs: Any) -> int:
    """AFTER hook of ``get_req_to_token_extra_context_len``: at least the decode reserve."""
    from sglang.srt.mem_cache.allocation_sizing import (
        get_alloc_page_size,
        get_alloc_reserve_per_decode,
    )
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_algorithm is None:
        return result
    return max(int(result), get_alloc_reserve_per_decode() + get_alloc_page_size() - 1)


HOST_FIXES: tuple[HostFix, ...] = (
    HostFix(
        name="req_to_token_row_headroom",
        target="sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
        hook_type="AFTER",
        hook=_row_headroom_after,
        why=(
            "speculative decode reserves 2 x draft width past the committed length; the "
            "host's request-to-token rows hold only 4 + draft width beyond the context "
            "(page size 1), so requests near the context limit write past their row and "
            "leak KV slots"
        ),
    ),
)


def _resolve(target: str) -> Callable[..., Any]:
    """The host function a fix hooks; ``RuntimeError`` naming the fix if it moved."""
    import importlib

    module_name, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            f"sglang-spec-ext host fix target {target} not found in this sglang ({e}); "
            "the plugin supports sglang 0.5.23 only"
        ) from e


def _registered(registry: Any, fix: HostFix) -> bool:
    return any(hook is fix.hook for _, hook, _ in registry._hooks.get(fix.target, ()))


def install_host_fixes() -> list[str]:
    """Register every :data:`HOST_FIXES` entry once; return the names newly installed."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    installed = []
    for fix in HOST_FIXES:
        if _registered(HookRegistry, fix):
            continue
        _resolve(fix.target)  # a host that moved the target fails here, by name
        HookRegistry.register(fix.target, fix.hook, HookType[fix.hook_type])
        installed.append(fix.name)
    if installed:
        HookRegistry.apply_hooks()
        logger.debug("sglang-spec-ext host fixes installed: %s", installed)
    return installed
