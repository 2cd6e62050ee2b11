"""Refuse, with a clear error, request options our algorithms would serve wrong.

SGLang applies its penalizers (frequency, presence and repetition penalties,
``min_new_tokens``) once per verify step during speculative decoding: the penalty
computed from the tokens committed before the step is repeated over every drafted
position (``sampling/penaltylib/orchestrator.py``, ``repeat``). A drafted token that
would have changed the penalty for the positions after it (a repeated token, the
``min_new_tokens``-th token allowing the stop token) is not accounted for, so the
output is not what the target produces without speculation. Measured on the CPU
server with the tiny test model and SUFFIX: repetition penalty 1.3 gave identical
greedy output on 1 prompt of 4, frequency or presence penalty 0.8 on 0 of 4.

The same hook refuses a bad per-request speculation setting
(``custom_params["spec_ext"]``, ``request_options.py``) with a 400 naming the field, on
a server of a prefill-decode pair too (the prefill server runs no speculation, but a
request the SUFFIX decode server alone refused would hold the prefill server's KV until
the host's bootstrap timeout).

Our algorithms promise the target's output, so a request with such an option is
refused at admission (a 400 answer naming the option) instead of served wrong. The
check is a ``BEFORE`` hook on the host's ``SamplingParams.verify`` (which the
tokenizer manager calls for every request and turns a ``ValueError`` into a 400),
active only when the server runs one of this package's algorithms; the host's own
algorithms (NGRAM, EAGLE, ...) keep the host's behaviour (see docs/operations.md, serving under load).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_spec_ext.sglang.serving.request_options import request_option_problems

logger = logging.getLogger("sglang_spec_ext")

TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"

#: Option -> its neutral value (any other value is refused).
PENALIZER_OPTIONS: dict[str, float] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}


def unsupported_options(params: Any) -> list[str]:
    """``name=value`` for each penalizer option of ``params`` set to a non-neutral value."""
    out = []
    for name, neutral in PENALIZER_OPTIONS.items():
        value = getattr(params, name, None)
        if value is not None and value != neutral:
            out.append(f"{name}={value}")
    return out


def _our_algorithm() -> str | None:
    from sglang.srt.runtime_context import get_spec

    from sglang_spec_ext import ALGORITHMS

    try:
        name = get_spec().speculative_algorithm
    except Exception:  # no published config in this process: nothing to guard
        return None
    return name if name in ALGORITHMS else None


def _pd_role() -> str | None:
    """``prefill`` / ``decode`` on a server of a prefill-decode pair, else None."""
    from sglang.srt.runtime_context import get_disagg

    try:
        mode = get_disagg().disaggregation_mode
    except Exception:  # no published config in this process
        return None
    return mode if mode in ("prefill", "decode") else None


def verify_guard(params: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook of ``SamplingParams.verify``: raise ``ValueError`` for unsupported
    options and for bad per-request speculation settings (``request_options.py``)."""
    bad = unsupported_options(params)
    settings = request_option_problems(getattr(params, "custom_params", None))
    if not bad and not settings:
        return None
    algorithm = _our_algorithm()
    if algorithm is None:
        role = _pd_role()
        if settings and role is not None:
            # Both servers of a PD pair get each request: refused by the SUFFIX decode
            # server alone, it would hold the prefill server's KV until the host's
            # bootstrap timeout (and a router waiting for both answers, its client).
            raise ValueError(f"{role} server of a prefill-decode pair: " + "; ".join(settings))
        return None
    if settings:
        raise ValueError(f"--speculative-algorithm {algorithm}: " + "; ".join(settings))
    raise ValueError(
        f"{', '.join(bad)} is not supported with --speculative-algorithm {algorithm}: "
        "SGLang applies penalties once per speculative verify step, so the output would "
        "differ from the model's. Send the request without it, or use a server without "
        "speculative decoding."
    )


def install_request_guard() -> bool:
    """Register the guard once; True if newly registered."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    return register_hooks_once([(TARGET, verify_guard, HookType.BEFORE)])
