"""Log-probabilities, echo, several prompts and n through the server (notebook 09).

The invariant: every log-probability the server returns is the model's own, log_softmax of
`model.logits` in float32 computed here directly on the same tokens (atol 1e-4), before
temperature and top-p; with echo the prompt's come first, the first one null. An
evaluation harness's request (lm-evaluation-harness `local-completions`: several token-id
prompts, echo, logprobs 1, max_tokens 0 or 1, temperature 0) scores a continuation as
scoring it in-process does. Bad values are a 400 in one sentence, and the server serves after.
"""

import json

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from labsupport.serve import BackgroundServer, create_app  # noqa: E402
from labsupport.weights.fixtures import ByteTokenizer, random_model  # noqa: E402

NAME = "tiny-llama"
TIMEOUT = 30
ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return random_model(NAME, dtype=torch.float64)


@pytest.fixture(scope="module")
def served(model):
    app = create_app(model, ByteTokenizer(), NAME, max_slots=3, max_waiting=8, block_size=4)
    with BackgroundServer(app) as server:
        server.app = app
        yield server


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=TIMEOUT)


def reference(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits in float32 at every position: (T, vocab); row t scores token t + 1."""
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([ids])))[0]                  # (T, vocab)
    return logits.float().log_softmax(-1)


def scored(model, ids: list[int], start: int) -> list[float]:
    """The log-probability of each of ids[start:], given the tokens before it."""
    ref = reference(model, ids)
    return [float(ref[t - 1, ids[t]]) for t in range(start, len(ids))]


def chat_prompt_ids(server, messages) -> list[int]:
    return post(server, "/tokenize", {"messages": messages}).json()["tokens"]


def assert_close(got, want):
    assert len(got) == len(want) and all(abs(g - w) <= ATOL for g, w in zip(got, want)), (got, want)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_are_the_models_own(served, model, stream):
    messages = [{"role": "user", "content": "Score me"}]
    kwargs = dict(model=NAME, messages=messages, max_tokens=6, temperature=0.7, seed=5, logprobs=True,
                  top_logprobs=3, extra_body={"return_token_ids": True, "ignore_eos": True})
    api = client(served)
    if stream:
        chunks = [c for c in api.chat.completions.create(stream=True, **kwargs) if c.choices]
        entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        ids = [t for c in chunks for t in (getattr(c.choices[0], "token_ids", None) or [])]
    else:
        out = api.chat.completions.create(**kwargs)
        entries, ids = out.choices[0].logprobs.content, out.choices[0].token_ids
    prompt = chat_prompt_ids(served, messages)
    assert len(entries) == len(ids) == 6
    assert_close([e.logprob for e in entries], scored(model, prompt + ids, len(prompt)))
    ref = reference(model, prompt + ids)
    for t, entry in enumerate(entries):
        best = ref[len(prompt) + t - 1].topk(3)
        assert_close([a.logprob for a in entry.top_logprobs], best.values.tolist())
        assert entry.bytes == list(entry.token.encode("utf-8"))


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_legacy_shape_sampled_tokens(served, model, stream):
    kwargs = dict(model=NAME, prompt="Hello", max_tokens=8, temperature=1.0, top_p=0.9, seed=3, logprobs=2,
                  extra_body={"return_token_ids": True, "ignore_eos": True})
    api = client(served)
    if stream:
        chunks = [c for c in api.completions.create(stream=True, **kwargs) if c.choices]
        lps = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        values = [v for lp in lps for v in lp.token_logprobs]
        tops = [d for lp in lps for d in lp.top_logprobs]
        offsets = [o for lp in lps for o in lp.text_offset]
        ids = [t for c in chunks for t in c.choices[0].token_ids]
    else:
        out = api.completions.create(**kwargs)
        lp, ids = out.choices[0].logprobs, out.choices[0].token_ids
        values, tops, offsets = lp.token_logprobs, lp.top_logprobs, lp.text_offset
    prompt = ByteTokenizer().encode("Hello")
    assert_close(values, scored(model, prompt + ids, len(prompt)))     # the raw model's, not at T or top-p
    assert offsets == sorted(offsets) and offsets[0] == 0
    ref = reference(model, prompt + ids)
    for t, top in enumerate(tops):
        assert 1 <= len(top) <= 3 and abs(max(top.values()) - float(ref[len(prompt) + t - 1].max())) <= ATOL


def test_echo_gives_the_prompts_logprobs_first_null(served, model):
    for max_tokens in (0, 2):
        out = client(served).completions.create(model=NAME, prompt="Echo this", max_tokens=max_tokens, echo=True,
                                                logprobs=1, temperature=0)
        choice = out.choices[0]
        prompt = ByteTokenizer().encode("Echo this")
        assert choice.text.startswith("Echo this") and out.usage.completion_tokens == max_tokens
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(prompt) + max_tokens and lp.text_offset[: len(prompt)] == list(range(len(prompt)))
        assert_close(lp.token_logprobs[1: len(prompt)], scored(model, prompt, 1))
        if max_tokens == 0:
            assert choice.text == "Echo this" and choice.finish_reason == "length"


def test_echo_streamed_starts_with_the_prompt(served, model):
    chunks = list(client(served).completions.create(model=NAME, prompt="Streamed", max_tokens=3, echo=True,
                                                    logprobs=0, temperature=0, stream=True))
    first = chunks[0].choices[0]
    prompt = ByteTokenizer().encode("Streamed")
    assert first.text == "Streamed" and first.logprobs.token_logprobs[0] is None
    assert_close(first.logprobs.token_logprobs[1:], scored(model, prompt, 1))
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks[1:]) == 3


def test_lm_eval_harness_request_scores_as_in_process(served, model):
    """lm-evaluation-harness `local-completions` loglikelihood payload, parsed as it parses it."""
    tok = ByteTokenizer()
    context = tok.encode("Question: 2+2? Answer:")
    options = [tok.encode(" four"), tok.encode(" five"), tok.encode(" seven")]
    for max_tokens in (1, 0):
        payload = {"model": NAME, "prompt": [context + o for o in options], "temperature": 0,
                   "max_tokens": max_tokens, "logprobs": 1, "seed": 1234, "echo": True}
        reply = post(served, "/v1/completions", payload)
        assert reply.status_code == 200, reply.text
        out = reply.json()
        assert [c["index"] for c in out["choices"]] == [0, 1, 2]
        for choice, option in zip(sorted(out["choices"], key=lambda c: c["index"]), options):
            values = choice["logprobs"]["token_logprobs"]
            end = len(values) - max_tokens                       # lm-eval drops the generated token ([ctxlen:-1])
            got = sum(values[len(context): end])
            want = sum(scored(model, context + option, len(context)))
            assert abs(got - want) <= ATOL
            tops = choice["logprobs"]["top_logprobs"][len(context): end]
            greedy = all(v == max(top.values()) for v, top in zip(values[len(context): end], tops))
            ref = reference(model, context + option)
            want_greedy = all(int(ref[t - 1].argmax()) == (context + option)[t]
                              for t in range(len(context), len(context) + len(option)))
            assert greedy == want_greedy
        assert out["usage"]["prompt_tokens"] == sum(len(context + o) for o in options)
        assert out["usage"]["completion_tokens"] == 3 * max_tokens


def test_several_prompts_and_n_with_distinct_seeds(served, model):
    api = client(served)
    out = api.completions.create(model=NAME, prompt=["one", "two"], n=3, max_tokens=5, temperature=1.0, seed=40,
                                 extra_body={"return_token_ids": True, "ignore_eos": True})
    assert [c.index for c in out.choices] == list(range(6))
    for c in out.choices:
        prompt, draw = ["one", "two"][c.index // 3], c.index % 3
        alone = api.completions.create(model=NAME, prompt=prompt, max_tokens=5, temperature=1.0, seed=40 + draw,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
        assert c.token_ids == alone.choices[0].token_ids
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens == 30
    chunks = list(api.completions.create(model=NAME, prompt=[[10, 11], [12]], n=2, max_tokens=4, temperature=0,
                                         stream=True, stream_options={"include_usage": True},
                                         extra_body={"ignore_eos": True}))
    texts = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert sorted(texts) == [0, 1, 2, 3] and texts[0] == texts[1] and texts[2] == texts[3]
    assert chunks[-1].usage.prompt_tokens == 3 and chunks[-1].usage.completion_tokens == 16
    reply = post(served, "/v1/completions", {"model": NAME, "prompt": "null n", "n": None, "max_tokens": 2})
    assert reply.status_code == 200 and len(reply.json()["choices"]) == 1


BAD = [  # path, body, param, words
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "from 0 to 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs", "from 0 to 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs", "number of alternatives"),
    ("/v1/completions", {"prompt": "x", "n": 200}, "n", "from 1 to 128"),
    ("/v1/completions", {"prompt": "x", "n": 20}, "n", "at most 11"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of", "leave best_of out"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "only with echo"),
    ("/v1/completions", {"prompt": ["x", ""]}, "prompt", "empty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     "top_logprobs", "needs logprobs: true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs", "from 0 to 20"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs",
     "true or false"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo", "does not echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens",
     "only with echo"),
]


@pytest.mark.parametrize("path, body, param, words", BAD)
def test_bad_values_are_a_400_in_one_sentence_and_the_server_serves_after(served, model, path, body, param, words):
    reply = post(served, path, dict(body, model=NAME))
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == param and words in error["message"], error
    assert error["message"].endswith(".") and "\n" not in error["message"]
    out = post(served, "/v1/completions", {"model": NAME, "prompt": "after", "max_tokens": 3, "temperature": 0,
                                           "logprobs": 0, "return_token_ids": True}).json()
    assert_close(out["choices"][0]["logprobs"]["token_logprobs"],
                 scored(model, ByteTokenizer().encode("after") + out["choices"][0]["token_ids"], 5))
    assert json.dumps(out)


def test_the_engine_records_logprobs_only_for_requests_that_ask(model):
    from labsupport.engine.sampling import SamplingConfig
    from labsupport.engine.serving.engine import Engine
    from labsupport.engine.serving.request import Request
    from labsupport.errors import LabError
    asks = Request([1, 2, 3], max_new_tokens=5, request_id="asks", logprobs=2, sampling=SamplingConfig(1.0, seed=2))
    quiet = Request([4, 5], max_new_tokens=5, request_id="quiet")
    for budget in (None, 4):                                  # whole prompts, and chunked prefill beside decodes
        result = Engine(model, max_slots=2, block_size=4, token_budget=budget).run([asks, quiet], clock="steps")
        seqs = {s.id: s for s in result.sequences}
        assert seqs["quiet"].logprobs == [] and len(seqs["asks"].logprobs) == 5
        assert_close([e.logprob for e in seqs["asks"].logprobs], scored(model, seqs["asks"].tokens, 3))
        assert all(len(e.top) == 2 for e in seqs["asks"].logprobs)
    with pytest.raises(LabError, match="logprobs"):
        Request([1], logprobs=21)


def _wait_idle(app, timeout=TIMEOUT):
    import time
    deadline = time.monotonic() + timeout
    while app.state.engine.has_work or not app.state.engine_thread.inbox.empty() or app.state.server.in_flight:
        assert time.monotonic() < deadline, "the engine is stuck with work"
        time.sleep(0.01)
    time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_one_failing_choice_ends_the_request_and_frees_every_choice(served, model, monkeypatch, stream):
    from labsupport.engine.serving import engine as engine_module
    real, marker = engine_module.next_token, ByteTokenizer().encode("boom")

    def patched(logits, seq):
        if seq.request.prompt[:4] == marker and len(seq.output) >= 2:
            raise RuntimeError("a bug in the sampler")
        return real(logits, seq)
    monkeypatch.setattr(engine_module, "next_token", patched)
    body = {"model": NAME, "prompt": ["fine", "boom here"], "max_tokens": 30, "temperature": 1.0, "seed": 1,
            "ignore_eos": True, "stream": stream, "logprobs": 1}
    reply = post(served, "/v1/completions", body)
    if stream:
        events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
        assert "a bug in the sampler" in events[-1]["error"]["message"]
    else:
        assert reply.status_code == 500 and "a bug in the sampler" in reply.json()["error"]["message"]
    monkeypatch.undo()
    _wait_idle(served.app)
    served.app.state.engine.blocks.assert_no_leaks()
    assert httpx.get(served.url + "/health", timeout=TIMEOUT).status_code == 200
    out = post(served, "/v1/completions", {"model": NAME, "prompt": "after", "max_tokens": 3}).json()
    assert out["usage"]["completion_tokens"] == 3
