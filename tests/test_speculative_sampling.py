"""Notebook 05's sampling-verify checker is not flaky: its false-refusal bound, right answers under several
seeds, and a uniform number reused for every draft refused under all of them, in a few seconds (its
mistakes: tests/checker_cases/nb05_speculative.py). The checker's own reference is the package's: a learner
that calls it is refused, so the right answers here are written out (the notebook's solution)."""

import time

import pytest
import torch

from labsupport.checks import CheckFailed
from labsupport.checks.speculative_sampling import (check_verify_sampled, false_refusal_bound,
                                                    reference_verify_sampled, settings)

from checker_cases.nb05_speculative import verify_in_one_call, verify_one_uniform_for_all, verify_sampled


def test_a_right_answer_is_refused_with_probability_below_one_in_a_million():
    assert false_refusal_bound() < 1e-6


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_right_answer_passes_whatever_the_seed(seed, capsys):
    started = time.perf_counter()
    check_verify_sampled(verify_sampled, seed=seed)
    assert "Correct" in capsys.readouterr().out
    assert time.perf_counter() - started < 10                 # about 1 s when written


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_uniform_number_for_every_draft_is_refused_whatever_the_seed(seed):
    with pytest.raises(CheckFailed, match="fresh uniform number"):
        check_verify_sampled(verify_one_uniform_for_all, seed=seed)


def test_a_right_answer_on_the_global_random_numbers_passes(capsys):
    torch.manual_seed(7)
    check_verify_sampled(lambda p, q, drafted, generator: verify_in_one_call(p, q, drafted, None))
    assert "Correct" in capsys.readouterr().out


def test_the_checkers_own_reference_is_refused():
    with pytest.raises(CheckFailed, match="expected your own code"):
        check_verify_sampled(reference_verify_sampled)


def test_the_settings_separate_the_wrong_rules_by_far():
    """Exactly computed: resampling from p lands far from p, and the greedy-style and q/p rules
    accept at rates far from sum(min(p, q)), in the settings the checker draws from."""
    p, q = settings()["A"]
    kept = torch.minimum(p[0], q[0])
    from_p = kept + (1 - kept.sum()) * p[0]
    assert 0.5 * float((from_p - p[0]).abs().sum()) > 0.15
    assert abs(float(q[0][p[0] >= q[0]].sum()) - float(kept.sum())) > 0.2
    assert abs(float((q[0] * (q[0] / p[0]).clamp(max=1)).sum()) - float(kept.sum())) > 0.2


def test_a_malformed_answer_gets_one_sentence():
    with pytest.raises(CheckFailed, match="a list of token ids"):
        check_verify_sampled(lambda p, q, drafted, generator: None)
