"""A fake SGLang HTTP server on loopback for the bench tests (and its own checks).

Serves ``/health``, ``/v1/models``, ``/get_model_info``, native ``/generate`` (token
ids in, deterministic output ids out, streamed in chunks of ``chunk`` tokens like a
speculative server, with the host's ``meta_info`` fields) and ``/v1/completions``.
``alter_at=P`` changes output token ``P`` (a parity failure to detect);
``upstream=URL`` forwards non-streamed ``/generate`` to a real server instead.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import requests
from aiohttp import web

from sglang_spec_ext.bench.servers import free_port


def fake_output(input_ids: list[int], n: int) -> list[int]:
    return [(sum(input_ids) + 7 * i) % 97 for i in range(n)]


class FakeServer:
    def __init__(
        self,
        chunk: int = 1,
        delay_s: float = 0.0,
        alter_at: int | None = None,
        upstream: str | None = None,
        accept: bool = True,
        port: int | None = None,
        hold_after: int | None = None,
    ) -> None:
        """``hold_after``: answer that many ``/generate`` requests, then hold every later
        one until the server stops (a client run that cannot finish by itself)."""
        self.chunk, self.delay_s, self.alter_at = chunk, delay_s, alter_at
        self.hold_after = hold_after
        self.upstream, self.accept = upstream, accept
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()

    # -- lifecycle ---------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._released = asyncio.Event()
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> FakeServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        async def _cleanup() -> None:
            await self._runner.cleanup()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._released.set)
            asyncio.run_coroutine_threadsafe(_cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- handlers ----------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "/nonexistent/fake-model"})

    def _meta(self, ids: list[int], done: int, prompt: int, steps: int) -> dict:
        meta = {"prompt_tokens": prompt, "completion_tokens": done}
        if self.accept and steps:
            meta.update(spec_accept_length=done / steps, spec_verify_ct=steps)
        return meta

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.hold_after is not None and len(self.requests) > self.hold_after:
            await self._released.wait()
        if self.upstream:
            return await self._forward(body)
        ids = body.get("input_ids") or [len(body.get("text", ""))]
        n = body["sampling_params"]["max_new_tokens"]
        out = fake_output(ids, n)
        if self.alter_at is not None and self.alter_at < n:
            out[self.alter_at] += 1
        if not body.get("stream"):
            await asyncio.sleep(self.delay_s)
            steps = -(-n // self.chunk)
            return web.json_response(
                {"output_ids": out, "meta_info": self._meta(out, n, len(ids), steps)}
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        done, steps = 0, 0
        while done < n:
            await asyncio.sleep(self.delay_s)
            done = min(n, done + (1 if done == 0 else self.chunk))
            steps += 1
            obj = {"output_ids": out[:done], "meta_info": self._meta(out, done, len(ids), steps)}
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _forward(self, body: dict) -> web.Response:
        async with aiohttp.ClientSession() as s:
            async with s.post(self.upstream + "/generate", json={**body, "stream": False}) as r:
                obj = await r.json()
        if self.alter_at is not None and len(obj.get("output_ids", [])) > self.alter_at:
            obj["output_ids"][self.alter_at] += 1
        return web.json_response(obj)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        n, prompt = body["max_tokens"], body["prompt"]
        plen = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        usage = {"prompt_tokens": plen, "completion_tokens": n}
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x " * n}], "usage": usage})
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(n):
            await asyncio.sleep(self.delay_s)
            await resp.write(f"data: {json.dumps({'choices': [{'text': 'x '}]})}\n\n".encode())
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


def test_fake_server_answers() -> None:
    with FakeServer(chunk=3) as srv:
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}}
        r = requests.post(srv.url + "/generate", json=body, timeout=5).json()
        assert r["output_ids"] == fake_output([1, 2, 3], 5)
        assert r["meta_info"]["spec_verify_ct"] == 2


def test_fake_server_streams_chunks() -> None:
    with FakeServer(chunk=2) as srv:
        body = {"input_ids": [4], "sampling_params": {"max_new_tokens": 5}, "stream": True}
        t0 = time.perf_counter()
        r = requests.post(srv.url + "/generate", json=body, timeout=5, stream=True)
        lines = [ln for ln in r.iter_lines() if ln.startswith(b"data: {")]
        counts = [json.loads(ln[6:])["meta_info"]["completion_tokens"] for ln in lines]
        assert counts == [1, 3, 5] and time.perf_counter() - t0 < 5
