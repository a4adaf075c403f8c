"""Issue 37, item 1: no exercise checker gives points for the package's own answer.

Each checker grades by reach (`labsupport.checks.grading`): a learner's function that calls the
package's answer, or is one, is refused with "expected your own code". Also refused: the wrong methods that gave the
right numbers (a two-pass softmax in 08, a float matmul for W4A8's y in 04, Python's salted
hash() behind a helper in 06). The notebook's own solutions, rewritten in the checker table
(tests/checker_cases/), still pass; tests/test_checkers.py runs them.
"""

import math
import sys
import types

import pytest
import torch

import labsupport as ls
from labsupport.checks import CheckFailed
from labsupport.checks.batching import check_batched_generation, check_left_pad
from labsupport.checks.kv_cache import check_cached_generation
from labsupport.checks.quantization_w4a8 import check_w4a8_matmul
from labsupport.checks.roofline import check_decode_step_cost
from labsupport.checks.serving import check_block_hash
from labsupport.checks.long_context_tiled import check_tiled_attention
from labsupport.engine import padding
from labsupport.lab import roofline

from checker_cases.nb02_batching import trim_after_end as trim
from checker_cases.nb04_quantization import w4a8_matmul
from checker_cases.nb08_long_context import reference_tiled

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)

WRITE_IT = "expected your own code"


def generate_01(model, prompt_ids, new_tokens):
    result = ls.generate(model, prompt_ids, new_tokens, eos_token_ids=(), return_logits=True)
    return result.tokens[0].tolist(), torch.cat(result.logits)


def generate_02(model, prompts, new_tokens, end_id):
    result = ls.generate(model, prompts, new_tokens, eos_token_ids=(end_id,))
    return [trim(row, end_id) for row in result.tokens.tolist()]


# notebooks 08-10 grade by reach (labsupport.checks.grading): their answers that call the package are rows of
# tests/checker_cases/nb08_long_context.py, nb09_http_serving.py and nb10_tensor_parallel.py
REFERENCE_ANSWERS = [
    (check_cached_generation, generate_01),
    (check_batched_generation, generate_02),
    (check_left_pad, lambda prompts, pad_id: padding.left_pad(prompts, pad_id)),
    (check_decode_step_cost, lambda c, b, n, s: tuple(roofline.decode_step_cost(c, b, n, s))[:2]),
]


@pytest.mark.parametrize("checker, answer", REFERENCE_ANSWERS,
                         ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(REFERENCE_ANSWERS)])
def test_an_answer_that_calls_the_package_is_refused(checker, answer, capsys):
    with pytest.raises(CheckFailed, match=WRITE_IT):
        checker(answer)
    assert "Correct" not in capsys.readouterr().out


def test_the_notebooks_own_import_of_the_reference_is_refused_too(monkeypatch):
    """A notebook's `from labsupport.engine.padding import left_pad` lives in __main__; the stand-in
    replaces that name as well, and puts the original back afterwards."""
    main = types.ModuleType("__main__")
    main.left_pad = padding.left_pad
    exec("def my_left_pad(prompts, pad_id):\n    return left_pad(prompts, pad_id)\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(CheckFailed, match=WRITE_IT):
        check_left_pad(main.my_left_pad)
    assert main.left_pad is padding.left_pad and padding.left_pad.__module__ == "labsupport.engine.padding"


def test_a_refusal_caught_by_the_learners_code_is_still_a_refusal():
    def sneaky(prompts, pad_id):
        try:
            return padding.left_pad(prompts, pad_id)
        except Exception:                                    # noqa: BLE001 - what a learner might write
            return None
    with pytest.raises(CheckFailed, match=WRITE_IT):
        check_left_pad(sneaky)


# --- the wrong methods that gave the right numbers -------------------------------------------

def two_pass_softmax(q, k, v, tile, causal=False):
    """The right numbers in two walks over the key tiles: the max first, then the sum and output."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    rows = torch.arange(q.shape[2])[:, None]

    def scores_of(start):
        scores = q @ k[:, :, start:start + tile].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            keys = torch.arange(start, start + scores.shape[-1])[None, :]
            scores = scores.masked_fill(keys > rows, float("-inf"))
        return scores

    row_max = torch.full(q.shape[:-1] + (1,), float("-inf"))
    for start in range(0, k.shape[2], tile):
        row_max = torch.maximum(row_max, scores_of(start).amax(dim=-1, keepdim=True))
    row_sum, out = torch.zeros(q.shape[:-1] + (1,)), torch.zeros_like(q)
    for start in range(0, k.shape[2], tile):
        weights = torch.exp(scores_of(start) - row_max)
        row_sum = row_sum + weights.sum(dim=-1, keepdim=True)
        out = out + weights @ v[:, :, start:start + tile]
    return out / row_sum


def test_a_two_pass_softmax_is_not_told_online_softmax(capsys):
    with pytest.raises(CheckFailed, match="one walk over the tiles"):
        check_tiled_attention(two_pass_softmax)
    assert "Correct" not in capsys.readouterr().out
    check_tiled_attention(reference_tiled)                  # the one-pass solution still passes
    assert "one pass over the keys" in capsys.readouterr().out


def float_y_beside_integer_sums(x, q, scales, mins):
    _, sums = w4a8_matmul(x, q, scales, mins)             # right integer sums
    y, _ = w4a8_matmul(x, q, scales, mins, dequantized=True)
    return y, sums


def test_w4a8s_y_from_a_float_matmul_is_refused():
    with pytest.raises(CheckFailed, match="build y from sums"):
        check_w4a8_matmul(float_y_beside_integer_sums)


def _text_of(parent_hash, block_tokens):
    return f"{parent_hash}|{list(block_tokens)}"


def salted_behind_a_helper(parent_hash, block_tokens):
    return hash(_text_of(parent_hash, block_tokens)) & (2**63 - 1)


def hashlib_behind_a_helper(parent_hash, block_tokens):
    import hashlib
    return int.from_bytes(hashlib.blake2b(_text_of(parent_hash, block_tokens).encode(), digest_size=8).digest(),
                          "little")


def test_salted_hash_behind_a_helper_is_refused_not_skipped(capsys):
    with pytest.raises(CheckFailed, match="salted per process"):
        check_block_hash(salted_behind_a_helper)
    check_block_hash(hashlib_behind_a_helper)               # a helper is fine: it travels with the function
    assert "Correct" in capsys.readouterr().out


SETTING = 7


def needs_a_global(parent_hash, block_tokens):
    import hashlib
    text = f"{SETTING}|{parent_hash}|{list(block_tokens)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def test_a_hash_that_cannot_be_checked_in_a_fresh_process_is_refused_not_skipped():
    with pytest.raises(CheckFailed, match="fresh Python process"):
        check_block_hash(needs_a_global)
