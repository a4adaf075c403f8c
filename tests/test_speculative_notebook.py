"""Notebook 05's checkers and explorer: the reference passes, a wrong answer fails, the explorer is live."""

import pytest
import torch

from labsupport.checks import CheckFailed
from labsupport.checks.speculative import check_accept_step, check_expected_tokens, reference_accept_step
from labsupport.speculative import expected_tokens_per_call


def test_accept_checker_accepts_reference(capsys):
    check_accept_step(reference_accept_step)
    assert "Correct" in capsys.readouterr().out


def _always_accept(p, q, x, u):
    return True, None


def _no_min(p, q, x, u):                       # compares u with p alone
    if u < float(p[x]):
        return True, None
    r = (p - q).clamp_min(0)
    return False, r / r.sum()


def _unnormalized(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, (p - q).clamp_min(0)


def _resample_target(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, p


@pytest.mark.parametrize("fn, words", [(_always_accept, "accepted"), (_no_min, "min"),
                                       (_unnormalized, "sum"), (_resample_target, "double-counts")])
def test_accept_checker_rejects_wrong_answers(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_accept_step(fn)


def test_expected_checker_accepts_reference(capsys):
    check_expected_tokens(expected_tokens_per_call)
    assert "Correct" in capsys.readouterr().out


@pytest.mark.parametrize("fn, words", [
    (lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k, "k \\+ 1"),
    (lambda a, k: (1 - a ** (k + 1)) / (1 - a), "alpha = 1"),
    (lambda a, k: a * k + 1, "all before it"),
])
def test_expected_checker_rejects_wrong_answers(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_expected_tokens(fn)


def test_explorer_redraws_when_a_control_changes():
    from labsupport.explorers.speculative import speculative_explorer
    from labsupport.models.loading import ByteTokenizer, random_model
    from labsupport.speculative import ModelDraft, PromptLookupDraft

    torch.manual_seed(0)
    target = random_model("tiny-llama")
    draft = random_model("tiny-llama", seed=1)
    explorer = speculative_explorer(target, ByteTokenizer(),
                                    {"lookup": PromptLookupDraft(), "model": ModelDraft(draft)},
                                    {"echo": "the cat sat on the mat, the cat sat on the mat"},
                                    new_tokens=6, use_widget=False)
    before = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert len(before) == 2 and explorer.status.value == ""
    explorer.controls["k"].value = 2
    after = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == "" and after != before
    explorer.controls["draft"].value = "model"
    explorer.controls["temperature"].value = 1.0
    again = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == "" and again != after
    assert len(again[0][0]["x"]) == 4
