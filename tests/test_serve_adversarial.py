"""No request stops the server (notebook 09, issue 36).

Every sampling value the protocol accepts is served (extreme seeds, temperatures and top-p
that used to raise inside the engine thread and leave /health at 503); one request whose
processing raises ends alone, with a 500 in one sentence (or an error event in a stream),
while the request beside it gets all its tokens. After each, /health is 200 and a
full-length request is served. Then compatibility: unknown fields accepted and logged once,
any number of stop strings (a very long one checked in linear time), usage on every chunk,
vLLM's tokenizer routes, and a system message that a model without a chat template keeps.
Every server runs in a thread on 127.0.0.1, every wait has a timeout.
"""

import asyncio
import time

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from labsupport.engine.drafts import PromptLookupDraft  # noqa: E402
from labsupport.engine.generation import generate  # noqa: E402
from labsupport.engine.sampling import SamplingConfig, probabilities  # noqa: E402
from labsupport.engine.serving import Engine, Request  # noqa: E402
from labsupport.engine.speculative import speculative_generate  # noqa: E402
from labsupport.errors import LabError  # noqa: E402
from labsupport.serve import BackgroundServer, create_app  # noqa: E402
from labsupport.serve.text import TextStream  # noqa: E402
from labsupport.weights.fixtures import ByteTokenizer, random_model  # noqa: E402
from serving_reference import alone_text  # noqa: E402

NAME = "tiny-llama"
TIMEOUT = 30
LENGTH = 8


@pytest.fixture(scope="module")
def model():
    return random_model(NAME, dtype=torch.float64)


@pytest.fixture(scope="module")
def served(model):
    app = create_app(model, ByteTokenizer(), NAME, max_slots=2, max_waiting=4, block_size=4)
    with BackgroundServer(app) as server:
        server.app = app
        yield server


def client(server, cls=None):
    return (cls or openai.OpenAI)(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)


def still_serving(server, model):
    """/health is 200 and a full-length greedy request gets every token it asked for."""
    assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
    out = client(server).completions.create(model=NAME, prompt="after", max_tokens=LENGTH, temperature=0,
                                            extra_body={"ignore_eos": True, "return_token_ids": True})
    assert out.choices[0].token_ids == alone_text(model, "after", LENGTH) and out.choices[0].finish_reason == "length"
    deadline = time.monotonic() + TIMEOUT
    while server.app.state.engine.has_work or server.app.state.server.in_flight:
        assert time.monotonic() < deadline, "the engine is stuck with work"
        time.sleep(0.01)
    server.app.state.engine.blocks.assert_no_leaks()


EXTREMES = [  # every one is inside the protocol's ranges
    {"seed": 2 ** 64 - 1, "temperature": 1.0},
    {"seed": -1, "temperature": 1.0},
    {"seed": -2 ** 63, "temperature": 0.7},
    {"seed": 0, "temperature": 2.0},
    {"seed": 3, "temperature": 1e-30},
    {"seed": 3, "temperature": 1e-6},
    {"seed": 3, "temperature": 1e-4, "top_p": 1e-30},
    {"seed": 3, "temperature": 1.0, "top_p": 1e-30},
    {"seed": 3, "temperature": 2.0, "top_p": 5e-324},
    {"seed": 3, "temperature": 1.0, "top_p": 1.0},
    {"seed": 3, "temperature": 1.0, "top_k": 1},
    {"seed": 3, "temperature": 1.0, "top_k": 10 ** 12},
    {"temperature": 1e-30, "top_p": 1e-30, "top_k": 1},
]


@pytest.mark.parametrize("stream", [False, True])
def test_every_extreme_sampling_value_is_served_and_the_engine_lives(served, model, stream):
    api = client(served)
    for fields in EXTREMES:
        kwargs = dict(model=NAME, prompt="edge", max_tokens=LENGTH, extra_body={"ignore_eos": True,
                      "return_token_ids": True, **({"top_k": fields["top_k"]} if "top_k" in fields else {})},
                      **{k: v for k, v in fields.items() if k != "top_k"})
        if stream:
            ids = [t for c in api.completions.create(stream=True, **kwargs) for t in c.choices[0].token_ids]
        else:
            ids = api.completions.create(**kwargs).choices[0].token_ids
        assert len(ids) == LENGTH, fields
        if fields["temperature"] < 1e-5 or fields.get("top_p", 1) < 1e-20 or fields.get("top_k") == 1:
            assert ids == alone_text(model, "edge", LENGTH), fields           # all of these are the argmax
    still_serving(served, model)


@pytest.mark.parametrize("seed, words", [(2 ** 64, "less than 18446744073709551616"), (10 ** 40, "less than"),
                                         (-2 ** 63 - 1, "greater than or equal to")])
def test_a_seed_outside_64_bits_is_refused_in_one_sentence(served, model, seed, words):
    reply = httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": "x", "seed": seed,
                                                             "temperature": 1.0}, timeout=TIMEOUT)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "seed" and words in error["message"]
    assert error["message"].endswith(".") and "\n" not in error["message"]
    still_serving(served, model)


def test_the_library_entrances_take_the_same_extremes(model):
    """generate, Engine.run and speculative decoding share SamplingConfig: the same values work."""
    prompt = ByteTokenizer().encode("lib")
    assert SamplingConfig(1.0, seed=2 ** 64 + 5).seed == 5 and SamplingConfig(1.0, seed=2 ** 64 - 1).seed == 2 ** 64 - 1
    assert SamplingConfig(1e-30).greedy and not SamplingConfig(1e-5).greedy
    probs = probabilities(torch.tensor([[1e30, -1e30, 0.0]], dtype=torch.float64), SamplingConfig(1e-5, top_p=1e-30))
    assert probs.tolist() == [[1.0, 0.0, 0.0]]
    with pytest.raises(LabError, match="NaN"):
        probabilities(torch.tensor([[float("nan"), 0.0]]), SamplingConfig(1.0))
    for sampling in (SamplingConfig(1e-30, seed=2 ** 64 - 1), SamplingConfig(1.0, top_p=1e-30, seed=2 ** 70),
                     SamplingConfig(2.0, top_p=1.0, seed=2 ** 64 + 2 ** 63), SamplingConfig(1e-4, top_p=5e-324, seed=1)):
        assert len(generate(model, prompt, 6, sampling=sampling, eos_token_ids=()).row(0)) == 6
        result = Engine(model, max_slots=2, block_size=4).run(
            [Request(prompt, max_new_tokens=6, sampling=sampling, request_id=i) for i in range(2)], clock="steps")
        assert all(len(seq.output) == 6 for seq in result.sequences) and not result.rejected
        spec = speculative_generate(model, PromptLookupDraft(), prompt, 6, k=2, sampling=sampling, eos_token_ids=())
        assert len(spec.tokens) == 6


def _raise_for(marker: str, real):
    """`real` (the engine's next_token), raising for the sequence whose prompt starts with
    `marker`, from its third token on (so a stream has begun: the error goes out as an event)."""
    ids = ByteTokenizer().encode(marker)

    def patched(logits, seq):
        if seq.request.prompt[: len(ids)] == ids and len(seq.output) >= 2:
            raise RuntimeError("a bug\nin the sampler for this request")
        return real(logits, seq)
    return patched


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_processing_raises_ends_alone(served, model, monkeypatch, stream):
    import labsupport.engine.serving.engine as engine_module
    monkeypatch.setattr(engine_module, "next_token", _raise_for("boom", engine_module.next_token))
    sampled = SamplingConfig(1.0, seed=4)

    async def both():
        api = client(served, openai.AsyncOpenAI)
        kwargs = dict(model=NAME, max_tokens=20, temperature=1.0, seed=4,
                      extra_body={"ignore_eos": True, "return_token_ids": True})

        async def victim():
            if not stream:
                try:
                    await api.completions.create(prompt="boom", **kwargs)
                except openai.InternalServerError as error:
                    return error.status_code, error.body["message"]
                return None
            raw = httpx.AsyncClient(timeout=TIMEOUT)
            async with raw.stream("POST", served.url + "/v1/completions",
                                  json={"prompt": "boom", "stream": True, "ignore_eos": True,
                                        **{k: v for k, v in kwargs.items() if k != "extra_body"}}) as reply:
                return reply.status_code, await reply.aread()

        async def bystander():
            out = await api.completions.create(prompt="fine", **kwargs)
            return out.choices[0].token_ids
        return await asyncio.gather(victim(), bystander())

    (status, message), ids = asyncio.run(asyncio.wait_for(both(), TIMEOUT))
    assert ids == alone_text(model, "fine", 20, sampled)
    if stream:
        assert status == 200 and b'"type": "server_error"' in message and message.endswith(b"data: [DONE]\n\n")
        message = message.decode()
    else:
        assert status == 500 and message.endswith(".") and "\n" not in message
    assert "RuntimeError: a bug in the sampler" in message
    monkeypatch.undo()
    still_serving(served, model)


def test_a_failure_in_the_server_side_text_or_at_admission_ends_that_request_alone(served, model, monkeypatch):
    real_add = TextStream.add

    def add(self, token):
        if self.stop == ["explode"]:
            raise ValueError("decoding failed")
        return real_add(self, token)
    monkeypatch.setattr(TextStream, "add", add)
    api = client(served)
    with pytest.raises(openai.InternalServerError, match="ValueError: decoding failed"):
        api.completions.create(model=NAME, prompt="t", max_tokens=4, stop=["explode"])
    with httpx.stream("POST", served.url + "/v1/completions", timeout=TIMEOUT,
                      json={"model": NAME, "prompt": "t", "max_tokens": 4, "stop": "explode", "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert "ValueError: decoding failed" in lines[-2] and lines[-1] == "data: [DONE]"
    monkeypatch.undo()
    engine = served.app.state.engine
    real = engine.add_request

    def add_request(request, now=0.0):
        if request.prompt[:3] == ByteTokenizer().encode("adm"):
            raise KeyError("admission bug")
        return real(request, now)
    monkeypatch.setattr(engine, "add_request", add_request)
    with pytest.raises(openai.InternalServerError, match="KeyError"):
        api.completions.create(model=NAME, prompt="adm", max_tokens=4)
    monkeypatch.undo()
    still_serving(served, model)


def test_unknown_fields_are_ignored_with_one_log_line_and_refusals_are_logged(served, model, log_lines):
    api = client(served)
    out = api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi", "vendor_tag": 1}],
                                      max_tokens=3, temperature=0, store=True, metadata={"a": "b"},
                                      tool_choice="none", parallel_tool_calls=True,
                                      extra_body={"acme_priority": 5})
    assert out.choices[0].message.content is not None
    ignored = [line for line in log_lines if "ignored" in line]
    assert len(ignored) == 1 and all(name in ignored[0] for name in ("store", "metadata", "acme_priority",
                                                                    "messages[0].vendor_tag"))
    reply = httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": "x", "n": 0}, timeout=TIMEOUT)
    assert reply.status_code == 400
    assert any("400" in line and reply.json()["error"]["message"] in line for line in log_lines)


def test_usage_on_every_chunk_and_any_number_of_stop_strings(served, model):
    api = client(served)
    chunks = list(api.completions.create(model=NAME, prompt="count", max_tokens=6, temperature=0, stream=True,
                                         stream_options={"include_usage": True, "continuous_usage_stats": True},
                                         stop=[f"never{i}" for i in range(40)], extra_body={"ignore_eos": True}))
    with_choices = [c for c in chunks if c.choices]
    assert [c.usage.completion_tokens for c in with_choices] == list(range(1, 7))
    assert all(c.usage.prompt_tokens == 5 for c in chunks) and chunks[-1].usage.total_tokens == 11
    assert "".join(c.choices[0].text for c in with_choices) == ByteTokenizer().decode(alone_text(model, "count", 6))


def test_a_very_long_stop_string_is_checked_in_linear_time(served, model):
    long_stop = "ab" * 50_000
    stream = TextStream(ByteTokenizer(), stop=[long_stop, "zz"])
    start = time.perf_counter()
    for _ in range(300):
        stream.add(ord("a"))
        stream.add(ord("b"))
    assert time.perf_counter() - start < 2.0 and not stream.stopped
    assert len(stream.sent) == 0                                   # all of it may still begin the stop string
    stream.add(ord("z"))
    assert stream.sent == "ab" * 300 and not stream.stopped       # "z" may begin "zz": held back
    stream.add(ord("z"))
    assert stream.stopped and stream.sent == "ab" * 300
    out = client(served).completions.create(model=NAME, prompt="long", max_tokens=LENGTH, temperature=0,
                                            stop=[long_stop], extra_body={"ignore_eos": True})
    assert out.choices[0].text == ByteTokenizer().decode(alone_text(model, "long", LENGTH))


def test_the_tokenizer_routes_are_shaped_as_vllm_shapes_them(served, model):
    tok = ByteTokenizer()
    reply = httpx.post(served.url + "/tokenize", json={"model": NAME, "prompt": "héllo"}, timeout=TIMEOUT).json()
    assert reply == {"count": len(tok.encode("héllo")), "max_model_len": model.config.max_position,
                     "tokens": tok.encode("héllo")}
    back = httpx.post(served.url + "/detokenize", json={"tokens": reply["tokens"]}, timeout=TIMEOUT).json()
    assert back == {"prompt": "héllo"}
    chat = httpx.post(served.url + "/tokenize", json={"messages": [{"role": "system", "content": "S"},
                                                                   {"role": "user", "content": "U"}]},
                      timeout=TIMEOUT).json()
    assert chat["tokens"] == tok.encode("S\n\nU")
    info = httpx.get(served.url + "/tokenizer_info", timeout=TIMEOUT).json()
    assert info["tokenizer_class"] == "ByteTokenizer" and info["model_max_length"] == model.config.max_position
    bad = httpx.post(served.url + "/detokenize", json={"tokens": [10 ** 6]}, timeout=TIMEOUT)
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    neither = httpx.post(served.url + "/tokenize", json={"model": NAME}, timeout=TIMEOUT)
    assert neither.status_code == 400 and "exactly one" in neither.json()["error"]["message"]


def test_a_system_message_without_a_chat_template_is_used_and_counted(served, model):
    out = client(served).chat.completions.create(
        model=NAME, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=4, temperature=0, extra_body={"return_token_ids": True, "ignore_eos": True})
    assert out.usage.prompt_tokens == len("Be brief.\n\nHi")
    assert out.choices[0].token_ids == alone_text(model, "Be brief.\n\nHi", 4)


def test_the_engine_ends_only_the_request_whose_callback_raises(model):
    """In the engine itself (record=False, as a server drives it): a request whose on_token
    raises is aborted and listed in `failures` in one sentence; the other finishes as alone.
    `run` (record=True) says so in one sentence instead of a traceback from inside a step."""
    def explode(token):
        raise RuntimeError("callback bug")
    engine = Engine(model, max_slots=2, block_size=4, record=False)
    bad = engine.add_request(Request([1, 2, 3], max_new_tokens=6, request_id="bad", on_token=explode))
    good = engine.add_request(Request([4, 5, 6], max_new_tokens=6, request_id="good"))
    for _ in range(20):
        if not engine.has_work:
            break
        assert all(seq.id == "good" for seq, _ in engine.step())
    assert good.output == generate(model, [4, 5, 6], 6, eos_token_ids=()).row(0) and bad.is_finished
    assert engine.failures == [("bad", "Request 'bad' failed while being served (RuntimeError: callback bug).")]
    engine.blocks.assert_no_leaks()
    with pytest.raises(LabError, match="'bad' failed while being served"):
        Engine(model, block_size=4).run([Request([1, 2], max_new_tokens=3, request_id="bad", on_token=explode)])


def _failing_pass(runner, when):
    """runner.forward that raises, once, for the first pass `when(seqs, chunks)` picks, as a kernel's
    error or an exhausted memory would: before the pass has written its keys and values."""
    real, fired = runner.forward, []

    def forward(seqs, chunks, padding_rows=0):
        if not fired and when(seqs, chunks):
            fired.append([seq.id for seq in seqs])
            raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
        return real(seqs, chunks, padding_rows)
    return forward, fired


@pytest.mark.parametrize("token_budget", [None, 8])
def test_a_forward_pass_that_raises_ends_its_requests_and_the_engine_serves_on(model, token_budget):
    """Issue 49: a failing forward pass ends that pass's requests, each with one sentence in `failures`,
    and nothing else: the engine serves on, no block leaks, and no block of the failed pass reaches the
    prefix cache (the same prompt afterwards gets the tokens it gets alone)."""
    engine = Engine(model, max_slots=2, block_size=4, record=False, prefix_caching=True, token_budget=token_budget)
    prompt = list(range(10, 22))
    engine.runner.forward, fired = _failing_pass(
        engine.runner, lambda seqs, chunks: any(s.id == "bad" and s.num_cached == 0 for s in seqs))
    good = engine.add_request(Request([4, 5, 6], max_new_tokens=6, request_id="good"))
    for _ in range(3):
        engine.step()
    bad = engine.add_request(Request(prompt, max_new_tokens=4, request_id="bad"))
    while engine.has_work:
        engine.step()
    failed_ids = dict(engine.failures)
    assert "bad" in fired[0] and set(failed_ids) == set(fired[0]) and bad.is_finished
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in failed_ids["bad"]
    if "good" not in fired[0]:                                  # the newcomer's own pass: the other decodes on
        assert good.output == generate(model, [4, 5, 6], 6, eos_token_ids=()).row(0)
    engine.blocks.assert_no_leaks()
    hits = engine.prefix_hit_tokens
    again = engine.add_request(Request(prompt, max_new_tokens=4, request_id="again"))
    while engine.has_work:
        engine.step()
    assert engine.prefix_hit_tokens == hits                     # the failed pass's blocks were never offered
    assert again.output == generate(model, prompt, 4, eos_token_ids=()).row(0)


def test_a_failing_forward_pass_is_a_500_and_the_server_serves_on(served, model):
    """Issue 49: over HTTP, the request whose pass failed gets a 500 in one sentence, /health stays
    200, and the next request is served in full."""
    runner = served.app.state.engine.runner
    forward, fired = _failing_pass(runner, lambda seqs, chunks: any(s.request.prompt[:4] == [98, 111, 111, 109]
                                                                     for s in seqs))
    runner.forward = forward
    try:
        reply = httpx.post(served.url + "/v1/completions", json={"model": NAME, "prompt": "boom", "max_tokens": 4},
                           timeout=TIMEOUT)
    finally:
        del runner.forward                                      # the class's own again
    assert fired and reply.status_code == 500
    message = reply.json()["error"]["message"]
    assert "illegal memory access was encountered" in message and "\n" not in message and message.endswith(".")
    still_serving(served, model)
