"""A load generator for any OpenAI-compatible server: real clients, real sockets, streamed tokens.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport loadgen --url ... --rate ...``.

Each request of a seeded workload (`chat_workload`: the course's chat questions, long-tailed
answer lengths, Poisson or fixed-rate arrivals, as `serving_workload` draws them) is sent
at its arrival time by its own asyncio task over httpx, streaming (``stream: true``,
``stream_options.include_usage``), and the client notes when each token's chunk arrives.
From those times, as the in-process engine's metrics (`serving_metrics`) define them:

* TTFT: request sent -> first token chunk; latency: sent -> last chunk;
* ITL: the gaps between consecutive token chunks of one answer, pooled;
* TPOT: per answer, (last - first chunk) / (tokens - 1);
* throughput: generated tokens (the server's usage count) / (last chunk - first send);
* errors: by kind (an HTTP status such as "429", or the exception's name).

Each request asks for exactly its drawn length (``ignore_eos``, as vLLM's benchmark does), so
that every server does the same work; a server that ignores the field and stops early shows
it in its token count. `as_engine_requests` gives the same workload to the in-process
engine, so that the two measure the same thing with and without HTTP in between.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import numbers
import time
from dataclasses import dataclass, field, fields
from urllib.parse import urlsplit

from ..engine.serving.request import Request
from ..errors import LabError
from ..inputs import finite_number, whole_number
from .serving_metrics import goodput as serving_goodput
from .serving_metrics import percentile, request_times, time_per_output_token
from .serving_workload import arrival_times, output_lengths
from .workloads import CHAT_QUESTIONS


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load test: a question, the answer length asked for, and when to send
    it (seconds from the start); for a turn of a conversation (`agentic_workload`) also the
    system prompt and the earlier (user, assistant) turns it extends. Notebook 09 (serving over HTTP)."""

    question: str
    max_tokens: int
    arrival: float
    system: str | None = None
    history: tuple[tuple[str, str], ...] = ()

    def messages(self) -> list[dict]:
        """The chat messages this request sends: system, earlier turns, then the question."""
        turns = [m for user, answer in self.history for m in ({"role": "user", "content": user},
                                                               {"role": "assistant", "content": answer})]
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + turns + [{"role": "user", "content": self.question}]


@dataclass
class LoadResult:
    """What the client saw of one request: when it was sent, when each token chunk came, the
    tokens the server counted, and the error, if any. Notebook 09 (serving over HTTP)."""

    arrival: float
    sent: float = float("nan")
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


def chat_workload(count: int, rate: float | None, median_new_tokens: float = 16, sigma: float = 1.0,
                  min_new_tokens: int = 2, max_new_tokens: int = 256, seed: int = 0,
                  fixed_rate: bool = False) -> list[LoadRequest]:
    """`count` chat questions (the course's, in turn) with log-normal answer lengths, arriving
    as a seeded Poisson process at `rate` per second, or evenly spaced (`fixed_rate`), or all
    at once (rate None): `serving_workload.make_workload`'s draws. Notebook 09 (serving over HTTP)."""
    count = whole_number(count, "count (requests in the load test)")
    min_new_tokens = whole_number(min_new_tokens, "min_new_tokens")
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens", minimum=min_new_tokens)
    finite_number(median_new_tokens, "median_new_tokens", minimum=0, above_minimum=True)
    finite_number(sigma, "sigma (spread of the answer lengths)", minimum=0)
    seed = whole_number(seed, "seed", minimum=0)
    lengths = output_lengths(count, median_new_tokens, sigma, min_new_tokens, max_new_tokens, seed)
    if fixed_rate and rate is not None:
        rate = finite_number(rate, "The arrival rate (requests per second)", minimum=0, above_minimum=True)
        arrivals = [i / rate for i in range(count)]
    else:
        arrivals = arrival_times(count, rate, seed)
    return [LoadRequest(CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)], lengths[i], arrivals[i]) for i in range(count)]


AGENT_SYSTEM_HEAD = "You are a careful assistant. Answer from these notes when they help.\n\nNotes:\n"
AGENT_REPLY = "I checked the notes; here is a short answer. Ask me for more detail if you need it."


def agentic_workload(conversations: int, turns: int, rate: float, system_chars: int = 6000,
                     median_new_tokens: float = 16, max_new_tokens: int = 64, think_seconds: float = 2.0,
                     seed: int = 0) -> list[LoadRequest]:
    """An agent's traffic: `conversations` conversations starting as a seeded Poisson process at
    `rate` per second, each of `turns` user turns `think_seconds` apart. Every request carries the
    same long system prompt (`system_chars` characters of the evaluation text, repeated: about a
    quarter as many tokens) and all the earlier turns of its conversation (the assistant's
    replies canned, so the prompts are the same in every run): each prompt extends the one
    before it, which a prefix cache serves from blocks already computed. Notebook 09."""
    from .quality import eval_text
    conversations = whole_number(conversations, "conversations")
    turns = whole_number(turns, "turns (user turns per conversation)")
    system_chars = whole_number(system_chars, "system_chars (characters of the shared system prompt)")
    think_seconds = finite_number(think_seconds, "think_seconds", minimum=0)
    finite_number(median_new_tokens, "median_new_tokens", minimum=0, above_minimum=True)
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens (answers are at least 2 tokens)", minimum=2)
    seed = whole_number(seed, "seed", minimum=0)
    notes = eval_text()
    system = AGENT_SYSTEM_HEAD + (notes * (system_chars // len(notes) + 1))[:system_chars]
    starts = arrival_times(conversations, rate, seed)
    lengths = output_lengths(conversations * turns, median_new_tokens, 1.0, 2, max_new_tokens, seed)
    requests = []
    for c, start in enumerate(starts):
        history: list[tuple[str, str]] = []
        for t in range(turns):
            question = CHAT_QUESTIONS[(c + t) % len(CHAT_QUESTIONS)]
            requests.append(LoadRequest(question, lengths[c * turns + t], start + t * think_seconds, system,
                                        tuple(history)))
            history.append((question, AGENT_REPLY))
    return sorted(requests, key=lambda r: r.arrival)


def as_engine_requests(tokenizer, requests: list[LoadRequest]) -> list[Request]:
    """The same workload for the in-process engine: each question in the tokenizer's chat
    template (what a chat endpoint does with it), the same lengths and arrivals, end of
    sequence ignored. Notebook 09 (serving over HTTP)."""
    from ..weights.chat import chat_prompt
    if any(r.system or r.history for r in requests):
        raise LabError("as_engine_requests takes single questions (chat_workload's); a conversation's turns "
                       "(agentic_workload's) are served over HTTP only.")
    return [Request(tokenizer.encode(chat_prompt(tokenizer, r.question), add_special_tokens=False),
                    max_new_tokens=r.max_tokens, eos_token_ids=(), arrival=r.arrival, request_id=i)
            for i, r in enumerate(requests)]


def run_load(url: str, requests: list[LoadRequest], model: str | None = None, endpoint: str = "chat",
             timeout: float = 300.0, ignore_eos: bool = True, extra: dict | None = None) -> list[LoadResult]:
    """Send every request at its arrival time to the server at `url` (e.g. http://127.0.0.1:8000),
    streaming, and return what the client saw of each. Notebook 09 (serving over HTTP).

    model: the name to ask for (default: the first of the server's /v1/models); endpoint:
    "chat" (/v1/chat/completions, the question as one user message) or "completions" (the
    question as a raw prompt); timeout: seconds one request may take; extra: more fields for
    every body (e.g. a logit_bias that forbids the end token, for a server without ignore_eos).
    It runs its own event loop, in a helper thread when one is already running (a notebook's)."""
    if endpoint not in ("chat", "completions"):
        raise LabError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}.")
    if not isinstance(requests, (list, tuple)) or not requests:
        raise LabError("The load test has no requests; give it a list of at least one LoadRequest.")
    if not all(isinstance(r, LoadRequest) for r in requests):
        raise LabError("requests must be LoadRequests (chat_workload's or agentic_workload's).")
    url = _server_url(url)
    if model is not None and (not isinstance(model, str) or not model):
        raise LabError(f"model must be the served model's name or None (the server's first), got {model!r:.40}.")
    timeout = finite_number(timeout, "timeout (seconds per request)", minimum=0, above_minimum=True)
    work = _load(url, requests, model, endpoint, timeout, ignore_eos, _extra_fields(extra))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:          # a notebook's loop is running
        return pool.submit(asyncio.run, work).result()


async def _load(url, requests, model, endpoint, timeout, ignore_eos, extra) -> list[LoadResult]:
    import httpx

    limits = httpx.Limits(max_connections=len(requests) + 1, max_keepalive_connections=len(requests) + 1)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if model is None:
            model = await _first_model(client, url)
        start = time.perf_counter()
        tasks = [_one(client, url, model, endpoint, r, start, timeout, ignore_eos, extra) for r in requests]
        return list(await asyncio.gather(*tasks))


def _server_url(url) -> str:
    """`url` without a trailing slash if an http(s) URL with a host and a valid port; else one sentence."""
    import httpx
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise LabError(f"url must start with http:// or https://, got {url!r:.80}.")
    try:
        parts, _ = urlsplit(url), httpx.URL(url)
        port = parts.port                                   # ValueError unless a number from 0 to 65535
    except (ValueError, httpx.InvalidURL):
        parts = port = None
    if parts is None or not parts.hostname or port == 0 or url.split() != [url] or parts.query or parts.fragment:
        raise LabError(f"url {url!r:.80} is not a server's address; give one such as http://127.0.0.1:8000 "
                       "(a host, and a port from 1 to 65535).")
    return url.rstrip("/")


def _extra_fields(extra) -> dict:
    """`extra` as a dict of JSON-ready fields (None: none); else one sentence."""
    try:
        if extra is None or (isinstance(extra, dict) and json.dumps(extra)):
            return dict(extra or {})
    except (TypeError, ValueError):
        pass
    raise LabError("extra must be a dict of JSON fields for every request body, e.g. {'logit_bias': {...}}.")


async def _first_model(client, url: str) -> str:
    """The first model of the server's /v1/models, or one sentence naming the URL and what came back."""
    import httpx
    where = f"{url}/v1/models"
    try:
        reply = await client.get(where)
    except httpx.HTTPError as error:
        raise LabError(f"Could not read the model's name from {where} ({type(error).__name__}); "
                       "is an OpenAI-compatible server running there? Or pass model=...") from None
    try:
        listing = reply.json()
    except ValueError:                                   # not JSON (an HTML page, a proxy's error)
        listing = None
    models = listing.get("data") if isinstance(listing, dict) else None
    first = models[0] if isinstance(models, list) and models else None
    name = first.get("id") if isinstance(first, dict) else None
    if reply.status_code != 200 or not isinstance(name, str) or not name:
        what = "not JSON" if listing is None else "an empty list" if models == [] else "no data[0]['id']"
        raise LabError(f"Could not read the model's name from {where} (status {reply.status_code}, {what}); is an "
                       "OpenAI-compatible server running there? Or pass model=...")
    return name


async def _one(client, url, model, endpoint, request: LoadRequest, start: float, timeout: float,
               ignore_eos: bool, extra: dict) -> LoadResult:
    """One request at its arrival time; times are seconds from `start`."""
    import httpx

    result = LoadResult(arrival=request.arrival)
    await asyncio.sleep(max(0.0, start + request.arrival - time.perf_counter()))
    body = {"model": model, "max_tokens": request.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra)
    if endpoint == "chat":
        body["messages"], path = request.messages(), "/v1/chat/completions"
    elif request.system or request.history:
        result.error = "a conversation needs the chat endpoint"
        return result
    else:
        body["prompt"], path = request.question, "/v1/completions"
    result.sent = time.perf_counter() - start
    try:
        async with asyncio.timeout(timeout) if hasattr(asyncio, "timeout") else _no_timeout():
            async with client.stream("POST", url + path, json=body) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    result.error = str(reply.status_code)
                    return result
                async for line in reply.aiter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue                       # comments, keep-alives, blank lines, the end
                    _read_chunk(_parse_chunk(line[5:]), result, time.perf_counter() - start)
                    if result.error is not None:
                        return result                  # a broken stream: that request failed, not the test
    except (httpx.HTTPError, asyncio.TimeoutError) as error:
        result.error = type(error).__name__
    return result


def _parse_chunk(data: str):
    """A server-sent event's data as a JSON object, or None when it is not one (a malformed stream)."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


class _no_timeout:
    """Python 3.10 has no asyncio.timeout; httpx's own timeout still bounds every read."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


def _read_chunk(chunk: dict | None, result: LoadResult, now: float) -> None:
    """Note a token chunk's time (not the chat reply's opening role-only chunk), and the usage.
    A chunk that is not shaped as the API says (None: not a JSON object) ends that request with
    the error "malformed stream"; the load test goes on."""
    if chunk is None:
        result.error = "malformed stream"
        return
    if chunk.get("error"):
        result.error = "stream error"
        return
    usage, choices = chunk.get("usage"), chunk.get("choices") or []
    if (usage is not None and not isinstance(usage, dict)) or not isinstance(choices, list) \
            or not all(isinstance(c, dict) and isinstance(c.get("delta", {}), dict) for c in choices):
        result.error = "malformed stream"
        return
    if usage and isinstance(usage.get("completion_tokens"), int):
        result.tokens = usage["completion_tokens"]
    for choice in choices:
        delta = choice.get("delta")
        text = choice.get("text") if delta is None else delta.get("content")
        if delta is not None and "role" in delta and not text:
            continue                                   # the reply's opening: no token yet
        if choice.get("finish_reason") is not None and not text:
            continue                                   # a closing chunk without text
        result.chunk_times.append(now)


def summarize_load(results: list[LoadResult]) -> dict:
    """The load test's figures (the keys of `load_curve.engine_row`, plus latency and errors).
    Notebook 09 (serving over HTTP)."""
    done = [r for r in results if r.error is None and r.chunk_times]
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None or not r.chunk_times:
            errors[r.error or "no tokens"] = errors.get(r.error or "no tokens", 0) + 1
    nan = float("nan")
    if not done:
        return {"requests": len(results), "served": 0, "errors": sum(errors.values()), "error_kinds": errors,
                "tokens": 0, **dict.fromkeys(("throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
                                              "tpot_p50", "tpot_p99", "latency_p50", "latency_p99"), nan)}
    tokens = [r.tokens or len(r.chunk_times) for r in done]
    begin, end = min(r.sent for r in done), max(r.chunk_times[-1] for r in done)
    ttft = [r.chunk_times[0] - r.sent for r in done]
    gaps = [b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpot = [t for r, n in zip(done, tokens)
            if (t := time_per_output_token(r.chunk_times[0], r.chunk_times[-1], n)) is not None]
    latency = [r.chunk_times[-1] - r.sent for r in done]
    return {"requests": len(results), "served": len(done), "errors": sum(errors.values()), "error_kinds": errors,
            "tokens": sum(tokens), "duration": end - begin,
            "throughput": sum(tokens) / (end - begin) if end > begin else nan,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
            "tpot_p50": percentile(tpot, 50), "tpot_p99": percentile(tpot, 99),
            "latency_p50": percentile(latency, 50), "latency_p99": percentile(latency, 99)}


def _as_result(i: int, r) -> LoadResult:
    """Result `i` as a LoadResult (from a dict too), with its chunk times a list; else one sentence."""
    if isinstance(r, dict) and "arrival" in r and set(r) <= {f.name for f in fields(LoadResult)}:
        r = LoadResult(**r)
    if not isinstance(r, LoadResult) or not isinstance(r.chunk_times, (list, tuple)):
        raise LabError(f"Result {i} is not a LoadResult or its dict ({', '.join(f.name for f in fields(LoadResult))}).")
    return r


def _finite_time(t) -> bool:
    """Whether `t` is a finite number of seconds (not a bool; an int too large for a float is not)."""
    try:
        return isinstance(t, numbers.Real) and not isinstance(t, bool) and math.isfinite(t)
    except OverflowError:
        return False


def _served_row(i: int, r: LoadResult) -> dict:
    """A served result's `request_times` row, if its times are finite seconds in order; else one sentence."""
    times = [r.sent, *r.chunk_times]
    if not all(_finite_time(t) for t in times) or any(later < earlier for earlier, later in zip(times, times[1:])):
        raise LabError(f"Result {i} was served, so its sent time, then its token times, must be finite seconds, "
                       f"in order; got sent={r.sent!r:.40} and token times {r.chunk_times!r:.80}.")
    tokens = r.tokens or len(r.chunk_times)
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or tokens < 1:
        raise LabError(f"Result {i}'s tokens must be a whole number (0: count its chunks), got {tokens!r:.40}.")
    return request_times(float(r.sent), float(times[1]), float(times[-1]), int(tokens))


def goodput(results: list, ttft_slo: float, tpot_slo: float) -> dict:
    """Goodput (`serving_metrics.goodput`): the requests per second served within both
    service-level objectives (first token within `ttft_slo` seconds of sending, then at most
    `tpot_slo` seconds per later token), over the load test's span from the first request sent,
    and the fraction of all requests that met them (a failed request missed them).
    results: `run_load`'s LoadResults (or their dicts, as `load_test` returns them). Notebook 09.

    The results' order changes nothing. A failed request (an error, or no token) counts as missed;
    its `sent` moves the span's start only if finite: a nan (never sent) or other non-finite one is
    skipped. A served request's times are refused in one sentence unless finite and in order."""
    if not isinstance(results, (list, tuple)) or not results:
        raise LabError(f"goodput needs the results of at least one request (run_load's list), got {results!r:.60}.")
    results = [_as_result(i, r) for i, r in enumerate(results)]
    rows = [_served_row(i, r) for i, r in enumerate(results) if r.error is None and r.chunk_times]
    sent = [float(r.sent) for r in results if _finite_time(r.sent)]    # skipped: nan (never sent) and the like
    return serving_goodput(rows, ttft_slo, tpot_slo, start=min(sent, default=0.0), requests=len(results))


def load_test(url: str, requests: list[LoadRequest], model: str | None = None, endpoint: str = "chat",
              timeout: float = 300.0, ignore_eos: bool = True, extra: dict | None = None) -> dict:
    """`run_load`, then `summarize_load`: one flat dict of figures, plus every request's times
    under "results" (JSON-ready). Notebook 09 (serving over HTTP)."""
    results = run_load(url, requests, model, endpoint, timeout, ignore_eos, extra)
    return {**summarize_load(results), "results": [vars(r) for r in results]}
