"""The OpenAI wire format: request bodies (validated), responses, stream chunks and errors.

Introduced in notebook 09 (serving over HTTP). The fields and their defaults follow the
OpenAI API reference for `/v1/completions` and `/v1/chat/completions`: temperature 1 (0 is
greedy), top_p 1, completions' max_tokens 16, a chat reply as long as the context allows,
any number of `stop` strings (not part of the returned text), `seed` for repeatable sampling
(any integer in [-2**63, 2**64), as vLLM takes it), `stream` for server-sent events,
`stream_options.include_usage` for a last chunk that counts the tokens and vLLM's
`stream_options.continuous_usage_stats` for the counts so far on every chunk. Three extensions, named as vLLM names them: `top_k`, `ignore_eos`
(generate exactly max_tokens: what load generators send) and `return_token_ids` (each
choice and chunk also carries the generated token ids: how the tests compare tokens).

`logprobs`, `top_logprobs`, `echo`, `n` and several prompts per completions request are
served (their checks and shapes: `logprobs.py`). A field this server does not implement and
that would change the answer (`tools`, `suffix`, vLLM's `repetition_penalty`, ...) is refused in one sentence with the
API's error shape, ``{"error": {"message", "type", "param", "code"}}``. A field this server
does not know (`store`, `metadata`, a vendor's own, a typo such as `temprature`) is accepted and
ignored, as vLLM does, and the server logs one warning per request naming them all
(`ignored_fields`): a misspelled field leaves its setting at the default, and the log shows it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

LENIENT = ConfigDict(extra="allow")      # an unknown field is kept aside (model_extra), then ignored
SEED_RANGE = (-2 ** 63, 2 ** 64)         # vLLM's: a signed or unsigned 64-bit integer
Whole = Annotated[int, Strict()]         # a JSON integer: never true or false, never 1.0
TokenId = Annotated[int, Strict(), Field(ge=0)]
PROMPT_SHAPES = "text, a list of texts, a list of token ids (whole numbers from 0), or a list of such lists"


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

    model_config = LENIENT
    include_usage: bool = False
    continuous_usage_stats: bool = False


def lone_surrogate(value, path: str = "") -> str | None:
    """Where a JSON body holds a lone surrogate (``"\\ud800"``: valid JSON, but not Unicode text, so
    no tokenizer can encode it), as one sentence; None when it holds none. Notebook 09 (serving over HTTP)."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return (f"the text of '{path or 'the body'}' holds a lone surrogate (U+{ord(value[error.start]):04X}) "
                    f"at character {error.start}, which is not Unicode text; send valid UTF-8")
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _unicode_only(data):
    """A body's validator: the body as sent, or a ValueError naming its lone surrogate."""
    found = lone_surrogate(data)
    if found is not None:
        raise ValueError(found)
    return data


def prompt_problem(prompt) -> str | None:
    """What is wrong with a completions prompt's shape, as one sentence, or None. Notebook 09 (serving over HTTP)."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list):
        return f"a prompt is {PROMPT_SHAPES}; got {_json_kind(prompt)}"
    if all(isinstance(item, str) for item in prompt):
        return None
    single = not all(isinstance(item, list) for item in prompt)          # token ids, else lists of them
    for r, row in enumerate([prompt] if single else prompt):
        for i, token in enumerate(row):
            where = f"item {i}" if single else f"item {i} of prompt {r}"
            if isinstance(token, bool) or not isinstance(token, int):
                return f"a prompt is {PROMPT_SHAPES}; {where} is {_json_kind(token)}"
            if token < 0:
                return f"token ids are whole numbers from 0; {where} is {token}"
    return None


def _json_kind(value) -> str:
    names = {type(None): "null", bool: "true/false", str: "text", list: "a list", dict: "an object"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


class SamplingFields(BaseModel):
    """The fields both endpoints share. Notebook 09 (serving over HTTP)."""

    model_config = LENIENT
    model: str
    max_tokens: Whole | None = Field(default=None, ge=0)   # 0: only with echo (logprobs.refusal)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: Whole | None = Field(default=None, ge=SEED_RANGE[0], lt=SEED_RANGE[1])
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Any = 1                               # choices per prompt (checked in logprobs.refusal)
    # accepted only at the values that change nothing (checked in `unsupported`)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None
    logprobs: Any = None                     # checked in logprobs.refusal
    # extensions, as vLLM names them
    top_k: Whole | None = Field(default=None, ge=1)
    ignore_eos: bool = False
    return_token_ids: bool = False

    _text_is_unicode = model_validator(mode="before")(classmethod(lambda cls, data: _unicode_only(data)))

    @field_validator("n", mode="before")
    @classmethod
    def _n_null_is_one(cls, n):
        return 1 if n is None else n         # some clients send "n": null for the default


class CompletionRequest(SamplingFields):
    """A ``/v1/completions`` body: one prompt or several, as text or token ids. Notebook 09 (serving over HTTP)."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: bool = False
    suffix: str | None = None
    best_of: Whole | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ValueError(problem)
        return prompt


class Message(BaseModel):
    """One chat message; its content is text or a list of text parts. Notebook 09 (serving over HTTP)."""

    model_config = LENIENT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None
    name: str | None = None


class ChatRequest(SamplingFields):
    """A ``/v1/chat/completions`` body. Notebook 09 (serving over HTTP)."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Whole | None = Field(default=None, ge=1)
    top_logprobs: Any = None
    tools: list | None = None
    tool_choice: Any = None
    functions: list | None = None
    function_call: Any = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None


# vLLM's extra fields that would change the answer, and the values that change nothing
ANSWER_CHANGING_EXTRAS = {"repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0, "stop_token_ids": None,
                          "bad_words": None, "use_beam_search": False, "length_penalty": 1.0,
                          "prompt_logprobs": None, "guided_json": None, "guided_regex": None,
                          "guided_choice": None, "guided_grammar": None, "structured_outputs": None,
                          "include_stop_str_in_output": False, "skip_special_tokens": True,
                          "truncate_prompt_tokens": None, "allowed_token_ids": None}


def stop_strings(body: SamplingFields) -> list[str]:
    """`stop` as a list (a string, a list, or none). Notebook 09 (serving over HTTP)."""
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


def ignored_fields(body: BaseModel) -> list[str]:
    """The names of the fields this server does not know, in the body and in its messages
    and stream_options (accepted, ignored, logged once). Notebook 09 (serving over HTTP)."""
    names = [name for name in (body.model_extra or {}) if name not in ANSWER_CHANGING_EXTRAS]
    options = getattr(body, "stream_options", None)
    if options is not None:
        names += [f"stream_options.{name}" for name in options.model_extra or {}]
    for i, message in enumerate(getattr(body, "messages", None) or []):
        names += [f"messages[{i}].{name}" for name in message.model_extra or {}]
    return names


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body: a "prompt" (text) or chat "messages", and whether to add the
    tokenizer's special tokens to a prompt. Notebook 09 (serving over HTTP)."""

    model_config = LENIENT
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True

    _text_is_unicode = model_validator(mode="before")(classmethod(lambda cls, data: _unicode_only(data)))

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of 'prompt' (text) or 'messages' (a chat)")
        return self


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body: token ids to turn into text. Notebook 09 (serving over HTTP)."""

    model_config = LENIENT
    model: str | None = None
    tokens: list[TokenId]


def unsupported(body: SamplingFields) -> ApiError | None:
    """The first field set to something this server does not do, as a 400 in one sentence.
    Notebook 09 (serving over HTTP)."""
    checks = [("presence_penalty", body.presence_penalty != 0, "does not implement penalties; leave it at 0"),
              ("frequency_penalty", body.frequency_penalty != 0, "does not implement penalties; leave it at 0"),
              ("logit_bias", bool(body.logit_bias), "does not implement logit_bias; leave it out")]
    if isinstance(body, CompletionRequest):
        checks += [("suffix", bool(body.suffix), "does not fill in a suffix; leave it out")]
    if isinstance(body, ChatRequest):
        # without tools, tool_choice "none"/"auto" and parallel_tool_calls change nothing: accepted
        checks += [(name, getattr(body, name) not in (None, [], "none", "auto"), "does not call tools; leave it out")
                   for name in ("tools", "tool_choice", "functions", "function_call")]
        checks += [("response_format", body.response_format not in (None, {"type": "text"}),
                    "replies in plain text only; leave response_format out")]
    checks += [(name, body.model_extra.get(name) not in (None, default, [], {}), f"does not implement {name}; "
                "leave it out") for name, default in ANSWER_CHANGING_EXTRAS.items()]
    checks += [("stop", "" in stop_strings(body), "takes non-empty stop strings only")]
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
          token_ids: list[int] | None = None, role: bool = False, counts: tuple[int, int] | None = None) -> dict:
    """One streamed piece: new text (for chat, a ``delta``; role=True opens the reply with the
    assistant's role), and the finish reason on the last one; counts=(prompt, completion)
    tokens so far adds a "usage" (``continuous_usage_stats``). Notebook 09 (serving over HTTP)."""
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
    out = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
           "created": int(time.time()), "model": model, "choices": [choice]}
    if counts is not None:
        out["usage"] = usage(*counts)
    return out


def usage_chunk(request_id: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the token counts.
    Notebook 09 (serving over HTTP)."""
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
