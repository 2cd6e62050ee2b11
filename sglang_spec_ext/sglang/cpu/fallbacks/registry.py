"""Host attributes our fallbacks replace, registered once with the host's ``HookRegistry``."""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_spec_ext")


def resolve_target(target: str) -> tuple[Any, str]:
    """(owner object, attribute name) of a dotted host path; imports as needed."""
    owner, attr = target.rsplit(".", 1)
    return pkgutil.resolve_name(owner), attr


def _already_registered(registry: type, target: str, impl: Callable[..., None]) -> bool:
    hooks = getattr(registry, "_hooks", {}).get(target, ())
    return any(hook is impl for _type, hook, _src in hooks)


def register_patch(
    registry: Any, hook_type: Any, target: str, impl: Callable[..., Any]
) -> bool | None:
    """Register ``impl`` on ``target``: True if newly registered, False if it already
    was, None if the host does not bind ``target`` (nothing to patch)."""
    try:
        owner, attr = resolve_target(target)
    except (ImportError, AttributeError) as e:
        logger.warning("sglang-spec-ext: cannot patch %s: %s", target, e)
        return None
    # HookRegistry rebinds every module attribute that `is` the original: never
    # let that original be None (or anything else shared), only a real binding.
    if getattr(owner, attr, None) is None:
        logger.debug("%s is not bound by the host; nothing to replace", target)
        return None
    if _already_registered(registry, target, impl):
        return False
    registry.register(target, impl, hook_type)
    return True
