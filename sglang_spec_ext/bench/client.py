"""Async HTTP client: one request (native ``/generate`` or OpenAI ``/v1/completions``,
streamed or not) and one cell of requests under a :class:`Load`.

The native API takes token ids and ``ignore_eos`` so input and output lengths are
exact, and returns the host's speculative metrics in ``meta_info``. The OpenAI API
(``--api openai``) works with any compatible server but reports no accept length and
no per-chunk token counts (tokens are spread evenly over the streamed chunks).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from sglang_spec_ext.bench.metrics import RequestResult
from sglang_spec_ext.bench.workload import Load, Request, poisson_arrivals

APIS = ("native", "openai")


def _payload(req: Request, api: str, stream: bool, temperature: float, model: str | None):
    prompt: Any = list(req.prompt_ids) if req.prompt_ids is not None else req.prompt_text
    if api == "native":
        body: dict[str, Any] = {
            "sampling_params": {
                "max_new_tokens": req.output_len,
                "temperature": temperature,
                # a constrained request ends with its grammar (its stop token is forced)
                "ignore_eos": not req.constraint,
                **dict(req.constraint),
            },
            "stream": stream,
        }
        body["input_ids" if req.prompt_ids is not None else "text"] = prompt
        return "/generate", body
    if req.constraint:
        raise ValueError("structured prompts need the native API (--api native)")
    body = {
        "model": model or "default",
        "prompt": prompt,
        "max_tokens": req.output_len,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return "/v1/completions", body


def _spread(total: int, parts: int) -> list[int]:
    base, extra = divmod(max(total, 0), max(parts, 1))
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _apply_native(res: RequestResult, obj: dict[str, Any], now: float, ids: list[int]) -> None:
    """Fold one native response (a streamed chunk or the whole answer) into ``res``."""
    meta = obj.get("meta_info") or {}
    chunk_ids = obj.get("output_ids")
    done = meta.get("completion_tokens")
    if done is None:
        done = len(chunk_ids or [])
    new = int(done) - res.output_len
    if isinstance(chunk_ids, list):
        # cumulative ids (the host's default) or deltas (incremental streaming)
        if len(chunk_ids) == int(done):
            ids[:] = chunk_ids
        else:
            ids.extend(chunk_ids)
    if new > 0:
        res.chunk_times.append(now)
        res.chunk_tokens.append(new)
        res.output_len = int(done)
    if "prompt_tokens" in meta:
        res.input_len = int(meta["prompt_tokens"])
    if meta.get("spec_accept_length") is not None:
        res.accept_length = float(meta["spec_accept_length"])
    if meta.get("spec_verify_ct") is not None:
        res.verify_ct = int(meta["spec_verify_ct"])


def _apply_openai(res: RequestResult, obj: dict[str, Any], now: float) -> None:
    choices = obj.get("choices") or []
    if choices and (choices[0].get("text") or ""):
        res.chunk_times.append(now)
        res.chunk_tokens.append(1)
    usage = obj.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        res.output_len = int(usage["completion_tokens"])
        res.input_len = int(usage.get("prompt_tokens") or res.input_len)


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    req: Request,
    *,
    api: str = "native",
    stream: bool = True,
    temperature: float = 0.0,
    model: str | None = None,
) -> RequestResult:
    """Send one request and time it; failures come back as ``ok=False`` results."""
    path, body = _payload(req, api, stream, temperature, model)
    res = RequestResult(ok=False, input_len=req.input_len or 0)
    ids: list[int] = []
    res.start = time.perf_counter()
    try:
        async with session.post(base_url.rstrip("/") + path, json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            if not stream:
                obj = await resp.json(content_type=None)
                now = time.perf_counter()
                if api == "native":
                    _apply_native(res, obj, now, ids)
                else:
                    _apply_openai(res, obj, now)
            else:
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        res.error = str(obj["error"])[:300]
                        return res
                    now = time.perf_counter()
                    if api == "native":
                        _apply_native(res, obj, now, ids)
                    else:
                        _apply_openai(res, obj, now)
        res.end = time.perf_counter()
        if not stream:  # no chunk timing without streaming (no TTFT, ITL, TPOT)
            res.chunk_times, res.chunk_tokens = [], []
        elif api == "openai" and res.chunk_times:
            res.chunk_tokens = _spread(res.output_len, len(res.chunk_times))
        res.output_ids = ids if api == "native" else None
        res.ok = True
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        res.end = time.perf_counter()
    return res


def _session(timeout_s: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s),
    )


async def run_cell(
    base_url: str,
    requests: Sequence[Request],
    load: Load,
    *,
    api: str = "native",
    stream: bool = True,
    temperature: float = 0.0,
    model: str | None = None,
    seed: int = 0,
    timeout_s: float = 3600.0,
    on_done: Callable[[RequestResult], None] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` under ``load``; returns the results (in request order) and
    the time the cell started sending."""
    results: list[RequestResult | None] = [None] * len(requests)
    kw = {"api": api, "stream": stream, "temperature": temperature, "model": model}
    async with _session(timeout_s) as session:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            r = await send(session, base_url, requests[i], **kw)
            results[i] = r
            if on_done is not None:
                on_done(r)

        if load.kind == "rate":
            offsets = poisson_arrivals(len(requests), load.value, seed)

            async def timed(i: int) -> None:
                delay = t0 + offsets[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await one(i)

            await asyncio.gather(*(timed(i) for i in range(len(requests))))
        else:
            queue = list(range(len(requests)))[::-1]

            async def worker() -> None:
                while queue:
                    await one(queue.pop())

            await asyncio.gather(*(worker() for _ in range(int(load.value))))
    return [r for r in results if r is not None], t0


async def run_sequential(
    base_url: str, requests: Sequence[Request], *, timeout_s: float = 3600.0
) -> list[RequestResult]:
    """Greedy, non-streamed, one at a time (native API; for parity checks)."""
    async with _session(timeout_s) as session:
        return [
            await send(session, base_url, r, api="native", stream=False, temperature=0.0)
            for r in requests
        ]


async def fetch_model_id(base_url: str, timeout_s: float = 30.0) -> str | None:
    """The served model name (``/v1/models``), or ``None``."""
    try:
        async with _session(timeout_s) as session:
            async with session.get(base_url.rstrip("/") + "/v1/models") as resp:
                data = await resp.json(content_type=None)
                return str(data["data"][0]["id"])
    except Exception:
        return None


async def fetch_model_path(base_url: str, timeout_s: float = 30.0) -> str | None:
    """The server's ``model_path`` (``/get_model_info``), or ``None``."""
    try:
        async with _session(timeout_s) as session:
            async with session.get(base_url.rstrip("/") + "/get_model_info") as resp:
                return str((await resp.json(content_type=None))["model_path"])
    except Exception:
        return None


async def fetch_server_fields(
    base_url: str, fields: tuple[str, ...], timeout_s: float = 30.0
) -> dict[str, Any] | None:
    """The named resolved server arguments (``/server_info``), or ``None``."""
    try:
        async with _session(timeout_s) as session:
            async with session.get(base_url.rstrip("/") + "/server_info") as resp:
                info = await resp.json(content_type=None)
        return {f: info.get(f) for f in fields}
    except Exception:
        return None
