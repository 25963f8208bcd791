"""The endpoints: /v1/completions, /v1/chat/completions (streamed as server-sent events or whole),
/v1/models, /health, /metrics. A handler validates its body, turns it into prompt ids and sampling
settings, queues a ``Ticket`` on the engine thread (429 at once when the server holds its limit, 503
while draining) and relays its events; a client that goes away aborts its request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tessera.engine.config import SamplingParams
from tessera.engine.engine import Engine
from tessera.errors import UserError
from tessera.serve.config import ServerConfig
from tessera.serve.loop import EngineThread, Event, Ticket
from tessera.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    Sampling,
    TextStream,
    chat_choice,
    completion_choice,
    envelope,
    error_body,
    new_id,
    usage,
    validation_error,
)

DISCONNECT_CHECK_S = 0.5  # a whole (non-streamed) answer checks this often whether its client is still there


@dataclass(frozen=True)
class Relay:
    """One request on its way: what the handler relays and how."""

    ticket: Ticket
    chat: bool
    stream: bool
    include_usage: bool
    token_ids: bool


class Server:
    def __init__(self, engine: Engine, engine_thread: EngineThread, config: ServerConfig,
                 draining: Callable[[], bool] = lambda: False) -> None:
        self.engine, self.thread, self.config, self.draining = engine, engine_thread, config, draining
        self.codec = engine.codec
        self.model_len = engine.config.model_len(engine.source.arch)
        self.vocab = engine.source.arch.vocab_size
        self.metrics = engine_thread.metrics

    # ---- turning a body into a request ---------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.config.served_model_name:
            raise ApiError(404, f"model {name!r} is not served here; valid: {self.config.served_model_name}",
                           "model")

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.codec.encode(prompt)
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} outside the vocabulary 0..{self.vocab - 1}",
                           "prompt")
        return list(prompt)

    def chat_ids(self, body: ChatRequest) -> list[int]:
        tok = getattr(self.codec, "tok", None)
        if tok is None or not getattr(tok, "chat_template", None):
            raise ApiError(400, f"messages: model {self.config.served_model_name!r} has no chat template; "
                           f"use /v1/completions", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=body.add_generation_prompt)
        except Exception as e:  # the template's own error (jinja raise_exception): the client's to fix
            raise ApiError(400, f"messages: the chat template refused them: {e}", "messages") from None
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def sampling(self, body: Sampling, ids: list[int], max_tokens: int | None) -> SamplingParams:
        unsupported(body)
        n = len(ids)
        if max_tokens is None:
            max_tokens = (self.model_len or n + 16) - n
            if max_tokens < 1:
                raise ApiError(400, f"prompt: {n} tokens leave no room in the model's {self.model_len}-token "
                               f"context", "prompt")
        if self.model_len is not None and n + max_tokens > self.model_len:
            raise ApiError(400, f"max_tokens: prompt of {n} tokens + max_tokens {max_tokens} = "
                           f"{n + max_tokens} exceeds the model's {self.model_len}-token context "
                           f"(--max-model-len)", "max_tokens")
        try:
            return SamplingParams(max_tokens=max_tokens, temperature=body.temperature,
                                  top_k=max(0, body.top_k), top_p=body.top_p, seed=body.seed,
                                  stop=body.stops(), ignore_eos=body.ignore_eos)
        except UserError as e:
            raise ApiError(400, str(e)) from None

    # ---- queueing and relaying ---------------------------------------------------------------

    async def run(self, http: HttpRequest, body: Sampling, ids: list[int], params: SamplingParams,
                  chat: bool) -> Response:
        if self.draining():
            self.metrics.rejected.labels("draining").inc()
            raise ApiError(503, "the server is shutting down; send the request to another replica")
        ticket = Ticket(key=new_id("chatcmpl" if chat else "cmpl"), prompt_ids=tuple(ids), params=params,
                        events=asyncio.Queue(), loop=asyncio.get_running_loop())
        if not self.thread.submit(ticket):
            if self.thread.error is not None:
                raise ApiError(503, f"the engine stopped: {self.thread.error}")
            self.metrics.rejected.labels("full").inc()
            raise ApiError(429, f"the server holds its limit of {self.thread.max_outstanding} requests "
                           f"(--max-num-seqs + --max-waiting); retry later")
        job = Relay(ticket=ticket, chat=chat, stream=body.stream,
                  include_usage=bool(body.stream_options and body.stream_options.include_usage),
                  token_ids=body.return_token_ids)
        if body.stream:
            return StreamingResponse(self.stream(job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self.whole(http, job)

    def fail(self, ev: Event) -> ApiError:
        return ApiError(503 if self.thread.error is not None else 400, ev.error or "failed")

    async def whole(self, http: HttpRequest, job: Relay) -> Response:
        t = job.ticket
        got: list[int] = []
        while True:
            get = asyncio.ensure_future(t.events.get())
            while not (await asyncio.wait({get}, timeout=DISCONNECT_CHECK_S))[0]:
                if await http.is_disconnected():
                    get.cancel()
                    self.thread.abort(t.key)
                    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            ev = get.result()
            if ev.error is not None:
                raise self.fail(ev)
            got += ev.token_ids
            if ev.finish_reason is not None:
                break
        ids = got if job.token_ids else None
        text = ev.text or ""
        choice = chat_choice(text, ev.finish_reason, ids, delta=False) if job.chat else \
            completion_choice(text, ev.finish_reason, ids)
        body = envelope(t.key, "chat.completion" if job.chat else "text_completion",
                        self.config.served_model_name, [choice], usage(len(t.prompt_ids), len(got)))
        if job.token_ids:
            body["prompt_token_ids"] = list(t.prompt_ids)
        return JSONResponse(body)

    async def stream(self, job: Relay) -> AsyncIterator[str]:
        t, done = job.ticket, False
        text = TextStream(self.codec, t.params.stop)
        obj = "chat.completion.chunk" if job.chat else "text_completion"
        created, n = int(time.time()), 0
        try:
            if job.chat:
                yield sse(envelope(t.key, obj, self.config.served_model_name,
                                   [chat_choice("", None, None, delta=True, first=True)], None, created))
            while not done:
                ev = await t.events.get()
                if ev.error is not None:
                    done = True
                    yield sse(self.fail(ev).body())
                    break
                done = ev.finish_reason is not None
                n += len(ev.token_ids)
                delta = text.feed(ev.token_ids, ev.text if done else None)
                ids = list(ev.token_ids) if job.token_ids else None
                choice = chat_choice(delta, ev.finish_reason, ids, delta=True) if job.chat else \
                    completion_choice(delta, ev.finish_reason, ids)
                if ev.token_ids or done:  # a chunk per step, its text empty if held back: clients time tokens
                    yield sse(envelope(t.key, obj, self.config.served_model_name, [choice], None, created))
            if job.include_usage:
                yield sse(envelope(t.key, obj, self.config.served_model_name, [], usage(len(t.prompt_ids), n),
                                   created))
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # the client went away (or the server is being torn down): free its pages
                self.thread.abort(t.key)


def unsupported(body: Sampling) -> None:
    """Fields OpenAI defines that this server does not implement: one 400 naming the field."""
    checks = [("presence_penalty", body.presence_penalty == 0, "0"),
              ("frequency_penalty", body.frequency_penalty == 0, "0"),
              ("min_tokens", body.min_tokens == 0, "0"),
              ("logprobs", not getattr(body, "logprobs", None), "null"),
              ("suffix", not getattr(body, "suffix", None), "null")]
    for name, ok, valid in checks:
        if not ok:
            raise ApiError(400, f"{name}: not supported by this server; valid: {valid}", name)


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="tessera", docs_url=None, redoc_url=None, openapi_url=None)
    config = server.config

    def authorized(http: HttpRequest) -> None:
        if config.api_key is not None and http.headers.get("authorization") != f"Bearer {config.api_key}":
            raise ApiError(401, "a valid API key is needed: header 'Authorization: Bearer <key>' (--api-key)")

    @app.exception_handler(ApiError)
    async def api_error(_http: HttpRequest, e: ApiError) -> JSONResponse:
        if e.status == 400:
            server.metrics.rejected.labels("invalid").inc()
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_http: HttpRequest, e: RequestValidationError) -> JSONResponse:
        server.metrics.rejected.labels("invalid").inc()
        err = validation_error(list(e.errors()))
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_http: HttpRequest, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, http: HttpRequest) -> Response:
        server.check_model(body.model)
        ids = server.prompt_ids(body.one_prompt())
        return await server.run(http, body, ids, server.sampling(body, ids, body.max_tokens), chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(body: ChatRequest, http: HttpRequest) -> Response:
        server.check_model(body.model)
        ids = server.chat_ids(body)
        return await server.run(http, body, ids, server.sampling(body, ids, body.max_new()), chat=True)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.served_model_name, "object": "model",
                                            "created": config.created, "owned_by": "tessera",
                                            "root": server.engine.source.name,
                                            "max_model_len": server.model_len}]}

    @app.get("/health")
    async def health() -> Response:
        if server.thread.error is not None:
            return JSONResponse(error_body(503, f"the engine stopped: {server.thread.error}"),
                                status_code=503)
        if server.draining():
            return JSONResponse(error_body(503, "draining"), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
