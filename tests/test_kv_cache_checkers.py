"""Notebook 01's checkers (labsupport/checks/kv_cache.py): their inputs tell every listed slip apart.
(The accepted and refused answers themselves are in tests/checker_cases/nb01_kv_cache.py.)"""

import pytest
import torch

from labsupport.checks.kv_cache import (FIT_CASES, FIT_MISTAKES, SIZE_CASES, SIZE_MISTAKES, CountingModel,
                                        check_cached_generation, tiny_test_model)
from labsupport.engine.generation import generate
from labsupport.engine.kv_cache import kv_cache_bytes

BYTES = {4: torch.float32, 2: torch.float16, 1: torch.int8}


def test_every_size_slip_gives_its_own_answers_and_none_is_right():
    right = [kv_cache_bytes(c, n, b, BYTES[by]) for c, n, b, by in SIZE_CASES]
    answers = [[formula(*case) for case in SIZE_CASES] for formula, _ in SIZE_MISTAKES]
    assert all(a != right for a in answers)
    assert len({tuple(a) for a in answers}) == len(SIZE_MISTAKES), "two slips give the same answers"
    assert len({hint for _, hint in SIZE_MISTAKES}) == len(SIZE_MISTAKES)


def test_every_fit_slip_gives_its_own_answers_and_none_is_right():
    right = [m // kv_cache_bytes(c, 1, b, BYTES[by]) for c, m, b, by in FIT_CASES]
    answers = [[formula(*case) for case in FIT_CASES] for formula, _ in FIT_MISTAKES]
    assert all(a != right for a in answers)
    assert len({tuple(a) for a in answers}) == len(FIT_MISTAKES), "two slips give the same answers"


def test_the_test_models_depend_on_their_context():
    """A tiny random model with small weights repeats one token; the checkers' models must not."""
    for name in ("tiny-llama", "tiny-gpt2"):
        model = tiny_test_model(name)
        assert model.dtype == torch.float64
        rows = [generate(model, prompt, 6, eos_token_ids=()).row(0) for prompt in ([7, 3, 9], [7, 3, 10])]
        assert rows[0] != rows[1] and len(set(rows[0])) > 1, rows


def test_the_counting_model_records_every_pass_and_is_the_model_otherwise(tiny_llama):
    counting = CountingModel(tiny_llama)
    assert counting.config is tiny_llama.config and counting.device == tiny_llama.device
    counting(torch.tensor([[1, 2, 3]]))
    counting.forward(torch.tensor([[4]]), positions=torch.tensor([[3]]))
    assert [c["tokens"] for c in counting.calls] == [3, 1] and counting.calls[1]["positions"] is not None


def test_the_cached_loop_is_also_checked_on_the_notebooks_model(tiny_gpt2, capsys):
    from checker_cases.nb01_kv_cache import cached_loop, without_cache

    check_cached_generation(cached_loop, tiny_gpt2, [3, 4, 5], new_tokens=3)
    assert "tiny-gpt2, tiny-gpt2" in capsys.readouterr().out           # the notebook's model is named too
    with pytest.raises(Exception, match="cache is not used"):
        check_cached_generation(without_cache, tiny_gpt2, [3, 4, 5], new_tokens=3)


def test_an_unanswered_exercise_shows_the_stubs_own_message():
    """A student version's stub raises NotImplementedError: the checker lets it through, unchanged."""
    from labsupport.checks.kv_cache import check_cache_size, check_cache_update, check_tokens_that_fit

    def stub(*args):
        raise NotImplementedError("Exercise: replace this line with your solution")

    for checker in (check_cache_update, check_cached_generation, check_cache_size, check_tokens_that_fit):
        with pytest.raises(NotImplementedError, match="Exercise"):
            checker(stub)
