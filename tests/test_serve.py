"""The HTTP server (notebook 09), driven by a real client: the `openai` SDK, on 127.0.0.1.

The invariant: every answer, streamed or whole, greedy or seeded, alone or beside others,
holds the tokens `generate` gives the same request alone (the tiny model runs in float64,
where batching cannot flip a token by rounding). Then the ways a request goes wrong: bad
bodies get a 4xx in one sentence and never a 500, a disconnect storm, a burst over the
limit (429s) and a slow client leave no block leaked and no sequence stuck. Every wait has
a timeout; each server is started in a thread on a free port and stopped at the end.
"""

import asyncio
import time

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from labsupport.engine.generation import generate  # noqa: E402
from labsupport.weights.chat import chat_prompt  # noqa: E402
from labsupport.engine.sampling import GREEDY, SamplingConfig  # noqa: E402
from labsupport.errors import LabError  # noqa: E402
from labsupport.serve import BackgroundServer, create_app, is_loopback  # noqa: E402
from labsupport.weights.fixtures import ByteTokenizer, random_model  # noqa: E402
from serving_reference import alone_text  # noqa: E402

NAME = "tiny-llama"
TIMEOUT = 30
EOS = (257,)                    # the byte tokenizer's end token, which the served model stops at


@pytest.fixture(scope="module")
def model():
    return random_model(NAME, dtype=torch.float64)


@pytest.fixture(scope="module")
def served(model):
    """One server for the module: 3 batch slots, 4 more requests may wait."""
    app = create_app(model, ByteTokenizer(), NAME, max_slots=3, max_waiting=4, block_size=4)
    with BackgroundServer(app) as server:
        server.app = app
        yield server


def client(server, cls=None):
    cls = cls or openai.OpenAI
    return cls(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)


def wait_idle(app, timeout=TIMEOUT):
    """Until the engine thread has no work and no command waiting (bounded)."""
    deadline = time.monotonic() + timeout
    while app.state.engine.has_work or not app.state.engine_thread.inbox.empty():
        assert time.monotonic() < deadline, "the engine is stuck with work"
        time.sleep(0.01)
    time.sleep(0.05)                                  # let a step in progress end
    assert not app.state.engine.has_work and app.state.server.in_flight == 0


CASES = [  # prompt, max_tokens, temperature, top_p, seed, stream
    ("Hello there", 12, 0.0, 1.0, None, True),
    ("A much longer prompt that spans several cache blocks", 20, 0.0, 1.0, None, False),
    ("Seeded", 15, 1.0, 1.0, 7, True),
    ("Nucleus", 10, 0.8, 0.9, 3, False),
    ("x", 25, 1.0, 1.0, 11, True),
    ("Two", 6, 0.0, 1.0, None, True),
]


def test_every_answer_equals_generate_alone_streamed_or_not_concurrent(served, model):
    async def one(api, prompt, max_tokens, temperature, top_p, seed, stream):
        kwargs = dict(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                      seed=seed, extra_body={"return_token_ids": True, "ignore_eos": True})
        if not stream:
            out = await api.completions.create(**kwargs)
            return out.choices[0].token_ids, out.choices[0].text, out.choices[0].finish_reason, out.usage
        ids, text, reason, use = [], "", None, None
        async for chunk in await api.completions.create(stream=True, stream_options={"include_usage": True},
                                                        **kwargs):
            if chunk.choices:
                ids += chunk.choices[0].token_ids
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            use = chunk.usage or use
        return ids, text, reason, use

    async def everyone():
        api = client(served, openai.AsyncOpenAI)
        return await asyncio.gather(*(one(api, *case) for case in CASES))

    for case, (ids, text, reason, use) in zip(CASES, asyncio.run(asyncio.wait_for(everyone(), TIMEOUT))):
        prompt, max_tokens, temperature, top_p, seed, _ = case
        sampling = SamplingConfig(temperature, top_p=top_p if top_p < 1 else None, seed=seed) if temperature else GREEDY
        assert ids == alone_text(model, prompt, max_tokens, sampling, eos=()), case
        assert text == ByteTokenizer().decode(ids) and reason == "length"
        assert (use.prompt_tokens, use.completion_tokens) == (len(prompt.encode()), max_tokens)
    wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()


def test_chat_applies_the_template_and_stops_at_the_end_token(served, model):
    api = client(served)
    out = api.chat.completions.create(model=NAME, messages=[{"role": "system", "content": "Be brief."},
                                                            {"role": "user", "content": "Hi!"}],
                                      temperature=1.0, seed=2, max_tokens=40, extra_body={"return_token_ids": True})
    tok = ByteTokenizer()
    prompt = "Be brief.\n\nHi!"               # no chat template: the system message goes first, never dropped
    expected = alone_text(model, prompt, 40, SamplingConfig(1.0, seed=2), eos=EOS)
    assert out.choices[0].token_ids == expected and out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == ("stop" if expected[-1] == 257 else "length")
    assert out.usage.prompt_tokens == len(tok.encode(prompt))
    chunks = list(api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi!"}],
                                              max_tokens=5, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == tok.decode(alone_text(model, "Hi!", 5, eos=EOS))


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_text_before_it(served, model, stream):
    sampling = SamplingConfig(1.0, seed=1)
    full = ByteTokenizer().decode(alone_text(model, "Stop", 30, sampling, eos=()))
    stop = "GX"                                           # inside this seeded answer, past its start
    assert full.index(stop) > 3
    api = client(served)
    kwargs = dict(model=NAME, prompt="Stop", max_tokens=30, temperature=1.0, seed=1, stop=[stop, "never"],
                  extra_body={"ignore_eos": True})
    if stream:
        chunks = list(api.completions.create(stream=True, **kwargs))
        text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        out = api.completions.create(**kwargs)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert text == full[: full.index(stop)] and reason == "stop"
    wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()


BAD = [  # body, status, param, words in the sentence
    ({"model": NAME, "prompt": "x", "n": 0}, 400, "n", "from 1 to 128"),
    ({"model": NAME, "prompt": "x", "logprobs": 21}, 400, "logprobs", "from 0 to 20"),
    ({"model": NAME, "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "only with echo"),
    ({"model": NAME, "prompt": "x", "max_tokens": -3}, 400, "max_tokens", "greater than or equal to 0"),
    ({"model": NAME, "prompt": "x", "temperature": 5}, 400, "temperature", "less than or equal to 2"),
    ({"model": NAME, "prompt": "x", "stop": ["a", "b", ""]}, 400, "stop", "non-empty"),
    ({"model": NAME, "prompt": "x", "repetition_penalty": 1.3}, 400, "repetition_penalty", "does not implement"),
    ({"model": NAME, "prompt": "x", "seed": 2 ** 64}, 400, "seed", "less than 18446744073709551616"),
    ({"model": NAME, "prompt": "x", "seed": -2 ** 63 - 1}, 400, "seed", "greater than or equal to"),
    ({"model": NAME, "prompt": "y" * 300}, 400, "prompt", "context holds 256"),
    ({"model": NAME, "prompt": [10**6]}, 400, "prompt", "outside the vocabulary"),
    ({"model": NAME, "prompt": ["a", ""]}, 400, "prompt", "empty"),
    ({"model": NAME, "prompt": ""}, 400, "prompt", "empty"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "does not exist"),
    ({"prompt": "x"}, 400, "model", "required"),
]
BAD_CHAT = [
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools",
     "tools"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs",
     "needs logprobs: true"),
    ({"model": NAME, "messages": []}, 400, "messages", "at least 1"),
    ({"model": NAME, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400, "messages",
     "text content parts"),
    ({"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages", "input should be"),
    ({"model": NAME, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": "c"}]}, 400, "messages", "no chat template"),
]


@pytest.mark.parametrize("path, body, status, param, words",
                         [("/v1/completions", *b) for b in BAD] + [("/v1/chat/completions", *b) for b in BAD_CHAT])
def test_a_bad_request_gets_a_4xx_in_one_sentence(served, path, body, status, param, words):
    reply = httpx.post(served.url + path, json=body, timeout=TIMEOUT)
    error = reply.json()["error"]
    assert reply.status_code == status and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"]
    assert error["message"].endswith(".") and "\n" not in error["message"] and "Traceback" not in error["message"]


def test_malformed_json_and_the_sdk_error_types_and_the_engine_still_serves(served, model):
    for raw in (b"{not json", b"[1, 2]", b""):
        reply = httpx.post(served.url + "/v1/completions", content=raw, timeout=TIMEOUT,
                           headers={"content-type": "application/json"})
        assert reply.status_code == 400 and reply.json()["error"]["message"].endswith(".")
    api = client(served)
    with pytest.raises(openai.BadRequestError, match="from 1 to 128"):
        api.completions.create(model=NAME, prompt="x", n=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert [m.id for m in api.models.list()] == [NAME]
    assert httpx.get(served.url + "/health", timeout=TIMEOUT).json() == {"status": "ok"}
    out = api.completions.create(model=NAME, prompt="still here", max_tokens=4, temperature=0,
                                 extra_body={"return_token_ids": True})
    assert out.choices[0].token_ids == alone_text(model, "still here", 4, eos=EOS)


def _spy_on_aborts(app, monkeypatch) -> list:
    aborted, engine = [], app.state.engine
    real = engine.abort

    def abort(request_id):
        aborted.append(request_id)
        return real(request_id)
    monkeypatch.setattr(engine, "abort", abort)
    return aborted


def test_a_disconnect_storm_aborts_every_sequence_and_leaks_nothing(served, monkeypatch):
    aborted = _spy_on_aborts(served.app, monkeypatch)
    api = client(served)
    ids = []
    for i in range(6):                        # each client reads a chunk or two, then hangs up
        stream = api.completions.create(model=NAME, prompt=f"storm {i}", max_tokens=240, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True})
        for k, chunk in enumerate(stream):
            if k == 0:
                ids.append(chunk.id)
            if k == i % 2:
                break
        stream.close()
    wait_idle(served.app)
    assert set(ids) <= set(aborted) and len(set(ids)) == 6
    served.app.state.engine.blocks.assert_no_leaks()


BURST_TOKENS = 160


def test_a_burst_over_the_limit_gets_429s_and_the_rest_are_served(served, model):
    async def one(api, i):
        try:
            # long enough that no answer ends while the burst arrives (a slot freed early would admit
            # an eighth): 30 tokens once did, after the CPU decode step got faster
            out = await api.completions.create(model=NAME, prompt=f"burst {i}", max_tokens=BURST_TOKENS, temperature=0,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
            return out.choices[0].token_ids
        except openai.RateLimitError as error:
            return error

    async def burst():
        api = client(served, openai.AsyncOpenAI)
        return await asyncio.gather(*(one(api, i) for i in range(16)))

    results = asyncio.run(asyncio.wait_for(burst(), TIMEOUT))
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    served_ok = [(i, r) for i, r in enumerate(results) if not isinstance(r, openai.RateLimitError)]
    assert 16 - 7 <= len(refused) < 16                    # 3 slots + 4 waiting are accepted at once
    assert refused[0].status_code == 429 and refused[0].response.headers["retry-after"] == "1"
    assert refused[0].body["code"] == "rate_limit_exceeded" and "busy" in refused[0].body["message"]
    for i, ids in served_ok:
        assert ids == alone_text(model, f"burst {i}", BURST_TOKENS, eos=())
    wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()


def test_a_slow_client_gets_every_token_and_leaks_nothing(served, model):
    api = client(served)
    got = []
    for chunk in api.completions.create(model=NAME, prompt="slow", max_tokens=12, temperature=0, stream=True,
                                        extra_body={"ignore_eos": True, "return_token_ids": True}):
        got += chunk.choices[0].token_ids
        time.sleep(0.05)                                  # the engine finishes long before the client reads
    assert got == alone_text(model, "slow", 12, eos=())
    wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_before_its_first_token_is_aborted(served, monkeypatch, stream):
    """A raw socket sends a request and closes at once (a streamed one is then cancelled before
    its first event): the engine ends up idle, its blocks free, nothing counted in flight, and
    the request was aborted, not served to the end."""
    import json
    import socket
    aborted = _spy_on_aborts(served.app, monkeypatch)
    body = json.dumps({"model": NAME, "prompt": "gone", "max_tokens": 250, "ignore_eos": True, "temperature": 0,
                       "stream": stream})
    with socket.create_connection((served.host, served.port), timeout=TIMEOUT) as raw:
        raw.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {served.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    deadline = time.monotonic() + TIMEOUT
    while not aborted and time.monotonic() < deadline:       # until the server has noticed
        time.sleep(0.01)
    wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()
    assert len(aborted) == 1                  # the server noticed the hang-up after a token or two


def test_the_server_listens_on_this_machine_unless_told(model):
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(LabError, match="this machine only"):
        BackgroundServer(create_app(model, ByteTokenizer(), NAME), host="0.0.0.0")
    from labsupport.cli import build_parser
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1"
    with pytest.raises(LabError, match="max_waiting"):
        create_app(model, ByteTokenizer(), NAME, max_waiting=-1)


@pytest.mark.slow
def test_the_embedded_model_streams_its_chat_template_answers_as_generate_does(smollm):
    """SmolLM2-135M (fp32) over HTTP with the openai SDK: a real chat template, a real BPE
    tokenizer, streamed and whole, two at once: the tokens and the text of `generate` alone."""
    model, tok = smollm
    app = create_app(model, tok, "smollm2-135m", max_slots=2, max_waiting=2)
    questions = ["Why is the sky blue?", "Name a fruit that is rich in vitamin C."]
    with BackgroundServer(app) as server:
        async def ask(api, question, stream):
            kwargs = dict(model="smollm2-135m", messages=[{"role": "user", "content": question}], max_tokens=16,
                          temperature=0, extra_body={"return_token_ids": True})
            if not stream:
                out = await api.chat.completions.create(**kwargs)
                return out.choices[0].token_ids, out.choices[0].message.content
            ids, text = [], ""
            async for chunk in await api.chat.completions.create(stream=True, **kwargs):
                ids += chunk.choices[0].token_ids or []
                text += chunk.choices[0].delta.content or ""
            return ids, text

        async def both():
            api = client(server, openai.AsyncOpenAI)
            return await asyncio.gather(ask(api, questions[0], True), ask(api, questions[1], False))

        answers = asyncio.run(asyncio.wait_for(both(), 300))
        wait_idle(app, timeout=120)
        app.state.engine.blocks.assert_no_leaks()
    for question, (ids, text) in zip(questions, answers):
        prompt = tok.encode(chat_prompt(tok, question), add_special_tokens=False)
        expected = generate(model, prompt, 16, eos_token_ids=model.config.eos_token_ids).row(0)
        assert ids == expected and text == tok.decode(expected, skip_special_tokens=True)


def test_an_engine_that_fails_answers_every_client_and_says_so(model):
    """A bug inside a step stops the engine thread: the waiting client gets a 500 in the API's
    shape (not a hang), /health turns 503, and later requests are refused at once."""
    app = create_app(model, ByteTokenizer(), NAME, max_slots=2)

    def broken_step():
        raise RuntimeError("a bug in a step")
    app.state.engine.step = broken_step
    with BackgroundServer(app) as server:
        reply = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 3},
                           timeout=TIMEOUT)
        assert reply.status_code == 500 and "a bug in a step" in reply.json()["error"]["message"]
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 503
        again = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "x"}, timeout=TIMEOUT)
        assert again.status_code == 503 and again.json()["error"]["type"] == "server_error"


def test_the_cli_server_steps_the_engine_in_the_thread_that_calls_it(model):
    """`run_server` (what `python -m labsupport serve` runs) serves over uvicorn in a thread of its own
    and steps the engine in the calling thread, the one that loaded the model (issue 49: a second
    thread's OpenMP team starts cold at every step); stopping the engine's loop stops the server."""
    import socket
    import threading
    from labsupport.serve.server import run_server
    app = create_app(model, ByteTokenizer(), NAME, max_slots=2, block_size=4)
    stepped_in, real = set(), app.state.engine.step

    def step():
        stepped_in.add(threading.get_ident())
        return real()
    app.state.engine.step = step
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caller = threading.Thread(target=run_server, args=(app, "127.0.0.1", port, "warning"), daemon=True)
    caller.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    reply = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "here", "max_tokens": 4,
                                                      "temperature": 0, "ignore_eos": True}, timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    assert stepped_in == {caller.ident}
    app.state.engine_thread.stop()
    caller.join(TIMEOUT)
    assert not caller.is_alive()
