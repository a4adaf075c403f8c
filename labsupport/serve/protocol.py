"""The OpenAI wire format: request bodies (validated), responses, stream chunks and errors.

Introduced in notebook 09 (serving over HTTP). The fields and their defaults follow the
OpenAI API reference for `/v1/completions` and `/v1/chat/completions`: temperature 1 (0 is
greedy), top_p 1, completions' max_tokens 16, a chat reply as long as the context allows,
up to four `stop` strings (not part of the returned text), `seed` for repeatable sampling,
`stream` for server-sent events and `stream_options.include_usage` for a last chunk that
counts the tokens. Three extensions, named as vLLM names them: `top_k`, `ignore_eos`
(generate exactly max_tokens: what load generators send) and `return_token_ids` (each
choice and chunk also carries the generated token ids: how the tests compare tokens).

A field this server does not implement (`n` > 1, `logprobs`, `tools`, ...) is refused in one
sentence with the API's error shape, ``{"error": {"message", "type", "param", "code"}}``;
so is a field the API does not have.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STRICT = ConfigDict(extra="forbid")     # an unknown field is a 400, as on the OpenAI API


class ApiError(Exception):
    """An error the client gets as ``{"error": {...}}`` with an HTTP status. Notebook 09 (serving over HTTP)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """The OpenAI error shape. Notebook 09 (serving over HTTP)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    """``stream_options``: include_usage adds a last chunk with the token counts. Notebook 09 (serving over HTTP)."""

    model_config = STRICT
    include_usage: bool = False


class SamplingFields(BaseModel):
    """The fields both endpoints share. Notebook 09 (serving over HTTP)."""

    model_config = STRICT
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted only at the values that change nothing (checked in `unsupported`)
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    logprobs: Any = None
    # extensions, as vLLM names them
    top_k: int | None = Field(default=None, ge=1)
    ignore_eos: bool = False
    return_token_ids: bool = False


class CompletionRequest(SamplingFields):
    """A ``/v1/completions`` body: one prompt, as text or token ids. Notebook 09 (serving over HTTP)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class Message(BaseModel):
    """One chat message; its content is text or a list of text parts. Notebook 09 (serving over HTTP)."""

    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None
    name: str | None = None


class ChatRequest(SamplingFields):
    """A ``/v1/chat/completions`` body. Notebook 09 (serving over HTTP)."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    tools: list | None = None
    tool_choice: Any = None
    functions: list | None = None
    function_call: Any = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None


def unsupported(body: SamplingFields) -> ApiError | None:
    """The first field set to something this server does not do, as a 400 in one sentence.
    Notebook 09 (serving over HTTP)."""
    checks = [("n", body.n != 1, "returns one choice per request; send n=1 (or leave it out) and one request per answer"),
              ("presence_penalty", body.presence_penalty != 0, "does not implement penalties; leave it at 0"),
              ("frequency_penalty", body.frequency_penalty != 0, "does not implement penalties; leave it at 0"),
              ("logit_bias", bool(body.logit_bias), "does not implement logit_bias; leave it out"),
              ("logprobs", body.logprobs not in (None, False, 0), "does not return log-probabilities; leave logprobs out")]
    if isinstance(body, CompletionRequest):
        checks += [("echo", body.echo, "does not echo the prompt; leave echo out"),
                   ("suffix", bool(body.suffix), "does not fill in a suffix; leave it out"),
                   ("best_of", body.best_of not in (None, 1), "generates one candidate; leave best_of out")]
    if isinstance(body, ChatRequest):
        checks += [(name, getattr(body, name) not in (None, [], False), "does not call tools; leave it out")
                   for name in ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")]
        checks += [("top_logprobs", body.top_logprobs is not None, "does not return log-probabilities; leave it out"),
                   ("response_format", body.response_format not in (None, {"type": "text"}),
                    "replies in plain text only; leave response_format out")]
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    checks += [("stop", len(stops) > 4 or "" in stops, "takes up to 4 non-empty stop strings")]
    for param, refused, why in checks:
        if refused:
            return ApiError(400, f"This server {why} ('{param}').", param=param, code="unsupported_parameter")
    return None


# --- responses ---------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """Token counts, as the API reports them. Notebook 09 (serving over HTTP)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(request_id: str, model: str, chat: bool, text: str, finish_reason: str,
               prompt_tokens: int, completion_tokens: int, token_ids: list[int] | None = None) -> dict:
    """The whole answer (stream=false): a ``text_completion`` or a ``chat.completion``, with
    its usage. Notebook 09 (serving over HTTP)."""
    choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return {"id": request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(request_id: str, model: str, chat: bool, text: str | None, finish_reason: str | None = None,
          token_ids: list[int] | None = None, role: bool = False) -> dict:
    """One streamed piece: new text (for chat, a ``delta``; role=True opens the reply with the
    assistant's role), and the finish reason on the last one. Notebook 09 (serving over HTTP)."""
    choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if chat:
        delta: dict = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(request_id: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the token counts.
    Notebook 09 (serving over HTTP)."""
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
