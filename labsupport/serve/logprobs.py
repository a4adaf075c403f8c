"""`logprobs`, `top_logprobs`, `echo`, `n` and `max_tokens: 0`: checked, and shaped as the API shapes them.

Introduced in notebook 09 (serving over HTTP). The numbers come from the engine
(`engine.serving.logprobs`): the model's own log-probabilities, log_softmax of its logits in
float32, before temperature and top-p (what vLLM returns by default). Two shapes:

* chat (`logprobs: true, top_logprobs: k`): ``choices[].logprobs.content[]``, one entry per
  token: {"token", "logprob", "bytes", "top_logprobs": [k x {"token", "logprob", "bytes"}]};
* completions (`logprobs: k`, the legacy shape): ``choices[].logprobs`` = {"tokens",
  "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; each dict holds the
  k best tokens and, as vLLM gives it, the token itself (so up to k + 1 entries; tokens whose
  texts are equal, such as halves of one character, share a key: the likelier one's). With
  `echo: true` the prompt comes first, its first token's log-probability and alternatives
  null (nothing precedes it). text_offset counts characters from the start of the returned text.

A log-probability too small for float32 (-inf) is sent as -9999.0, as vLLM sends it: JSON
has no infinity.
"""

from __future__ import annotations

from ..engine.serving.logprobs import MAX_TOP
from .protocol import ApiError, ChatRequest

FLOOR = -9999.0
MAX_CHOICES = 128


def _refuse(param: str, why: str) -> ApiError:
    return ApiError(400, f"Invalid value for '{param}': {why}.", param=param)


def _whole(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def refusal(body) -> ApiError | None:
    """The first of these fields with a value this server cannot take, as a 400 in one
    sentence: logprobs, top_logprobs, echo, n, best_of, max_tokens 0. Notebook 09 (serving over HTTP)."""
    chat = isinstance(body, ChatRequest)
    if chat and body.logprobs not in (None, True, False):
        return _refuse("logprobs", f"on chat it is true or false, got {body.logprobs!r}")
    if chat and body.top_logprobs is not None and not _whole(body.top_logprobs, 0, MAX_TOP):
        return _refuse("top_logprobs", f"a whole number from 0 to {MAX_TOP}, got {body.top_logprobs!r}")
    if chat and body.top_logprobs is not None and body.logprobs is not True:
        return _refuse("top_logprobs", "it needs logprobs: true")
    if chat and (body.model_extra or {}).get("echo") not in (None, False):
        return _refuse("echo", "the chat endpoint does not echo; use /v1/completions with echo")
    if not chat and body.logprobs is not None and not _whole(body.logprobs, 0, MAX_TOP):
        return _refuse("logprobs", f"on completions it is the number of alternatives per token, a whole "
                                   f"number from 0 to {MAX_TOP}, got {body.logprobs!r}")
    if not _whole(body.n, 1, MAX_CHOICES):
        return _refuse("n", f"a whole number from 1 to {MAX_CHOICES}, got {body.n!r}")
    if not chat and body.best_of not in (None, body.n):
        return _refuse("best_of", "this server returns every candidate it generates; leave best_of out (or equal to n)")
    if body.max_tokens == 0 and not (not chat and body.echo):
        return _refuse("max_tokens", "0 is allowed only with echo: true on /v1/completions (to score a prompt)")
    return None


def top_asked(body) -> int | None:
    """The alternatives per token the request asks for (0: the token's own only), or None:
    no log-probabilities. Notebook 09 (serving over HTTP)."""
    if isinstance(body, ChatRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def _number(logprob: float) -> float:
    return max(logprob, FLOOR)


def _piece(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_entries(tokenizer, entries: list) -> dict:
    """`TokenLogprobs` entries -> the chat shape, {"content": [...]}. Notebook 09 (serving over HTTP)."""
    def one(token: int, logprob: float) -> dict:
        text = _piece(tokenizer, token)
        return {"token": text, "logprob": _number(logprob), "bytes": list(text.encode("utf-8"))}
    return {"content": [dict(one(e.token, e.logprob), top_logprobs=[one(t, lp) for t, lp in e.top])
                        for e in entries]}


def completion_entries(tokenizer, tokens: list[int], entries: list, offset: int = 0) -> dict:
    """(token, `TokenLogprobs` or None) pairs -> the legacy completions shape; text_offset
    starts at `offset` characters. Notebook 09 (serving over HTTP)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, entry in zip(tokens, entries):
        text = _piece(tokenizer, token)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_number(entry.logprob))
        top: dict = {}
        for t, logprob in entry.top + [(token, entry.logprob)]:     # two tokens with one text: the likelier
            top.setdefault(_piece(tokenizer, t), _number(logprob))
        out["top_logprobs"].append(top)
    return out


def joined(parts: list[dict]) -> dict:
    """Legacy logprobs of consecutive pieces (the echoed prompt, then the answer) as one.
    Notebook 09 (serving over HTTP)."""
    return {key: [x for part in parts for x in part[key]] for key in ("tokens", "token_logprobs",
                                                                      "top_logprobs", "text_offset")}
