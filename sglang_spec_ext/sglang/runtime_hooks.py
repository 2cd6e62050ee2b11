"""Runtime patches the plugin applies to the host in every process.

Called by :func:`sglang_spec_ext.plugin.register` (so in every process SGLang's
``load_plugins()`` runs in). Today: the pure-torch CPU kernel fallbacks, switched by
``SGLANG_SPEC_EXT_CPU_FALLBACKS`` (default on). Each hook decides for itself whether
the host needs it; on GPU hosts nothing is installed.
"""

from __future__ import annotations

import logging

from sglang_spec_ext.config import load_config

logger = logging.getLogger("sglang_spec_ext")


def install_runtime_hooks() -> list[str]:
    """Install the runtime hooks the configuration asks for; return what was installed."""
    config = load_config()
    installed: list[str] = []
    if config.cpu_fallbacks:
        from sglang_spec_ext.sglang.cpu_fallbacks.install import install_cpu_fallbacks

        installed += install_cpu_fallbacks()
        installed += _install_cpu_draft_attention()
    else:
        logger.debug("CPU kernel fallbacks disabled by configuration")
    return installed


def _install_cpu_draft_attention() -> list[str]:
    """torch_native draft attention for model drafts on the CPU engine (sglang/draft_attention.py)."""
    from sglang_spec_ext.sglang.draft_attention import install_draft_attention

    return install_draft_attention()
