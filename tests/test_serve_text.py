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


# --- the text is decoded incrementally: the same as decoding every id at every token ---------

class WholeDecode(TextStream):
    """The reference: the whole answer decoded again at every token (quadratic, but plainly right)."""

    def _text(self) -> str:
        return self._decode(self.ids)


class CountingTokenizer:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, inner):
        self.inner, self.decoded = inner, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.inner.decode(ids, **kwargs)


def both_streams(tokenizer, tokens, stops):
    ours, whole = TextStream(tokenizer, stops), WholeDecode(tokenizer, stops)
    return ([ours.add(t) for t in tokens] + [ours.finish()], [whole.add(t) for t in tokens] + [whole.finish()])


def test_incremental_decoding_sends_what_decoding_everything_sends():
    """Every step's text, held back or not, equals the reference's (bytes: half characters on the way)."""
    from hypothesis import given, strategies as st
    utf8 = st.text(max_size=40).map(lambda s: list(s.encode()))
    noise = st.lists(st.integers(0, 255), max_size=40)

    @given(st.one_of(utf8, noise), st.sampled_from([None, ["é"], ["ab", "\n\n"], ["\x00"]]))
    def same(tokens, stops):
        ours, whole = both_streams(ByteTokenizer(), tokens, stops)
        assert ours == whole
    same()


@pytest.mark.slow
def test_incremental_decoding_matches_on_the_real_tokenizer(smollm):
    embedded_tokenizer = smollm[1]
    import random
    rng = random.Random(0)
    text = "Ünïcödé, emoji 🙂🚀 and 中文 text. " * 8
    real = embedded_tokenizer.encode(text, add_special_tokens=False)
    for trial in range(60):
        count = rng.randint(1, 40)
        tokens = ([rng.randrange(len(embedded_tokenizer)) for _ in range(count)] if trial % 2 else
                  real[(start := rng.randrange(len(real) - count)):start + count])
        ours, whole = both_streams(embedded_tokenizer, tokens, rng.choice([None, ["."], [" 中"]]))
        assert ours == whole, tokens


def test_a_token_costs_the_same_however_long_the_answer():
    """The ids decoded per token stay bounded: 2,000 tokens decode about as many ids per token as 20."""
    def per_token(count):
        tokenizer = CountingTokenizer(ByteTokenizer())
        stream = TextStream(tokenizer, ["zzz"])
        for token in list(("héllo wörld " * count).encode())[:count]:
            stream.add(token)
        return tokenizer.decoded / count
    assert per_token(2000) <= per_token(20) + 1 and per_token(2000) < 12
