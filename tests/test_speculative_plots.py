"""Notebook 05's figures (labsupport/plots/speculative.py): what each one draws."""

import pytest

from labsupport.errors import LabError
from labsupport.plots.speculative import (acceptance_figure, pass_cost_figure, speed_figure, speedup_figure,
                                          verify_pass_figure)

CONTEXT = ["The", " light", "house", " keeper"]


def texts(fig):
    return [a.text for a in fig.layout.annotations]


def test_the_verify_pass_diagram_keeps_the_prefix_adds_the_targets_token_and_rolls_back():
    fig = verify_pass_figure(CONTEXT, [" climbed", " the", " stairs", " every"],
                             [" climbed", " the", " narrow", " stairs", " at"], 2)
    assert "2 accepted + 1 corrected" in fig.layout.title.text
    # one arrow per position of the target's pass: k + 1 = 5 predictions
    assert sum(1 for a in fig.layout.annotations if a.showarrow) == 5
    # the rolled-back drafts are struck out in the cache row; the rejected draft in the draft row
    assert texts(fig).count("<s> stairs</s>") == 2 and "<s> every</s>" in texts(fig)
    assert any("+3 in the cache" in t for t in texts(fig))
    bonus = verify_pass_figure(CONTEXT, [" climbed", " the"], [" climbed", " the", " narrow"], 2)
    assert "2 accepted + 1 bonus" in bonus.layout.title.text and not any("<s>" in t for t in texts(bonus))
    assert any("+3 in the cache" in t for t in texts(bonus))


def test_the_verify_pass_diagram_refuses_inconsistent_input():
    with pytest.raises(LabError, match="k \\+ 1"):
        verify_pass_figure(CONTEXT, ["a", "b"], ["a", "b"], 1)          # needs 3 target choices
    with pytest.raises(LabError):
        verify_pass_figure(CONTEXT, ["a", "b"], ["a", "b", "c"], 3)     # more accepted than drafted
    with pytest.raises(LabError):
        verify_pass_figure([], ["a"], ["a", "b"], 1)


def test_a_rate_and_a_count_never_share_an_axis():
    fig = acceptance_figure(["lookup", "int4"], [0.7, 1.0], [3.5, 4.9], current=1)
    rate, count = fig.data
    assert (rate.yaxis, count.yaxis) == ("y", "y2")
    assert fig.layout.yaxis.range == (0, 1.05)
    assert rate.marker.color[1] != rate.marker.color[0]                # the current setting stands out


def test_the_speedup_figure_shows_both_predictions_and_the_cost_figure_stacks():
    fig = speedup_figure(["a", "b"], [1.2, 0.9], [1.3, 0.8], [2.5, 1.9])
    assert [t.name for t in fig.data] == ["measured", "predicted (measured draft and verify costs)",
                                          "predicted with a free verify pass"]
    costs = pass_cost_figure([{"label": "lookup", "draft_per_pass": 0.0, "verify_per_pass": 2.1,
                               "tokens_per_pass": 3.8}])
    assert costs.layout.barmode == "stack" and list(costs.data[2].y) == [3.8]
    speed = speed_figure({"plain": 20.0, "lookup": 30.0})
    assert list(speed.data[0].text) == ["1.00x", "1.50x"]
    with pytest.raises(LabError, match="baseline"):
        speed_figure({"lookup": 30.0})
