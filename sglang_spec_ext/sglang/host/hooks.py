"""The hook mechanism: our patches registered with the host's ``HookRegistry``.

Every installer (``sglang/serving``, ``sglang/workers``, ``sglang/model_drafts``,
``sglang/verify``, ``sglang/cpu``) hands its ``(target, hook, HookType)`` triples to
:func:`register_hooks_once`; which installers run is decided by the composition root,
:func:`sglang_spec_ext.plugin.install_runtime_hooks`. This module imports none of them.

Each target is resolved here before the host sees it, so the host's ``apply_hooks`` never
logs a traceback for one of ours:

* its module imports and has the attribute: registered and applied, as before;
* its module cannot be imported in this process (a tool such as ``doctor`` that loads the
  plugin outside a server, where the host's scheduler needs packages only a server process
  has): the hook waits, and is applied the moment that module is imported (a
  ``sys.meta_path`` finder that only wraps the real loader of the pending modules);
* the module imports but the attribute is gone (a host that moved what we hook): one
  warning line naming the target and the feature it turns off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Any

logger = logging.getLogger("sglang_spec_ext")

Hook = tuple[str, Any, Any]

_lock = threading.RLock()
# module name -> hooks waiting for it to be imported
_pending: dict[str, list[tuple[Hook, str]]] = {}
# modules that failed to import in this process (tried once; the finder retries on import)
_unimportable: dict[str, str] = {}


def register_hooks_once(hooks: list[Hook], feature: str | None = None) -> bool:
    """Register ``(target, hook, HookType)`` with SGLang's ``HookRegistry`` unless that
    hook is already on that target, and apply them (idempotent across calls); True if
    any was newly registered or is waiting for its module's import.

    ``feature`` names what the hooks serve in the one-line warning a missing target
    gets (default: the hook's module).

    The host's ``apply_hooks`` patches a target once: a hook registered for a target an
    earlier ``apply_hooks`` already patched would be recorded and never applied (our
    metrics hook ``EAGLEWorkerV2.verify`` before the plain-step hook on it, for one). Such
    a hook is wrapped around the target's current (already hooked) attribute here, with
    the host's own wrapper for its hook type."""
    ready: list[Hook] = []
    waiting = False
    with _lock:
        for hook_spec in hooks:
            target, hook, _hook_type = hook_spec
            if _known(target, hook):
                continue
            label = feature or _feature_of(hook)
            state, detail = resolve_target(target)
            if state == "ok":
                ready.append(hook_spec)
            elif state == "unimportable":
                _defer(detail, hook_spec, label)
                waiting = True
            else:
                _warn_missing(target, detail, label)
    return _register(ready) or waiting


def register_hooks_on_import(module: str, hooks: list[Hook], feature: str | None = None) -> bool:
    """:func:`register_hooks_once` for hooks on ``module``, without importing it: applied
    now if ``module`` is already imported, else the moment something imports it. For
    modules a server imports only in some deployments, whose import has side effects a
    plain server must not get (Mooncake's PD transfer code, imported at plugin load,
    turned the host's multi-process metrics off); True if any was registered or waits."""
    if module in sys.modules:
        return register_hooks_once(hooks, feature)
    waiting = False
    with _lock:
        for hook_spec in hooks:
            if not _known(hook_spec[0], hook_spec[1]):
                _defer(module, hook_spec, feature or _feature_of(hook_spec[1]))
                waiting = True
    return waiting


def pending_targets() -> dict[str, list[str]]:
    """Module -> targets whose hooks wait for that module's import (for tests, doctor)."""
    with _lock:
        return {m: [h[0][0] for h in hs] for m, hs in _pending.items()}


def unimportable_reason(module: str) -> str:
    """Why ``module`` failed to import in this process ("" if it did not fail)."""
    return _unimportable.get(module, "")


def resolve_target(target: str) -> tuple[str, str]:
    """Import the module part of a dotted ``target`` and walk its attributes.

    Returns ``("ok", "")``, ``("unimportable", module)`` when a module on the path
    exists but cannot be imported in this process, or ``("missing", why)``."""
    parts = target.split(".")
    obj: Any = None
    i = 1
    # the longest importable module prefix (as pkgutil.resolve_name, but an import that
    # fails inside an existing module is reported, not taken for "no such module")
    while i < len(parts):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            if name in _unimportable:
                return "unimportable", name
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, AttributeError, ValueError):
                spec = None
            if spec is None:
                break
            try:
                importlib.import_module(name)
            except Exception as e:
                _unimportable[name] = f"{type(e).__name__}: {e}"
                return "unimportable", name
        obj = sys.modules[name]
        i += 1
    if obj is None:
        return "missing", f"no module {parts[0]!r}"
    for attr in parts[i - 1 :]:
        if not hasattr(obj, attr):
            where = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
            return "missing", f"{where} has no attribute {attr!r}"
        obj = getattr(obj, attr)
    return "ok", ""


def _known(target: str, hook: Any) -> bool:
    from sglang.srt.plugins.hook_registry import HookRegistry

    if any(h is hook for _t, h, _s in HookRegistry._hooks.get(target, ())):
        return True
    return any(h[0][0] == target and h[0][1] is hook for hs in _pending.values() for h in hs)


def _feature_of(hook: Any) -> str:
    module = getattr(hook, "__module__", None) or "sglang_spec_ext"
    return module.removeprefix("sglang_spec_ext.sglang.").removeprefix("sglang_spec_ext.")


def _warn_missing(target: str, why: str, feature: str) -> None:
    logger.warning(
        "sglang-spec-ext: cannot hook %s (%s; a host other than the supported one?): %s is off",
        target,
        why,
        feature,
    )


def _register(hooks: list[Hook]) -> bool:
    from sglang.srt.plugins.hook_registry import HookRegistry

    new, late = False, []
    for target, hook, hook_type in hooks:
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


def _defer(module: str, hook_spec: Hook, feature: str) -> None:
    if not _pending:
        _install_finder()
    _pending.setdefault(module, []).append((hook_spec, feature))
    logger.debug(
        "sglang-spec-ext: %s waits for %s (%s)",
        hook_spec[0],
        module,
        _unimportable.get(module, "not imported yet"),
    )


def _apply_pending(module: str) -> None:
    with _lock:
        waiting = _pending.pop(module, [])
        _unimportable.pop(module, None)
    for hook_spec, feature in waiting:
        register_hooks_once([hook_spec], feature)


class _ApplyOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with waiting hooks it takes the spec the other
    finders give and applies the hooks right after the module's code has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_hook(module: Any) -> None:
            exec_module(module)
            _apply_pending(fullname)

        loader.exec_module = exec_then_hook
        return spec


_finder = _ApplyOnImport()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
