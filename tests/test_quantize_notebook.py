"""Notebook 04's checkers and explorer: the reference passes, a wrong answer fails, the explorer is live."""

import pytest
import torch

from labsupport.checks import CheckFailed
from labsupport.checks.quantize import check_int4_pack, check_int8_absmax
from labsupport.quantize import dequantize_int8, pack_int4, quantize_int8_absmax, unpack_int4


def test_int8_checker_accepts_reference(capsys):
    check_int8_absmax(quantize_int8_absmax, dequantize_int8)
    assert "Correct" in capsys.readouterr().out


def _per_tensor(w):
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def _scale_128(w):
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _no_round(w):
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]), scale


@pytest.mark.parametrize("quantize, words", [(_per_tensor, "per row"), (_scale_128, "127"),
                                             (_no_round, "round")])
def test_int8_checker_rejects_wrong_answers(quantize, words):
    with pytest.raises(CheckFailed, match=words):
        check_int8_absmax(quantize, dequantize_int8)


def test_int8_checker_rejects_wrong_dequantize():
    with pytest.raises(CheckFailed):
        check_int8_absmax(quantize_int8_absmax, lambda q, scale: q.float() * scale.mean())


def test_pack_checker_accepts_reference(capsys):
    check_int4_pack(pack_int4, unpack_int4)
    assert "Correct" in capsys.readouterr().out


def test_pack_checker_rejects_swapped_nibbles():
    def swapped(q):
        q = q.to(torch.uint8)
        return q[:, 1::2] | (q[:, 0::2] << 4)
    with pytest.raises(CheckFailed, match="swapped"):
        check_int4_pack(swapped, unpack_int4)


def test_pack_checker_rejects_wrong_unpack():
    with pytest.raises(CheckFailed):
        check_int4_pack(pack_int4, lambda packed: torch.cat([packed & 0x0F, packed >> 4], dim=1))


def test_explorer_redraws_when_a_control_changes():
    from labsupport.explorers.quantize import quantize_explorer
    from labsupport.models.loading import ByteTokenizer, random_model

    model = random_model("tiny-llama")
    explorer = quantize_explorer(model, ByteTokenizer(), new_tokens=4, eval_tokens=64, repeats=1,
                                 use_widget=False)
    before = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert len(before) == 4 and explorer.status.value == ""
    explorer.controls["bits"].value = 4
    after = [f.figure.to_plotly_json()["data"] for f in explorer.figures]
    assert explorer.status.value == ""
    assert before[0] != after[0]                                   # another error histogram
    assert len(after[1][0]["x"]) == len(before[1][0]["x"]) + 1    # one more setting measured
    explorer.controls["group_size"].value = 64
    assert len(explorer.figures[1].figure.to_plotly_json()["data"][0]["x"]) == 4
