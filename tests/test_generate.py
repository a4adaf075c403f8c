"""Generation: the cache changes nothing but the speed; sampling is reproducible."""

import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import decode_step, generate, generate_naive, prefill
from labsupport.serve.text import TextStreamer, generate_text
from labsupport.weights.chat import chat_prompt
from labsupport.engine.kv_cache import KVCache, KVWriter, StaticKVCache, kv_cache_bytes
from labsupport.engine.sampling import SamplingConfig, probabilities, sample

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def test_cached_and_uncached_generation_agree(tiny_model):
    cached = generate(tiny_model, PROMPT, 40, eos_token_ids=(), return_logits=True)
    naive = generate_naive(tiny_model, PROMPT, 40, eos_token_ids=(), return_logits=True)
    assert cached.tokens.tolist() == naive.tokens.tolist()
    for a, b in zip(cached.logits, naive.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_prefill_then_decode_equals_one_full_forward(tiny_model):
    tokens = torch.tensor([PROMPT])
    cache = StaticKVCache(tiny_model.config, 1, 32)
    prefill(tiny_model, tokens[:, :4], cache)
    steps = [decode_step(tiny_model, cache, tokens[:, i]) for i in range(4, len(PROMPT))]
    with torch.no_grad():
        full = tiny_model.logits(tiny_model(tokens))[0, 4:]
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    assert cache.length == len(PROMPT)


def test_cache_memory_formula_equals_allocation(tiny_model):
    cache = StaticKVCache(tiny_model.config, batch_size=3, max_len=50)
    assert cache.nbytes == kv_cache_bytes(tiny_model.config, length=50, batch_size=3)


def test_the_static_cache_implements_the_protocol(tiny_model):
    cache = StaticKVCache(tiny_model.config, 1, 8)
    assert isinstance(cache, KVCache) and cache.fixed_shape_writes
    writer = cache.reserve(1, fixed_shape=True)                     # one fixed-shape pass: update only
    assert isinstance(writer, KVWriter) and not isinstance(writer, KVCache) and cache.length == 1
    assert isinstance(cache.reserve(2), KVWriter) and cache.length == 3
    assert not isinstance(object(), KVWriter)


def test_generate_uses_a_cache_passed_in(tiny_model):
    for prompt, batch in ((PROMPT, 1), ([PROMPT, [9, 8, 7]], 2)):       # plain, and left-padded
        expected = generate(tiny_model, prompt, 12, eos_token_ids=(), return_logits=True)
        exact = StaticKVCache(tiny_model.config, batch, len(PROMPT) + 12)
        same = generate(tiny_model, prompt, 12, eos_token_ids=(), return_logits=True, cache=exact)
        assert same.tokens.tolist() == expected.tokens.tolist()
        assert all(torch.equal(a, b) for a, b in zip(same.logits, expected.logits))
        assert exact.length == len(PROMPT) + 11                         # the prompt and 11 decode steps
        longer = StaticKVCache(tiny_model.config, batch, len(PROMPT) + 20)
        assert generate(tiny_model, prompt, 12, eos_token_ids=(), cache=longer).tokens.tolist() == \
            expected.tokens.tolist()


def test_a_cache_that_does_not_fit_is_refused_in_one_sentence(tiny_model):
    needed = len(PROMPT) + 8
    used = StaticKVCache(tiny_model.config, 1, needed)
    used.reserve(2)
    refused = {"2 rows": StaticKVCache(tiny_model.config, 2, needed),
               "needs 15": StaticKVCache(tiny_model.config, 1, needed - 1),
               "already holds 2": used,
               "must be a KV cache": object(),
               "float64": StaticKVCache(tiny_model.config, 1, needed, dtype=torch.float64),
               "3 layers of 4 key/value heads": StaticKVCache(tiny_model.config.with_(
                   num_layers=3, num_kv_heads=tiny_model.config.num_heads), 1, needed)}
    for words, cache in refused.items():
        with pytest.raises(LabError, match=words) as error:
            generate(tiny_model, PROMPT, 8, cache=cache)
        message = str(error.value)
        assert "\n" not in message and ". " not in message and message.endswith("."), message


def test_sampling_is_reproducible_with_a_seed(tiny_model):
    s = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, seed=7)
    a = generate(tiny_model, PROMPT, 20, s, eos_token_ids=())
    b = generate(tiny_model, PROMPT, 20, s, eos_token_ids=())
    c = generate(tiny_model, PROMPT, 20, SamplingConfig(temperature=1.0, seed=8), eos_token_ids=())
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.tokens.tolist() != c.tokens.tolist()
    # sampling with a seed gives the same tokens with and without the cache
    assert generate_naive(tiny_model, PROMPT, 20, s, eos_token_ids=()).tokens.tolist() == a.tokens.tolist()


def test_top_k_and_top_p_filter_the_distribution():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    full = probabilities(logits, SamplingConfig(temperature=1.0))
    p = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    kept = (p[0] > 0).sum().item()
    assert full[0, :kept].sum() >= 0.8 > full[0, : kept - 1].sum()
    assert sample(logits, SamplingConfig(temperature=1.0, top_k=1)).item() == 0


def test_stops_at_end_of_sequence_and_at_max_new_tokens(tiny_model):
    first = generate(tiny_model, PROMPT, 5, eos_token_ids=()).tokens[0, 0].item()
    stopped = generate(tiny_model, PROMPT, 30, eos_token_ids=(first,))
    assert stopped.new_token_counts == [1] and stopped.tokens.shape == (1, 1)
    assert generate(tiny_model, PROMPT, 9, eos_token_ids=()).tokens.shape == (1, 9)


def test_finished_rows_stop_counting(tiny_model):
    prompts = torch.tensor([PROMPT, PROMPT[::-1]])
    alone = [generate(tiny_model, [p], 12, eos_token_ids=()).row(0) for p in prompts.tolist()]
    eos = alone[0][3]                                     # row 0 ends by its 4th token
    batched = generate(tiny_model, prompts, 12, eos_token_ids=(eos,))
    assert batched.row(0) == alone[0][: alone[0].index(eos) + 1]
    assert batched.new_token_counts[0] <= 4
    expected_1 = alone[1][: alone[1].index(eos) + 1] if eos in alone[1] else alone[1]
    assert batched.row(1) == expected_1


def test_streaming_callback_sees_every_token(tiny_model):
    seen = []
    result = generate(tiny_model, PROMPT, 10, eos_token_ids=(), stream=lambda t: seen.append(t.item()))
    assert seen == result.row(0)


def test_bad_lengths_get_one_sentence(tiny_model):
    with pytest.raises(LabError, match="max_new_tokens must be at least 1"):
        generate(tiny_model, PROMPT, 0)
    with pytest.raises(LabError, match="context holds 256 tokens"):
        generate(tiny_model, list(range(250)), 10)
    with pytest.raises(LabError, match="prompt is empty"):
        generate(tiny_model, [], 10)


@pytest.mark.slow
def test_embedded_greedy_equals_hugging_face_generate(smollm, smollm_hf):
    model, tok = smollm
    ids = tok.encode(chat_prompt(tok, "Name three colours."))
    ours = generate(model, ids, 24)
    with torch.inference_mode():
        theirs = smollm_hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    assert ours.row(0) == theirs[0, len(ids):].tolist()


@pytest.mark.slow
def test_embedded_cached_logits_equal_uncached(smollm):
    model, tok = smollm
    ids = tok.encode("Once upon a time")
    cached = generate(model, ids, 12, eos_token_ids=(), return_logits=True)
    naive = generate_naive(model, ids, 12, eos_token_ids=(), return_logits=True)
    assert cached.tokens.tolist() == naive.tokens.tolist()
    for a, b in zip(cached.logits, naive.logits):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)


@pytest.mark.slow
def test_chat_reply_streams_text(smollm, capsys):
    model, tok = smollm
    text = generate_text(model, tok, "What is 2 + 2? Answer with one number.", max_new_tokens=8, stream=True)
    assert "4" in text
    assert capsys.readouterr().out.strip() == text.strip()


def test_fixed_shape_decode_step_equals_the_plain_one(tiny_model):
    """The fixed-shape step (what torch.compile and CUDA graphs run), eagerly: the same tokens."""
    from labsupport.engine.compiled import fixed_shape_step
    plain = generate(tiny_model, PROMPT, 16, eos_token_ids=())
    cache = StaticKVCache(tiny_model.config, 1, len(PROMPT) + 16)
    logits = prefill(tiny_model, torch.tensor([PROMPT]), cache)
    tokens, key_mask = [], torch.ones(1, cache.max_len, dtype=torch.bool)
    with torch.inference_mode():
        for _ in range(16):
            next_token = logits.argmax(-1)
            tokens.append(next_token.item())
            position = torch.full((1, 1), cache.length)
            logits = fixed_shape_step(tiny_model, next_token[:, None], position, cache.reserve(1, fixed_shape=True),
                                      key_mask)
    assert tokens == plain.row(0) and cache.length == len(PROMPT) + 16


def test_every_row_of_a_padded_batch_equals_the_prompt_alone(tiny_model):
    prompts = [PROMPT, [9, 8], list(range(30, 52)), [200, 100, 50, 25]]
    alone = [generate(tiny_model, p, 15, eos_token_ids=()).row(0) for p in prompts]
    batched = generate(tiny_model, prompts, 15, eos_token_ids=())
    assert [batched.row(i) for i in range(len(prompts))] == alone


def test_padded_batch_masks_and_positions():
    from labsupport.engine.padding import left_pad, padding_waste
    from labsupport.lab.batching import sorted_batches
    batch = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert batch.tokens.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert batch.attention_mask.tolist() == [[True, True, True], [False, False, True]]
    assert batch.positions[1, -1].item() == 0 and batch.positions[0].tolist() == [0, 1, 2]
    assert padding_waste([3, 1]) == pytest.approx(1 / 3)
    assert sorted_batches([[1], [1, 2, 3], [1, 2]], 2) == [[1, 2], [0]]


@pytest.mark.slow
def test_embedded_padded_batch_rows_equal_each_prompt_alone(smollm):
    model, tok = smollm
    questions = ["Name three colours.", "What is the capital of France? Answer in one word.",
                 "Write a haiku about the sea, the wind and the moon over the water.", "Hi"]
    prompts = [tok.encode(chat_prompt(tok, q)) for q in questions]
    alone = [generate(model, p, 20).row(0) for p in prompts]
    batched = generate(model, prompts, 20)
    assert [batched.row(i) for i in range(len(prompts))] == alone


def test_compile_none_compiles_on_a_gpu_only_and_the_default_never_does():
    from simulated_gpu import GPUS, simulated

    from labsupport.engine.generation import AUTO_COMPILE_MIN_TOKENS, compile_by_default
    assert not compile_by_default("cpu", 1000)
    with simulated(GPUS["T4"]):
        assert compile_by_default("cuda", AUTO_COMPILE_MIN_TOKENS)
        assert not compile_by_default("cuda", AUTO_COMPILE_MIN_TOKENS - 1)     # too short to pay back
    import inspect
    assert inspect.signature(generate).parameters["compile"].default is False    # eager unless asked: like for like


def test_checking_for_the_end_every_few_steps_gives_the_same_result(monkeypatch):
    """On a GPU `generate` asks whether every row has ended only every few steps (each question
    stalls the GPU); the extra steps are cut off, so the result is the same."""
    from labsupport.engine import generation
    from labsupport.weights.fixtures import lively_model
    model = lively_model("tiny-llama", seed=3)              # weights scaled up: varied tokens
    prompts = [PROMPT, [9, 8, 7]]
    free = generate(model, prompts, 20, eos_token_ids=())
    ends = [free.row(0)[4], free.row(1)[8]]                 # row 0 ends at step 5, row 1 at step 9
    every_step = generate(model, prompts, 20, eos_token_ids=ends, return_logits=True)
    assert every_step.new_token_counts == [5, 9]
    monkeypatch.setitem(generation.EOS_CHECK_EVERY, "cpu", 6)     # checks after steps 6 and 12
    sparse = generate(model, prompts, 20, eos_token_ids=ends, return_logits=True)
    assert sparse.tokens.tolist() == every_step.tokens.tolist()
    assert sparse.new_token_counts == every_step.new_token_counts
    assert len(sparse.logits) == len(every_step.logits) == 9


class HalfCharacters:
    """A tokenizer whose token 1 is the first half of "é" and token 2 the second half."""
    def decode(self, ids, skip_special_tokens=True):
        text = ""
        for i, token in enumerate(ids):
            if token == 2 and i and ids[i - 1] == 1:
                text = text[:-1] + "é"
            else:
                text += {0: "a", 1: "\ufffd", 2: "\ufffd"}[token]
        return text


def test_the_streamer_prints_a_character_split_over_two_tokens_once_whole():
    printed = []
    streamer = TextStreamer(HalfCharacters(), print_fn=printed.append)
    for token in (0, 1, 2, 0):
        streamer(torch.tensor([token]))
    assert printed == ["a", "é", "a"]
