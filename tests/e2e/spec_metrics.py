"""Reading the host's own speculative metrics from a response's ``meta_info``."""

from __future__ import annotations


def accept_length(meta_info: dict) -> float:
    """Mean tokens committed per verify step, bonus included, as the host reports it
    (``completion_tokens / spec_verify_ct``). Fails loudly when the host sent none."""
    assert "spec_accept_length" in meta_info and meta_info.get("spec_verify_ct", 0) > 0, (
        f"no speculative metrics in meta_info: {sorted(meta_info)}"
    )
    return float(meta_info["spec_accept_length"])
