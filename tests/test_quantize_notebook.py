"""Notebook 04's explorer is live (its checkers: tests/test_checkers.py)."""


def test_explorer_redraws_when_a_control_changes(fresh_tiny_llama):
    from labsupport.explorers.quantization import quantize_explorer
    from labsupport.weights.fixtures import ByteTokenizer

    # the explorer quantizes the model in place for each setting, then restores it
    explorer = quantize_explorer(fresh_tiny_llama, ByteTokenizer(), new_tokens=4, eval_tokens=64, repeats=1,
                                 use_widget=False)
    before = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert len(before) == 4 and explorer.status.value == ""
    assert [t["name"] for t in before[1]] == ["resident", "read per decode step"]
    assert [t["name"] for t in before[2]] == ["vs fp32", "vs bf16"]
    assert "fused int8 kernel" in explorer.figures[2].figure.layout.title.text
    explorer.controls["bits"].value = 4
    after = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == ""
    assert before[0] != after[0]                                   # another error histogram
    assert len(after[1][0]["x"]) == len(before[1][0]["x"]) + 1    # one more setting measured
    assert "int4 g32 ran the W4A8 kernel of our own" in explorer.figures[2].figure.layout.title.text
    explorer.controls["group_size"].value = 64
    assert len(explorer.figures[1].figure.to_plotly_json()["data"][0]["x"]) == 4
