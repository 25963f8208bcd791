"""The HTTP contract: OpenAI's request bodies (pydantic models, validated before anything is queued),
its response and stream-chunk objects, and its error body ``{"error": {"message", "type", "param",
"code"}}``. vLLM's extensions that load generators send are accepted: ``top_k``, ``ignore_eos``,
``min_tokens`` (0 only) and ``return_token_ids`` (each choice then carries its generated ``token_ids``,
and the response the ``prompt_token_ids``)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tessera.engine.tokenizer import Codec

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}
TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic's union-member loc labels


class ApiError(Exception):
    """Answered as OpenAI's error JSON with ``status``; ``param`` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "param": param,
                      "code": status}}


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """FastAPI's validation errors as one 400 naming the first field at fault and why."""
    if not errors:
        return ApiError(400, "the request body is invalid")
    e = errors[0]
    loc = [p for p in e.get("loc", ())[1:]
           if isinstance(p, int) or (isinstance(p, str) and p.lower() not in TYPE_NAMES and "[" not in p
                                     and "-" not in p)]
    param = ".".join(str(p) for p in loc) or None
    if e.get("type") == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {e.get('msg', '')}")
    if param is None:
        return ApiError(400, f"the request body must be a JSON object: {e.get('msg', '')}")
    return ApiError(400, f"{param}: {e.get('msg', 'invalid')}", param)


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields shared by both endpoints (OpenAI's names; top_k, ignore_eos: vLLM's)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1: all tokens")
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    presence_penalty: float = 0.0  # not supported: 0 only (a 400 names it otherwise)
    frequency_penalty: float = 0.0  # not supported: 0 only
    ignore_eos: bool = False
    min_tokens: int = 0  # not supported: 0 only
    return_token_ids: bool = False

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stops):
            raise ApiError(400, "stop: stop strings must be non-empty", "stop")
        return stops


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False  # not supported: false only
    logprobs: int | None = None  # not supported: null only
    suffix: str | None = None  # not supported: null only

    def one_prompt(self) -> str | list[int]:
        """A request holds one prompt (a string or token ids); a batch of several is refused."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ApiError(400, f"prompt: one prompt per request; got {len(p)}", "prompt")
            p = p[0]
        if not p:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        if self.echo:
            raise ApiError(400, "echo: not supported; valid: false", "echo")
        return p


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False  # not supported: false only
    add_generation_prompt: bool = True

    def max_new(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TextStream:
    """A request's text as its tokens arrive: each call gives the text not sent yet. Text that a later
    token could still change is held back: an unfinished UTF-8 character, and the last (longest stop
    string − 1) characters, which may begin a stop string. The final text is the engine's (EOS left out,
    cut at a stop string)."""

    def __init__(self, codec: Codec, stops: tuple[str, ...]) -> None:
        self.codec, self.stops = codec, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""

    def feed(self, token_ids: tuple[int, ...], final: str | None) -> str:
        self.ids += token_ids
        if final is None:
            text = self.codec.decode(self.ids).rstrip("\ufffd")
            text = text[:max(0, len(text) - self.hold)]
            if any(s in text for s in self.stops):  # the engine ends the request at this token
                return ""
        else:
            text = final
        if not text.startswith(self.sent):  # a later token re-spelled earlier text: wait for the end
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_choice(text: str, finish_reason: str | None, token_ids: list[int] | None) -> dict[str, Any]:
    c: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def chat_choice(text: str, finish_reason: str | None, token_ids: list[int] | None, *, delta: bool,
                first: bool = False) -> dict[str, Any]:
    if delta:
        body = {"role": "assistant", "content": text} if first else {"content": text}
        c: dict[str, Any] = {"index": 0, "delta": body, "logprobs": None, "finish_reason": finish_reason}
    else:
        c = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
             "finish_reason": finish_reason}
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def envelope(rid: str, obj: str, model: str, choices: list[dict[str, Any]],
             usage_: dict[str, int] | None, created: int | None = None) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created or int(time.time()), "model": model,
            "choices": choices, "usage": usage_}
