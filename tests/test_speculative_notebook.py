"""Notebook 05's explorer is live (its checkers: tests/test_checkers.py)."""

import torch


def test_explorer_redraws_when_a_control_changes(tiny_llama):
    from labsupport.explorers.speculative import speculative_explorer
    from labsupport.weights.fixtures import ByteTokenizer, random_model
    from labsupport.engine.speculative import ModelDraft, PromptLookupDraft

    torch.manual_seed(0)
    draft = random_model("tiny-llama", seed=1)
    explorer = speculative_explorer(tiny_llama, ByteTokenizer(),
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
