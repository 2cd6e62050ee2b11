"""HTTP to a server started with ``--skip-tokenizer-init``: token ids in, token ids out.

``generate_many`` sends a batch of greedy requests at once (the server batches them);
``step_times`` streams a batch and reads the decode speed off the tokens that arrive
while every request of the batch is decoding."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

#: Seconds a request may wait for the server's next bytes (``gpu/run`` sets it from
#: ``request_timeout_s``): a server that stays up but never answers costs this much per
#: request, not the stage.
TIMEOUT_S = 300.0


def generate(
    url: str, input_ids: Sequence[int], max_new_tokens: int, timeout_s: float | None = None,
    **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """One greedy ``/generate`` (``ignore_eos``: exactly ``max_new_tokens`` tokens)."""
    payload = {
        "input_ids": list(input_ids),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                            "ignore_eos": True},
        **extra,
    }  # fmt: skip
    r = requests.post(url + "/generate", json=payload, timeout=timeout_s or TIMEOUT_S)
    r.raise_for_status()
    return r.json()


def generate_many(
    url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, **extra: Any
) -> list[dict[str, Any]]:
    """The prompts sent together, one thread each; responses in prompt order."""
    return _all(lambda p: generate(url, p, max_new_tokens, **extra), prompts)


def _all(fn: Any, items: Sequence[Any]) -> list[Any]:
    """``fn`` over ``items`` in threads, results in order. On an exception (the time
    guard's too) the caller goes on at once: the threads are left to end when their
    server is stopped, instead of holding the caller until their HTTP timeouts."""
    ex = ThreadPoolExecutor(max(1, len(items)))
    try:
        return [f.result() for f in [ex.submit(fn, item) for item in items]]
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def _stream(url: str, input_ids: Sequence[int], max_new_tokens: int, t0: float) -> dict[str, Any]:
    payload = {
        "input_ids": list(input_ids),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                            "ignore_eos": True},
        "stream": True,
    }  # fmt: skip
    times, tokens, last_len = [], [], 0
    with requests.post(url + "/generate", json=payload, stream=True, timeout=TIMEOUT_S) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line or not line.startswith(b"data:"):
                continue
            body = line[5:].strip()
            if body == b"[DONE]":
                break
            chunk = json.loads(body)
            ids = chunk.get("output_ids") or []
            # cumulative or incremental output ids, depending on the host's settings
            n = len(ids) - last_len if len(ids) > last_len else len(ids)
            last_len = max(last_len, len(ids))
            times.append(time.perf_counter() - t0)
            tokens.append(n)
    return {"times": times, "tokens": tokens}


def step_times(url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
    """Decode speed of a batch of ``len(prompts)`` streamed requests.

    The steady window runs from the moment the last request got its first chunk (all are
    decoding) to the moment the first one finished. Per stream, the tokens of its chunks
    after its first chunk in the window over the time between its first and last chunk
    in it give its tokens per second; the host may pack several decode steps into one
    chunk when the client falls behind, so tokens, not chunks, are counted. Returns the
    median over streams as ``ms_per_token`` (the decode step time where every step
    commits one token per request: plain decoding, ``SGLANG_SIMULATE_ACC_LEN=1``) and
    ``tok_s`` for the whole batch, with the spread and the tokens per chunk seen."""
    t0 = time.perf_counter()
    streams = _all(lambda p: _stream(url, p, max_new_tokens, t0), prompts)
    if any(len(s["times"]) < 3 for s in streams):
        raise RuntimeError(f"streams too short: {[len(s['times']) for s in streams]}")
    start = max(s["times"][0] for s in streams)
    end = min(s["times"][-1] for s in streams)
    rates, counted, per_chunk = [], 0, []
    for s in streams:
        inside = [(t, n) for t, n in zip(s["times"], s["tokens"], strict=True) if start <= t <= end]
        if len(inside) < 3 or inside[-1][0] <= inside[0][0]:
            continue
        tokens = sum(n for _, n in inside[1:])
        rates.append(tokens / (inside[-1][0] - inside[0][0]))
        counted += tokens
        per_chunk += [n for _, n in inside]
    if not rates:
        raise RuntimeError("no steady window: every request finished before the last started")
    rate = statistics.median(rates)
    return {
        "ms_per_token": round(1000 / rate, 3),
        "ms_per_token_min": round(1000 / max(rates), 3),
        "ms_per_token_max": round(1000 / min(rates), 3),
        "tok_s": round(rate * len(prompts), 1),
        "tokens_counted": counted,
        "streams_counted": len(rates),
        "tokens_per_chunk": round(statistics.mean(per_chunk), 3),
        "wall_s": round(time.perf_counter() - t0, 2),
        "batch": len(prompts),
    }


def throughput(url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
    """Output tokens per second of a batch sent together (prefill included), with the
    host's speculative figures from ``meta_info``."""
    t0 = time.perf_counter()
    outs = generate_many(url, prompts, max_new_tokens)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.get("output_ids") or []) for o in outs)
    return {
        "batch": len(prompts),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 1),
        **spec_figures(outs),
    }


def spec_figures(outs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accept length over a set of responses (tokens / verify steps), where reported."""
    steps = sum(int((o.get("meta_info") or {}).get("spec_verify_ct") or 0) for o in outs)
    tokens = sum(int((o.get("meta_info") or {}).get("completion_tokens") or 0) for o in outs)
    widths: dict[str, int] = {}
    for o in outs:
        ext = (o.get("meta_info") or {}).get("spec_ext") or {}
        for w, n in (ext.get("verify_widths") or {}).items():
            widths[w] = widths.get(w, 0) + int(n)
    return {
        "verify_steps": steps,
        "accept_length": round(tokens / steps, 3) if steps else None,
        "verify_widths": widths or None,
    }
