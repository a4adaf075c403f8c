"""Tokens to text for the server (notebook 09): half characters and stop strings are held back
until they cannot change, and everything sent, joined, is the final text."""

import pytest
import torch

from labsupport.serve.text import TextStream, held_back
from labsupport.weights.fixtures import ByteTokenizer


def sent(stream: TextStream, tokens) -> list[str]:
    return [stream.add(t) for t in tokens]


def test_a_character_split_over_tokens_waits_for_its_last_byte():
    tokens = list("né ☃!".encode())                          # é is 2 bytes, ☃ is 3
    stream = TextStream(ByteTokenizer())
    pieces = sent(stream, tokens) + [stream.finish()]
    assert "".join(pieces) == "né ☃!" and "\ufffd" not in "".join(pieces)
    assert pieces[1] == "" and pieces[2] == "é"                  # nothing until the character is whole


def test_a_stop_string_split_over_tokens_is_never_sent():
    stream = TextStream(ByteTokenizer(), stop=["STOP", "xyz"])
    pieces = sent(stream, list(b"go ST"))
    assert "".join(pieces) == "go " and not stream.stopped      # "ST" may begin "STOP": held back
    assert stream.add(ord("O")) == "" and stream.add(ord("P")) == "" and stream.stopped
    assert stream.finish() == "" and stream.sent == "go "


def test_a_false_start_is_released_and_finish_flushes_the_rest():
    stream = TextStream(ByteTokenizer(), stop=["STOP"])
    pieces = sent(stream, list(b"a STAR"))
    assert "".join(pieces) == "a STAR" and not stream.stopped   # "STA" then "R": not the stop string
    stream2 = TextStream(ByteTokenizer(), stop=["STOP"])
    assert "".join(sent(stream2, list(b"end ST"))) == "end " and stream2.finish() == "ST"


@pytest.mark.parametrize("seed", range(5))
def test_joined_pieces_are_the_decoded_answer(seed):
    tokens = torch.randint(0, 260, (40,), generator=torch.Generator().manual_seed(seed)).tolist()
    stream = TextStream(ByteTokenizer(), stop=["\x00\x01"])
    text = "".join(sent(stream, tokens)) + stream.finish()
    full = ByteTokenizer().decode(tokens)
    assert text == (full[: full.index("\x00\x01")] if "\x00\x01" in full else full)


def test_held_back():
    assert held_back("Hello wor", ["world"]) == 3 and held_back("Hello", ["\n\n"]) == 0
    assert held_back("xxEN", ["ENOUGH", "END"]) == 2 and held_back("Hi", []) == 0
