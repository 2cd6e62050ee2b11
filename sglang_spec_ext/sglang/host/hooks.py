"""The hook mechanism: our patches registered with the host's ``HookRegistry``.

Every installer (``sglang/serving``, ``sglang/workers``, ``sglang/model_drafts``,
``sglang/verify``, ``sglang/cpu``) hands its ``(target, hook, HookType)`` triples to
:func:`register_hooks_once`; which installers run is decided by the composition root,
:func:`sglang_spec_ext.plugin.install_runtime_hooks`. This module imports none of them.
"""

from __future__ import annotations

from typing import Any


def register_hooks_once(hooks: list[tuple[str, Any, Any]]) -> bool:
    """Register ``(target, hook, HookType)`` with SGLang's ``HookRegistry`` unless that
    hook is already on that target, and apply them (idempotent across calls); True if
    any was newly registered.

    The host's ``apply_hooks`` patches a target once: a hook registered for a target an
    earlier ``apply_hooks`` already patched would be recorded and never applied (our
    metrics hook ``EAGLEWorkerV2.verify`` before the plain-step hook on it, for one). Such
    a hook is wrapped around the target's current (already hooked) attribute here, with
    the host's own wrapper for its hook type."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    new, late = False, []
    for target, hook, hook_type in hooks:
        if not any(h is hook for _t, h, _s in HookRegistry._hooks.get(target, ())):
            if target in HookRegistry._patched:
                late.append((target, hook, hook_type))
            HookRegistry.register(target, hook, hook_type)
            new = True
    if new:
        HookRegistry.apply_hooks()
    for target, hook, hook_type in late:
        _wrap_patched_target(target, hook, hook_type)
    return new


def _wrap_patched_target(target: str, hook: Any, hook_type: Any) -> None:
    """Wrap ``hook`` around the current attribute of an already patched ``target``."""
    import pkgutil

    from sglang.srt.plugins import hook_registry

    obj_path, attr = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(obj_path)
    current = getattr(obj, attr)
    if isinstance(obj, type) and isinstance(obj.__dict__.get(attr), classmethod | staticmethod):
        raise TypeError(f"{target}: late hooks on class or static methods are not supported")
    setattr(obj, attr, hook_registry._wrap_fn(current, hook, hook_type))
