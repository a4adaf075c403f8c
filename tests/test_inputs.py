"""Bad input at the public API: one sentence each, never a traceback, a hang or wrong output.

Every case below went through `labsupport.inputs`, the one place where `generate`,
`generate_naive`, speculative decoding, `SamplingConfig` and the serving engine check
what they are given.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from labsupport.errors import LabError
from labsupport.engine.generation import generate, generate_naive
from labsupport.inputs import finite_number, token_rows, whole_number
from labsupport.weights.fixtures import random_model
from labsupport.engine.sampling import SamplingConfig
from labsupport.engine.speculative import PromptLookupDraft, speculative_generate

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def model():
    return random_model("tiny-llama")                  # vocabulary 260, context 256


def one_sentence(error: LabError) -> str:
    message = str(error)
    assert "\n" not in message and message.endswith("."), message
    return message


@pytest.mark.parametrize("call, words", [
    # a learner's most likely mistake: text where ids are expected
    (lambda m: generate(m, "hello"), "is text; give token ids instead, e.g. tokenizer.encode"),
    (lambda m: generate(m, ["hello", "world"]), "holds text at position 0"),
    (lambda m: generate_naive(m, "hello"), "is text"),
    # ids outside the vocabulary, both ways, in every entry point
    (lambda m: generate(m, [1, 2, 260]), "token id 260, outside the model's vocabulary \\[0, 260\\)"),
    (lambda m: generate(m, [1, -1]), "token id -1, outside"),
    (lambda m: generate(m, [[1, 2], [3, 999]]), "prompt 1 of the batch holds token id 999"),
    (lambda m: generate(m, torch.tensor([[1, 2], [3, 300]])), "token id 300"),
    (lambda m: generate_naive(m, [5, 10**9]), "outside the model's vocabulary"),
    # values that are not token ids at all
    (lambda m: generate(m, [1.0, 2.0]), "token ids are whole numbers"),
    (lambda m: generate(m, torch.tensor([1.0, 2.0])), "holds torch.float32 values"),
    (lambda m: generate(m, np.array([1.5])), "holds float64 values"),
    (lambda m: generate(m, [True, False]), "token ids are whole numbers"),
    (lambda m: generate(m, torch.zeros(1, 2, 3, dtype=torch.long)), "got 3 dimensions"),
    (lambda m: generate(m, []), "is empty"),
    (lambda m: generate(m, [[1, 2], []]), "prompt 1 of the batch is empty"),
    # sizes
    (lambda m: generate(m, [1], max_new_tokens=2.5), "max_new_tokens must be a whole number"),
    (lambda m: generate(m, [1], max_new_tokens=NAN), "max_new_tokens must be a whole number"),
    (lambda m: generate(m, [1], max_new_tokens="3"), "max_new_tokens must be a whole number"),
    (lambda m: generate(m, [1], max_new_tokens=True), "max_new_tokens must be a whole number"),
    (lambda m: generate(m, [1], max_new_tokens=0), "max_new_tokens must be at least 1, got 0"),
    (lambda m: generate(m, [1], max_new_tokens=-3), "at least 1, got -3"),
    (lambda m: generate(m, [1] * 250, max_new_tokens=10), "model's context holds 256"),
    (lambda m: generate_naive(m, [1], max_new_tokens=1.5), "whole number"),
    (lambda m: generate_naive(m, [[1, 2], [3]]), "prompts of equal length"),
    # end-of-sequence ids and the sampling settings
    (lambda m: generate(m, [1], eos_token_ids=2), "eos_token_ids must be a list"),
    (lambda m: generate(m, [1], eos_token_ids=["x"]), "each of eos_token_ids must be a whole number"),
    (lambda m: generate(m, [1], sampling={"temperature": 0.8}), "sampling must be a SamplingConfig"),
])
def test_bad_generation_input_is_one_sentence(model, call, words):
    with pytest.raises(LabError, match=words) as info:
        call(model)
    one_sentence(info.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"temperature": NAN}, "temperature .* must be finite and >= 0, got nan"),
    ({"temperature": INF}, "temperature .* got inf"),
    ({"temperature": -0.5}, "temperature .* got -0.5"),
    ({"temperature": "hot"}, "temperature .* must be a number"),
    ({"top_k": 2.5}, "top_k .* must be a whole number"),
    ({"top_k": 0}, "top_k .* at least 1"),
    ({"top_p": NAN}, "top_p .* got nan"),
    ({"top_p": 0.0}, "top_p .* > 0"),
    ({"top_p": 1.5}, "top_p .* <= 1"),
    ({"seed": 1.5}, "seed .* whole number"),
    ({"seed": -1}, "seed .* at least 0"),
])
def test_bad_sampling_settings_are_one_sentence(kwargs, words):
    with pytest.raises(LabError, match=words) as info:
        SamplingConfig(**kwargs)
    one_sentence(info.value)


def test_good_input_in_every_accepted_form_gives_the_same_tokens(model):
    ids = [5, 6, 7, 8]
    expected = generate(model, ids, 4).tokens
    for form in (tuple(ids), torch.tensor(ids), torch.tensor([ids]), np.array(ids), [np.int64(i) for i in ids]):
        assert torch.equal(generate(model, form, 4).tokens, expected)
    assert torch.equal(generate(model, ids, np.int64(4)).tokens, expected)
    assert torch.equal(generate_naive(model, torch.tensor(ids), 4).tokens, expected)


def test_a_padded_batch_pads_with_an_id_the_embedding_has(model):
    """Small checkpoints often give an end-of-sequence id outside their vocabulary; padding
    with it used to crash in the embedding. Now padding uses an id inside the vocabulary,
    and the padded rows still equal each prompt alone."""
    odd = random_model(dataclasses.replace(model.config, eos_token_ids=(10_000,)))
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    batch = generate(odd, prompts, 3)
    for row, prompt in enumerate(prompts):
        assert batch.row(row) == generate(odd, prompt, 3).row(0)


def test_the_checkers_themselves():
    assert whole_number(np.int32(3), "n") == 3 and whole_number(torch.tensor(4), "n") == 4
    assert finite_number(0.5, "p", minimum=0, maximum=1) == 0.5
    assert math.isclose(finite_number(np.float32(0.25), "p"), 0.25)
    with pytest.raises(LabError, match="must be from 1 to 3"):
        whole_number(4, "n", maximum=3)
    with pytest.raises(LabError, match="finite and > 0 and <= 1"):
        finite_number(0, "p", minimum=0, maximum=1, above_minimum=True)
    assert token_rows(torch.tensor([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert token_rows([[1], (2, 3)], vocab_size=4) == [[1], [2, 3]]


@pytest.mark.parametrize("call, words", [
    (lambda m, d: speculative_generate(m, d, "hello"), "is text; give token ids"),
    (lambda m, d: speculative_generate(m, d, [1, 260]), "token id 260, outside"),
    (lambda m, d: speculative_generate(m, d, [1, -2]), "token id -2, outside"),
    (lambda m, d: speculative_generate(m, d, [[1, 2], [3, 4]]), "one prompt at a time"),
    (lambda m, d: speculative_generate(m, d, [1], k=1.5), "k .* must be a whole number"),
    (lambda m, d: speculative_generate(m, d, [1], k=-1), "k .* must be at least 0"),
    (lambda m, d: speculative_generate(m, d, [1], max_new_tokens=2.5), "max_new_tokens must be a whole number"),
    (lambda m, d: speculative_generate(m, d, [1], sampling=0.8), "sampling must be a SamplingConfig"),
    (lambda m, d: speculative_generate(m, d, [1], eos_token_ids=3), "eos_token_ids must be a list"),
])
def test_bad_speculative_input_is_one_sentence(model, call, words):
    draft = PromptLookupDraft()
    with pytest.raises(LabError, match=words) as info:
        call(model, draft)
    one_sentence(info.value)


def test_every_entrance_checks_sampling_with_the_one_check_and_seeds_with_the_one_rule(model):
    """Issue 39: one sampling check (`sampling.require_sampling`) at generate, speculative_generate,
    Request and a draft's start; one seeding rule (`SamplingConfig.generator`) for them all."""
    from labsupport.engine.drafts import ModelDraft
    from labsupport.engine.serving import Request
    calls = {"generate": lambda: generate(model, [1, 2], 2, sampling=0.7),
             "speculative_generate": lambda: speculative_generate(model, PromptLookupDraft(), [1, 2], 2, sampling=0.7),
             "Request": lambda: Request([1, 2], sampling=0.7),
             "a draft's start": lambda: ModelDraft(model).start([1, 2], 8, None, sampling=0.7)}
    for where, call in calls.items():
        with pytest.raises(LabError, match=r"must be a SamplingConfig \(e\.g\. SamplingConfig\(temperature=0\.8, "
                                           r"seed=0\)\), got float\.") as error:
            call()
        one_sentence(error.value)
    hot = SamplingConfig(temperature=1.0, seed=7)
    runs = [speculative_generate(model, PromptLookupDraft(), [1, 2, 1, 2], 12, sampling=hot).tokens
            for _ in range(2)]
    assert runs[0] == runs[1]                                  # a seed: the same stream every time
    unseeded = speculative_generate(model, PromptLookupDraft(), [1, 2, 1, 2], 12,
                                    sampling=SamplingConfig(temperature=1.0, seed=None))
    assert len(unseeded.tokens) >= 1                           # no seed: allowed, drawn from torch's own stream


@pytest.mark.parametrize("call, words", [
    (lambda: finite_number(10 ** 400, "rate"), "rate must be a finite number, got an integer of 1329 bits"),
    (lambda: finite_number(-10 ** 400, "rate", minimum=0), "rate must be a finite number"),
    (lambda: token_rows(None), "must be token ids"),
    (lambda: token_rows(3), "must be token ids"),
])
def test_values_past_float_and_no_ids_at_all_are_one_sentence(call, words):
    """An int too large for a float, and a prompt that is not a sequence at all (issue 50)."""
    with pytest.raises(LabError, match=words) as error:
        call()
    assert "\n" not in str(error.value)


def test_a_whole_number_past_python_s_printing_limit_is_one_sentence():
    """str() of an int over 4,300 digits raises ValueError in Python >= 3.11: the sentence must not print it."""
    with pytest.raises(LabError, match="count must be from 1 to 8, got an integer of 16610 bits"):
        whole_number(10 ** 5000, "count", maximum=8)
