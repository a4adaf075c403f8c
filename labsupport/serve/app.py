"""The HTTP routes: OpenAI-compatible completions and chat, streaming or not.

Introduced in notebook 09 (serving over HTTP). `create_app` builds a FastAPI app around
one model and one serving engine (stepped by `EngineThread`):

    GET  /health                 200 while the engine thread runs, 503 once it has stopped (HEAD too)
    GET  /v1/models              the one model this server serves
    POST /v1/completions         prompt (text or token ids) -> text
    POST /v1/chat/completions    messages, in the tokenizer's chat template -> a reply
    POST /tokenize, /detokenize  text <-> token ids, shaped as vLLM shapes them
    GET  /tokenizer_info         the tokenizer's class and sizes (vLLM's route)
    GET  /metrics                requests, tokens, queue, KV blocks, TTFT/ITL, for Prometheus (metrics.py)

One request's life: the body is validated (`protocol`; a bad one is a 400 in one sentence
and never reaches the engine), the prompt tokenized, the request checked against the
engine's sizes (`Engine.require_servable`), counted against the overload limit (a 429
past ``max_slots + max_waiting`` requests in flight), and handed to the engine thread.
Each of its choices (several prompts, `n` per prompt) is its own engine request, whose
tokens come back on its own queue; `answer.Reply` turns them into text (with the
log-probabilities asked for, `logprobs.py`) and joins the choices into one JSON body or one
stream of server-sent events, ``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``.
Whatever ends a request early (a stop string, a client that disconnects, a timeout) aborts
it in the engine, so that its cache blocks are free at the next step. Whatever goes wrong
while one request is served ends that request alone (a 500, or an error event in a stream,
in one sentence) and the engine serves on; every refusal (4xx) is logged with its sentence.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..weights.chat import chat_prompt
from ..engine.sampling import SEED_MODULUS, SamplingConfig
from ..engine.serving.engine import Engine
from ..engine.serving.request import Request
from ..errors import LabError
from ..inputs import finite_number, whole_number
from . import protocol
from . import logprobs as lp
from .answer import Choice, EventStream, Reply, one_sentence
from .engine_loop import EngineThread
from .metrics import Metrics
from .guards import MAX_BODY_BYTES, add_guards
from .precision import describe
from .protocol import ApiError, ChatRequest, CompletionRequest
from .text import stop_matchers
from .tokenizer_api import add_tokenizer_routes, require_served_model

LOG = logging.getLogger("uvicorn.error")        # uvicorn's own log: what the server prints
# Prompt tokens per engine step, by default (chunked prefill, notebook 06b): a long prompt then
# holds the other streams for about one such step at a time, not for its whole prefill.
DEFAULT_TOKEN_BUDGET = {"cuda": 2048, "cpu": 256}


def default_token_budget(model, max_slots: int = 8) -> int:
    """The server's tokens per engine step: `DEFAULT_TOKEN_BUDGET` for the model's device (a CPU's
    for any other), at least one decode per slot. Notebook 09 (serving over HTTP)."""
    return max(DEFAULT_TOKEN_BUDGET.get(model.device.type, DEFAULT_TOKEN_BUDGET["cpu"]), max_slots)


def create_app(model, tokenizer, model_name: str, max_waiting: int = 64, token_timeout: float = 600.0,
               api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, **engine_options) -> FastAPI:
    """The server's FastAPI app; its engine thread starts and stops with the app (lifespan).

    Introduced in notebook 09 (serving over HTTP). model, tokenizer: what `load_model` gives;
    model_name: the name clients put in "model"; max_waiting: requests accepted beyond the
    engine's batch slots before new ones get a 429; token_timeout: seconds a request waits
    for its next token before it is aborted (a 503); api_key: the key every route but
    /health requires (`guards.add_guards`), or None; max_body_bytes: the largest request body
    read (a 413 past it); engine_options: `Engine` keyword
    arguments (max_slots, policy, token_budget, prefix_caching, block_size, cache_tokens).
    Unlike `Engine`'s, the server's default token_budget is `default_token_budget` (chunked
    prefill); token_budget=None serves each prompt whole in its own pass.
    The app's state holds `engine` and `engine_thread` (tests check the blocks after a run).
    """
    max_waiting = whole_number(max_waiting, "max_waiting (requests queued beyond the batch slots)", minimum=0)
    token_timeout = finite_number(token_timeout, "token_timeout (seconds)", minimum=0, above_minimum=True)
    if "token_budget" not in engine_options:
        slots = engine_options.get("max_slots", 8)
        engine_options["token_budget"] = default_token_budget(model, slots if isinstance(slots, int) else 8)
    engine = Engine(model, record=False, **engine_options)
    server = _Server(engine, tokenizer, model_name, engine.max_slots + max_waiting, token_timeout)

    @asynccontextmanager
    async def lifespan(app):
        server.thread.start()
        yield
        server.thread.stop()

    app = FastAPI(title="labsupport", lifespan=lifespan)
    app.state.engine, app.state.engine_thread, app.state.server = engine, server.thread, server
    add_guards(app, api_key, max_body_bytes)

    _add_error_handlers(app)

    @app.get("/health")
    async def health():
        if not server.thread.alive:
            raise ApiError(503, "The engine has stopped; restart the server.", kind="server_error")
        return {"status": "ok"}
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)   # what probes send too

    described = describe(model)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": server.created,
                                            "owned_by": "labsupport", "max_model_len": model.config.max_position,
                                            "precision": described}]}

    @app.get("/metrics")
    async def metrics():
        return server.metrics.response()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        return await server.answer(body, http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, http: HttpRequest):
        return await server.answer(body, http, chat=True)

    add_tokenizer_routes(app, server)
    return app


def _add_error_handlers(app) -> None:
    """Every error as the API's one sentence, logged: ours (ApiError), a body that fails validation
    (a 400), Starlette's (404, 405) and any other exception (a 500)."""

    @app.exception_handler(ApiError)
    async def api_error(request, error: ApiError):
        _log_error(request, error.status, error.message)
        headers = {"Retry-After": "1"} if error.status == 429 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, error: RequestValidationError):
        refusal = _validation_error(error.errors())
        _log_error(request, 400, refusal.message)
        return JSONResponse(refusal.body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        message = f"{error.detail}: {request.method} {request.url.path}."
        _log_error(request, error.status_code, message)
        return JSONResponse(protocol.error_body(message), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def server_error(request, error: Exception):
        message = one_sentence(error)
        _log_error(request, 500, message)
        return JSONResponse(protocol.error_body(message, kind="server_error"), status_code=500)


def _log_error(request, status: int, message: str) -> None:
    """One log line per refusal or failure: the route, the status and the sentence the client got."""
    LOG.info("%s %s -> %d: %s", request.method, request.url.path, status, message)


def _validation_error(errors: list[dict]) -> ApiError:
    """FastAPI's validation errors as the API's one sentence: malformed JSON, an unknown field,
    a missing one, or the first field with a wrong value."""
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    path = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first["type"] == "json_invalid":
        return ApiError(400, "The request body is not valid JSON; send a JSON object.", code="invalid_json")
    if first["type"] == "value_error" and not path:        # a whole-body rule (e.g. /tokenize's one input)
        msg = first["msg"].removeprefix("Value error, ")
        return ApiError(400, f"{msg[0].upper()}{msg[1:]}.")
    if not path:
        return ApiError(400, "The request body must be a JSON object with the API's fields (model, prompt or "
                             "messages, ...).")
    param = path[0]
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {path[-1]}.", param=path[-1])
    if first["type"] == "missing":
        return ApiError(400, f"The field '{'.'.join(path)}' is required.", param=param)
    msg = first["msg"].removeprefix("Value error, ")
    msg = msg[0].lower() + msg[1:]
    return ApiError(400, f"Invalid value for '{param}': {msg}.", param=param)


class _Server:
    """What the routes share: the engine thread, the tokenizer, the overload count."""

    def __init__(self, engine: Engine, tokenizer, model_name: str, limit: int, token_timeout: float):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.thread = EngineThread(engine)
        self.metrics = Metrics(engine)
        self.limit, self.token_timeout = limit, token_timeout
        self.in_flight = 0
        self.created = int(time.time())
        # one worker thread tokenizes at a time: a Rust tokenizer refuses a call while another
        # thread changes its settings ("Already borrowed"), and one long body takes one core, not all
        self.tokenizer_lock = threading.Lock()
        eos = set(engine.model.config.eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos = tuple(sorted(eos))

    async def answer(self, body, http: HttpRequest, chat: bool):
        """Validate, queue, and answer one request (a JSON body, or a stream of events)."""
        require_served_model(self, body.model)
        refused = protocol.unsupported(body) or lp.refusal(body)
        if refused is not None:
            raise refused
        ignored = protocol.ignored_fields(body)
        if ignored:                    # at most 10 names of 40 characters: one client cannot flood the log
            shown = ", ".join(repr(name[:40]) for name in ignored[:10]) + (
                f" and {len(ignored) - 10} more" if len(ignored) > 10 else "")
            LOG.warning("%s: ignored the fields this server does not know: %s (a misspelled field, such as "
                        "'temprature', leaves its setting at the default).", http.url.path, shown)
        if not self.thread.alive:
            raise ApiError(503, "The engine has stopped; restart the server.", kind="server_error")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.metrics.requests.labels(endpoint="chat" if chat else "completions").inc()
        prompts, matchers = await run_in_threadpool(self._prepare, body, chat)     # off the event loop
        choices = self._choices(body, chat, rid, prompts, matchers)
        if self.in_flight + len(choices) > self.limit:
            raise ApiError(429, f"The server is busy: {self.in_flight} requests are in flight and this one "
                                f"brings {len(choices)}, past its limit of {self.limit}; retry in a moment.",
                           kind="rate_limit_error", code="rate_limit_exceeded")
        self.in_flight += len(choices)
        reply = Reply(self, choices, rid, chat, body)
        try:
            for choice in choices:
                choice.submit()
            firsts = [await choice.first() for choice in choices]   # a refusal by the engine is still a 4xx
        except BaseException:
            reply.close()
            raise
        if body.stream:
            return EventStream(reply, firsts)
        try:
            return await reply.body_of(firsts, http)
        except ApiError:
            raise
        except Exception as error:                # noqa: BLE001 - this request alone fails, in one sentence
            raise ApiError(500, one_sentence(error), kind="server_error") from error
        finally:
            reply.close()

    def _prepare(self, body, chat: bool) -> tuple[list[tuple[list[int], str | None]], list]:
        """What takes time in proportion to the body, done once per request in a worker thread (so
        that no body, however long, holds the event loop and every stream on it): the prompts'
        tokens, and the stop strings' automata that all its choices share."""
        with self.tokenizer_lock:
            return self._prompts(body, chat), stop_matchers(protocol.stop_strings(body))

    def _choices(self, body, chat: bool, rid: str, prompts, matchers) -> list[Choice]:
        """One `Choice` per prompt and per `n`, indexed prompt by prompt; choice j of a prompt
        draws with seed + j, so that choice 0 is what n=1 gives. Too many is a 400."""
        if len(prompts) * body.n > self.limit:
            raise ApiError(400, f"This request asks for {len(prompts) * body.n} choices ({len(prompts)} prompts "
                                f"x n={body.n}) but the server holds at most {self.limit} at once; split it.",
                           param="n")
        choices, several = [], len(prompts) * body.n > 1
        for i, (ids, text) in enumerate(prompts):
            for j in range(body.n):
                name = f"{rid}-{i * body.n + j}" if several else rid       # the engine's request id
                request = self._engine_request(body, ids, chat, name, j)
                echo = text if not chat and body.echo else None
                choices.append(Choice(self, request, ids, i * body.n + j, body, chat, echo, matchers))
        return choices

    def _prompts(self, body, chat: bool) -> list[tuple[list[int], str | None]]:
        """Each prompt's token ids and its text (for echo: a text prompt as sent, token ids decoded)."""
        if chat:
            return [(self._ids(self.tokenizer.encode(self._chat_text(body.messages), add_special_tokens=False)),
                     None)]
        prompt = body.prompt
        several = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
        prompts = list(prompt) if several else [prompt]
        if not prompts:
            raise ApiError(400, "The prompt is empty; send at least one token.", param="prompt")
        out = []
        for one in prompts:
            ids = self._ids(self.tokenizer.encode(one, add_special_tokens=False) if isinstance(one, str) else list(one))
            out.append((ids, one if isinstance(one, str) else self.tokenizer.decode(ids)))
        return out

    def _ids(self, ids: list[int]) -> list[int]:
        """A prompt's token ids, if there is one and each is in the vocabulary; else a 400."""
        if not ids:
            raise ApiError(400, "The prompt is empty; send at least one token.", param="prompt")
        vocab = self.engine.model.config.vocab_size
        outside = next((i for i, token in enumerate(ids) if not 0 <= token < vocab), None)
        if outside is not None:
            raise ApiError(400, f"Token id {ids[outside]} (item {outside} of the prompt) is outside the vocabulary "
                                f"[0, {vocab}).", param="prompt", code="invalid_token_id")
        return ids

    def _chat_text(self, messages) -> str:
        """The conversation in the tokenizer's chat template (`weights.chat.chat_prompt` for a
        user message after at most one system message)."""
        turns = [{"role": "system" if m.role == "developer" else m.role, "content": _content(m)} for m in messages]
        if turns[-1]["role"] != "user":
            raise ApiError(400, "The last message must come from the user.", param="messages")
        if len(turns) == 1 or (len(turns) == 2 and turns[0]["role"] == "system"):
            system = turns[0]["content"] if len(turns) == 2 else None
            return chat_prompt(self.tokenizer, turns[-1]["content"], system)    # no template: system text first
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ApiError(400, "This model has no chat template, so its chat endpoint takes one user message "
                                "(after at most one system message).", param="messages")
        return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    def _engine_request(self, body, prompt: list[int], chat: bool, request_id: str, draw: int) -> Request | None:
        """The engine's Request (None for max_tokens 0: echo alone); a prompt or a max_tokens
        that can never fit is a 400 here. draw: the choice's place among the prompt's n."""
        room = min(self.engine.model.config.max_position, self.engine.capacity) - len(prompt)
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
        if max_tokens is None:
            max_tokens = max(room, 1) if chat else 16            # the API's defaults
        try:
            if max_tokens == 0:                                  # echo alone: the prompt must still fit
                self.engine.require_servable(Request(prompt, max_new_tokens=1, request_id=request_id))
                return None
            sampling = SamplingConfig(temperature=body.temperature, top_k=body.top_k,
                                      top_p=body.top_p if body.top_p < 1 else None,
                                      seed=None if body.seed is None else (body.seed + draw) % SEED_MODULUS)
            request = Request(prompt, max_new_tokens=max_tokens, sampling=sampling,
                              eos_token_ids=() if body.ignore_eos else self.eos,
                              request_id=request_id, logprobs=lp.top_asked(body))
            self.engine.require_servable(request)
        except LabError as error:
            raise ApiError(400, str(error), param="messages" if chat else "prompt",
                           code="context_length_exceeded") from None
        return request


def _content(message) -> str:
    if isinstance(message.content, str) or message.content is None:
        return message.content or ""
    parts = [p.get("text") for p in message.content if p.get("type") == "text"]
    if len(parts) != len(message.content) or not all(isinstance(part, str) for part in parts):
        raise ApiError(400, "This server reads text content parts only.", param="messages")
    return "".join(parts)
