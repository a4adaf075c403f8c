"""vLLM's tokenizer routes, beside the OpenAI ones: what a client calls to count tokens.

Introduced in notebook 09 (serving over HTTP). Shaped as vLLM shapes them, so that a load
generator or a client written for vLLM works here unchanged:

    POST /tokenize      {"model"?, "prompt": text, "add_special_tokens"?}  (or "messages": a chat)
                        -> {"count", "max_model_len", "tokens"}
    POST /detokenize    {"model"?, "tokens": [ids]} -> {"prompt": text}
    GET  /tokenizer_info  the tokenizer's class, vocabulary, context, special ids, chat template
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from .protocol import ApiError, DetokenizeRequest, TokenizeRequest


def require_served_model(server, name: str | None) -> None:
    """A 404 in one sentence unless `name` is the served model (None: any). Notebook 09 (serving over HTTP)."""
    if name is not None and name != server.model_name:
        raise ApiError(404, f"The model '{name}' does not exist here; this server serves "
                            f"'{server.model_name}' (GET /v1/models).", param="model", code="model_not_found")


def tokenize(server, body: TokenizeRequest) -> dict:
    """Text (or a chat, in the template the chat route uses) -> its token ids. Notebook 09 (serving over HTTP)."""
    require_served_model(server, body.model)
    if body.prompt is not None:
        tokens = server.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        tokens = server.tokenizer.encode(server._chat_text(body.messages), add_special_tokens=False)
    return {"count": len(tokens), "max_model_len": server.engine.model.config.max_position, "tokens": list(tokens)}


def detokenize(server, body: DetokenizeRequest) -> dict:
    """Token ids (inside the vocabulary, else a 400) -> text. Notebook 09 (serving over HTTP)."""
    require_served_model(server, body.model)
    vocab = server.engine.model.config.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise ApiError(400, f"The tokens must lie in the vocabulary [0, {vocab}).", param="tokens")
    return {"prompt": server.tokenizer.decode(body.tokens)}


SPECIAL_TOKENS = ("eos", "bos", "pad", "unk")


def tokenizer_info(server) -> dict:
    """The tokenizer's class, sizes, special tokens (each as text and as id, as lm-eval's remote
    tokenizer reads them: `eos_token`, `eos_token_id`, ...) and chat template. Notebook 09 (serving over HTTP)."""
    tok, config = server.tokenizer, server.engine.model.config
    info = {"tokenizer_class": type(tok).__name__, "vocab_size": config.vocab_size,
            "model_max_length": config.max_position}
    for name in SPECIAL_TOKENS:
        info[f"{name}_token"] = _text(getattr(tok, f"{name}_token", None))
        info[f"{name}_token_id"] = getattr(tok, f"{name}_token_id", None)
    return dict(info, chat_template=getattr(tok, "chat_template", None))


def _text(token) -> str | None:
    """A special token as text (a tokenizer may hold it as an AddedToken object)."""
    return None if token is None else str(token)


def _locked(server, route, body) -> JSONResponse:
    """`route(server, body)` in a worker thread, one tokenizer call at a time (`_Server.tokenizer_lock`),
    rendered to JSON there too: a million token ids take a second to render, which must not be the
    event loop's second."""
    with server.tokenizer_lock:
        return JSONResponse(route(server, body))


def add_tokenizer_routes(app, server) -> None:
    """Register /tokenize, /detokenize and /tokenizer_info on `app`. Notebook 09 (serving over HTTP)."""

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest):
        return await run_in_threadpool(_locked, server, tokenize, body)     # off the event loop: it grows with the body

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest):
        return await run_in_threadpool(_locked, server, detokenize, body)

    @app.get("/tokenizer_info")
    async def tokenizer_info_route():
        return tokenizer_info(server)
