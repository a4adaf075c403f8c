"""Notebook 05's sampling-verify checker is not flaky: its false-refusal bound, and right answers
under several seeds (its mistakes: tests/checker_cases/nb05_speculative.py)."""

import pytest
import torch

from labsupport.checks import CheckFailed
from labsupport.checks.speculative_sampling import (check_verify_sampled, false_refusal_bound,
                                                    reference_verify_sampled, settings)


def test_a_right_answer_is_refused_with_probability_below_one_in_a_million():
    assert false_refusal_bound() < 1e-6


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_reference_passes_whatever_the_seed(seed, capsys):
    check_verify_sampled(reference_verify_sampled, seed=seed)
    assert "Correct" in capsys.readouterr().out


def test_a_right_answer_on_the_global_random_numbers_passes(capsys):
    torch.manual_seed(7)
    check_verify_sampled(lambda p, q, drafted, generator: reference_verify_sampled(p, q, drafted, None))
    assert "Correct" in capsys.readouterr().out


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
