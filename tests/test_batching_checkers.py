"""Notebook 02's checkers (labsupport/checks/batching.py): their inputs tell every listed slip apart.
(The accepted and refused answers themselves are in tests/checker_cases/nb02_batching.py.)"""

import pytest

from labsupport.lab.batching import combined_waste
from labsupport.checks import CheckFailed
from labsupport.checks.batching import (GENERATION_CASES, NEW_TOKENS, SLIPS, WASTE_CASES, WASTE_MISTAKES,
                                        check_batched_generation, slipped_rows)
from labsupport.checks.kv_cache import tiny_test_model
from labsupport.engine.generation import generate


def test_every_waste_slip_gives_its_own_answers_and_none_is_right():
    right = [combined_waste([ls[i:i + g] for i in range(0, len(ls), g)]) for ls, g in WASTE_CASES]
    answers = [[round(formula(list(ls), g), 9) for ls, g in WASTE_CASES] for formula, _ in WASTE_MISTAKES]
    assert all(a != [round(r, 9) for r in right] for a in answers)
    assert len({tuple(a) for a in answers}) == len(WASTE_MISTAKES)


@pytest.mark.parametrize("name, end_id, prompts", GENERATION_CASES, ids=[c[0] for c in GENERATION_CASES])
def test_the_generation_cases_have_what_the_slips_need(name, end_id, prompts):
    model = tiny_test_model(name)
    alone = [generate(model, p, NEW_TOKENS, eos_token_ids=[end_id]).row(0) for p in prompts]
    longest = max(map(len, prompts))
    early = [i for i, row in enumerate(alone) if len(row) < NEW_TOKENS]
    assert early and all(len(prompts[i]) < longest for i in early), "a padded row must end early"
    assert any(len(row) == NEW_TOKENS for row in alone), "and another must run on"
    holder = next(p for p in prompts if len(p) == longest)
    assert end_id in holder[:-1], "the end id must occur inside the longest prompt"
    assert slipped_rows(model, prompts, NEW_TOKENS, end_id) == alone     # no slip: each prompt alone


def test_every_slip_changes_the_rows_somewhere_and_no_two_slips_agree():
    cases = [(tiny_test_model(name), prompts, NEW_TOKENS, end) for name, end, prompts in GENERATION_CASES]
    right = [slipped_rows(*case) for case in cases]
    outcomes = {slip: [slipped_rows(*case, slip=slip) for case in cases] for slip in SLIPS}
    for slip, rows in outcomes.items():
        assert rows != right, f"{slip} gives the right rows on every case"
    assert len({repr(rows) for rows in outcomes.values()}) == len(SLIPS), "two slips give the same rows"


def test_a_row_may_also_match_the_packages_own_batch(tiny_llama, capsys):
    """On the notebook's model a near-tie can flip by rounding in a batch: a batch's rows, as the package's
    batch gives them, are accepted too (the learner's own loop: the checker refuses a call of generate)."""
    from checker_cases.nb02_batching import batched_loop

    check_batched_generation(batched_loop, tiny_llama, [[1, 2, 3], [4]], end_id=257, new_tokens=4)
    assert "tiny-llama, tiny-gpt2, tiny-llama" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="one list of new token ids"):
        check_batched_generation(lambda *args: [[1, 2], None], tiny_llama, [[1, 2, 3], [4]], 257, 4)


def test_an_unanswered_exercise_shows_the_stubs_own_message():
    """A student version's stub raises NotImplementedError: the checker lets it through, unchanged."""
    from labsupport.checks.batching import check_left_pad, check_padding_waste

    def stub(*args):
        raise NotImplementedError("Exercise: replace this line with your solution")

    for checker in (check_left_pad, check_batched_generation, check_padding_waste):
        with pytest.raises(NotImplementedError, match="Exercise"):
            checker(stub)
