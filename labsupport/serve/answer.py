"""One request's way back, choice by choice: tokens from the engine -> text -> a body or events.

Introduced in notebook 09 (serving over HTTP). A request may ask for several choices
(several prompts on /v1/completions, `n` per prompt): each choice is its own engine
request with its own token queue (`Choice`); `Reply` joins them into one JSON body or one
stream of server-sent events, choices told apart by their "index". Each choice's text may
begin with its prompt (`echo`) and carries the log-probabilities asked for (`logprobs.py`);
with echo and logprobs the prompt's come first on the queue, from one forward pass the
engine thread runs between two steps. With `max_tokens: 0` (echo only) no engine request
is made: the prompt is the whole answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.responses import StreamingResponse

from ..engine.serving.request import Request
from . import logprobs as lp, protocol
from .engine_loop import Failure, TokenQueue
from .protocol import ApiError
from .text import TextStream

LOG = logging.getLogger("uvicorn.error")


def one_sentence(error: BaseException) -> str:
    """An unexpected error as one sentence (its type and first words, no traceback). Notebook 09."""
    reason = " ".join(str(error).split()).rstrip(".") or "no message"
    return f"The server failed on this request ({type(error).__name__}: {reason[:300]})."


class Choice:
    """One choice: its engine request (None for max_tokens 0), its queue, its text so far.
    echo: the prompt's text and tokens begin the choice (completions); top: the alternatives
    per token asked for, or None. Notebook 09 (serving over HTTP)."""

    def __init__(self, server, request: Request | None, prompt: list[int], index: int, body, chat: bool,
                 echo_text: str | None = None, matchers: list | None = None):
        self.server, self.request, self.prompt, self.index, self.body, self.chat = \
            server, request, prompt, index, body, chat
        self.echo_text, self.top = echo_text, lp.top_asked(body)
        self.tokens = TokenQueue()
        self.text = TextStream(server.tokenizer, protocol.stop_strings(body) if matchers is None else None, matchers)
        self.ids: list[int] = []
        self.entries: list = []               # the answer's TokenLogprobs, if asked
        self.prompt_entries: list | None = None
        self.offset = 0                       # characters sent so far (the legacy text_offset)
        self.finish_reason: str | None = "length" if request is None else None
        self.engine_finished = request is None
        self.open = True
        self.arrival, self.last_token_at = time.perf_counter(), None      # for /metrics

    def submit(self) -> None:
        """Hand the prompt's scoring (echo with logprobs) and the request to the engine thread."""
        if self.echo_text is not None and self.top is not None:
            self.server.thread.score(self.prompt, self.top, self.tokens)
        if self.request is not None:
            if self.index % self.body.n == 0:                  # a prompt counts once, however many choices
                self.server.metrics.prompt_tokens.inc(len(self.prompt))
            self.server.thread.submit(self.request, self.tokens)

    async def first(self):
        """The prompt's log-probabilities (if asked) and the first token (None without a request)."""
        if self.echo_text is not None and self.top is not None:
            self.prompt_entries = await self._next()
        return None if self.request is None else await self._next()

    async def _next(self):
        """The next item from the engine; a failure or a timeout ends the request."""
        try:
            item = await self.tokens.get(self.server.token_timeout)
        except asyncio.TimeoutError:
            raise ApiError(503, f"No token came within {self.server.token_timeout:.0f} s; the server is "
                                "overloaded, retry later.", kind="server_error") from None
        if isinstance(item, Failure):
            self.close(engine_done=True)
            status = item.status if self.server.thread.alive else 500
            raise ApiError(status, item.message, kind="invalid_request_error" if status < 500 else "server_error")
        return item

    def _take(self, item) -> str:
        """Record a token; the text it adds (empty while held back)."""
        self.ids.append(item.token)
        now = time.perf_counter()
        self.server.metrics.token(self.last_token_at, self.arrival, now)
        self.last_token_at = now
        if item.logprobs is not None:
            self.entries.append(item.logprobs)
        self.engine_finished = item.finished
        new = self.text.add(item.token)
        if self.text.stopped:
            self.finish_reason = "stop"
        elif item.finished:
            new += self.text.finish()
            self.finish_reason = "stop" if item.token in self.request.eos_token_ids else "length"
        return new

    def _echo_piece(self) -> tuple[str, dict | None]:
        """The echoed prompt's text and legacy logprobs (or "" and None without echo)."""
        if self.echo_text is None:
            return "", None
        scores = None
        if self.top is not None:
            scores = lp.completion_entries(self.server.tokenizer, self.prompt, self.prompt_entries)
        self.offset = len(self.echo_text)
        return self.echo_text, scores

    def _logprobs(self, ids: list[int], entries: list) -> dict | None:
        """The log-probabilities of these tokens in the endpoint's shape (None if not asked)."""
        if self.top is None:
            return None
        if self.chat:
            return lp.chat_entries(self.server.tokenizer, entries)
        scores = lp.completion_entries(self.server.tokenizer, ids, entries, self.offset)
        self.offset = scores["text_offset"][-1] + len(scores["tokens"][-1]) if ids else self.offset
        return scores

    def _choice(self, text: str, scores, ids: list[int] | None, finish: str | None, delta: bool) -> dict:
        choice: dict = {"index": self.index, "logprobs": scores, "finish_reason": finish}
        if self.chat:
            choice["delta" if delta else "message"] = {"content": text} if delta else \
                {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.body.return_token_ids:
            choice["token_ids"] = list(ids or [])
        return choice

    async def whole(self, item, http) -> dict | None:
        """The whole choice (stream=false); None when the client has gone."""
        text, echo_scores = self._echo_piece()
        while item is not None:
            text += self._take(item)
            if self.finish_reason is not None:
                break
            item = await self._next()
            if await http.is_disconnected():
                return None                   # no one to answer; `close` aborts it
        scores = self._logprobs(self.ids, self.entries)
        if echo_scores is not None:
            scores = lp.joined([echo_scores, scores]) if scores is not None else echo_scores
        return self._choice(text, scores, self.ids, self.finish_reason, delta=False)

    async def pieces(self, item):
        """The choice as stream pieces: (choice dict, this choice, its tokens so far) per token."""
        text, scores = self._echo_piece()
        if self.chat:
            yield dict(self._choice("", None, [], None, True), delta={"role": "assistant", "content": ""}), self, 0
        elif self.echo_text is not None:
            yield self._choice(text, scores, [], self.finish_reason, True), self, 0
        while item is not None:
            text = self._take(item)
            scores = self._logprobs([item.token], self.entries[-1:])
            yield self._choice(text, scores, [item.token], self.finish_reason, True), self, len(self.ids)
            if self.finish_reason is not None:
                break
            item = await self._next()

    def close(self, engine_done: bool = False) -> None:
        """The choice is over for its client: abort it in the engine unless it has ended there."""
        if not self.open:
            return
        self.open = False
        self.server.in_flight -= 1
        if not (engine_done or self.engine_finished):
            self.server.thread.abort(self.request.request_id)


class Reply:
    """A request's choices, answered together: `body` (one JSON object) or `events` (a stream).
    Notebook 09 (serving over HTTP)."""

    def __init__(self, server, choices: list[Choice], request_id: str, chat: bool, body):
        self.server, self.choices, self.id, self.chat, self.body = server, choices, request_id, chat, body
        self.created = int(time.time())
        self.prompt_tokens = sum(len(c.prompt) for c in choices if c.index % body.n == 0)   # once per prompt

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.server.model_name}

    async def body_of(self, firsts: list, http) -> dict:
        """The whole answer: every choice, in order, and the token counts summed."""
        tasks = [asyncio.ensure_future(c.whole(item, http)) for c, item in zip(self.choices, firsts)]
        try:
            choices = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:                # one choice failed: the others stop waiting too
                task.cancel()
            raise
        if any(choice is None for choice in choices):
            return {}
        kind = "chat.completion" if self.chat else "text_completion"
        completion = sum(len(c.ids) for c in self.choices)
        return dict(self._head(kind), choices=list(choices), usage=protocol.usage(self.prompt_tokens, completion))

    async def events(self, firsts: list):
        """Server-sent events: each choice's pieces as they come, usage if asked, [DONE]."""
        options = self.body.stream_options
        continuous = options is not None and options.continuous_usage_stats
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        try:
            async for choice, source, done in _merged([c.pieces(item) for c, item in zip(self.choices, firsts)]):
                chunk = dict(self._head(kind), choices=[choice])
                if continuous:
                    chunk["usage"] = protocol.usage(len(source.prompt), done)
                yield _sse(chunk)
            if options is not None and options.include_usage:
                completion = sum(len(c.ids) for c in self.choices)
                yield _sse(dict(self._head(kind), choices=[],
                                usage=protocol.usage(self.prompt_tokens, completion)))
            yield "data: [DONE]\n\n"
        except ApiError as error:             # after the headers: the error goes out as an event
            LOG.info("%s stream -> %d: %s", self.id, error.status, error.message)
            yield _sse(error.body())
            yield "data: [DONE]\n\n"
        except Exception as error:            # noqa: BLE001 - this request alone fails, in one sentence
            LOG.info("%s stream -> 500: %s", self.id, one_sentence(error))
            yield _sse(protocol.error_body(one_sentence(error), kind="server_error"))
            yield "data: [DONE]\n\n"
        finally:
            self.close()

    def close(self) -> None:
        """Close every choice; one log line when some ended before their last token (the client went
        away, or an error logged above), since their tokens were aborted in the engine."""
        cut = sum(c.open and c.finish_reason is None for c in self.choices)
        if cut:
            LOG.info("%s: ended before its last token (the client went away, or the error above); aborted %d "
                     "choice(s) in the engine.", self.id, cut)
        for choice in self.choices:
            choice.close()


async def _merged(generators: list):
    """Items of several async generators, as each comes (one generator: simply its own)."""
    if len(generators) == 1:
        async for item in generators[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(generator):
        try:
            async for item in generator:
                await queue.put(item)
        except Exception as error:            # noqa: BLE001 - re-raised below, on the stream's side
            await queue.put(error)
        finally:
            await queue.put(done)

    tasks = [asyncio.ensure_future(pump(g)) for g in generators]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


class EventStream(StreamingResponse):
    """The reply as server-sent events; however the response ends (even cancelled by a
    disconnect before its first event), every choice is closed: aborted unless finished.
    Notebook 09 (serving over HTTP)."""

    def __init__(self, reply: Reply, firsts: list):
        super().__init__(reply.events(firsts), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.reply = reply

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.reply.close()


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
