"""Checkers for notebook 02 (batching).

Introduced in notebook 02 (batching). Each compares a learner's answer with
`labsupport.batching` and either confirms it or raises `CheckFailed` with what
was expected, what came back, and a hint.
"""

from __future__ import annotations

import torch

from ..batching import PaddedBatch, left_pad, padding_waste
from . import close_enough, fail, passed

PAD = 0
# prompts of different lengths, equal lengths, and a single prompt
LEFT_PAD_CASES = (
    [[5, 6, 7], [8], [9, 10]],
    [[11, 12, 13, 14], [15, 16, 17, 18, 19, 20], [21]],
    [[3, 4], [5, 6]],
    [[42]],
)
WASTE_CASES = ([3, 1], [10, 10, 10], [100, 5, 5, 5], [7], [64, 48, 32, 16, 8, 4, 2, 1])


def _as_tensor(value, name: str, exercise: str, expected_shape) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(value)
    except Exception:
        fail(exercise, f"{name} as a tensor or nested list", type(value).__name__,
             f"return {name} as a (batch, T) tensor.")
    if tuple(tensor.shape) != tuple(expected_shape):
        fail(exercise, f"{name} of shape {tuple(expected_shape)} (batch, longest prompt)",
             f"shape {tuple(tensor.shape)}", "one row per prompt, as wide as the longest prompt.")
    return tensor


def _unpack(answer, exercise: str):
    """(tokens, mask, positions or None) from a PaddedBatch, a tuple of 2 or 3, or a dict."""
    if isinstance(answer, PaddedBatch):
        return answer.tokens, answer.attention_mask, answer.positions
    if isinstance(answer, dict):
        return answer.get("tokens"), answer.get("attention_mask"), answer.get("positions")
    if isinstance(answer, (tuple, list)) and len(answer) in (2, 3):
        return answer[0], answer[1], answer[2] if len(answer) == 3 else None
    fail(exercise, "(tokens, attention_mask) or (tokens, attention_mask, positions)",
         type(answer).__name__, "return the tensors as a tuple.")


def check_left_pad(fn) -> None:
    """Check `fn(prompts, pad_id) -> (tokens, attention_mask[, positions])` against `batching.left_pad`.

    Introduced in notebook 02 (batching). The mask may be bool or 0/1 integers.
    """
    exercise = "left padding"
    for prompts in LEFT_PAD_CASES:
        expected = left_pad(prompts, PAD)
        shape = expected.tokens.shape
        tokens, mask, positions = _unpack(fn([list(p) for p in prompts], PAD), exercise)
        tokens = _as_tensor(tokens, "tokens", exercise, shape).long()
        mask = _as_tensor(mask, "attention_mask", exercise, shape)
        want_tokens, want_mask = expected.tokens.tolist(), expected.attention_mask.tolist()
        right = [list(p) + [PAD] * (shape[1] - len(p)) for p in prompts]
        if tokens.tolist() != want_tokens:
            hint = ("padding on the right: put the pad ids before each prompt, so that every prompt "
                    "ends in the last column, where the next token is appended."
                    if tokens.tolist() == right else
                    f"row i is [pad_id] x (longest - len(prompt i)) followed by prompt i, pad_id={PAD}.")
            fail(exercise, f"tokens {want_tokens} for prompts {prompts}", tokens.tolist(), hint)
        mask_bool = mask.bool().tolist() if mask.dtype != torch.bool else mask.tolist()
        if mask_bool != want_mask:
            inverted = [[not v for v in row] for row in want_mask]
            if mask_bool == inverted:
                hint = "mask inverted: True (or 1) marks the real tokens, False (0) the padding."
            elif mask.unique().numel() > 2 or mask.min() < 0 or mask.max() > 1:
                hint = "the mask holds only True/False (or 1/0), one per token slot."
            else:
                hint = "True where the row holds a prompt token, False on its padding, same shape as tokens."
            fail(exercise, f"attention_mask {[[int(v) for v in r] for r in want_mask]} for prompts {prompts}",
                 [[int(v) for v in r] for r in mask_bool], hint)
        if positions is not None:
            positions = _as_tensor(positions, "positions", exercise, shape).long()
            want = expected.positions.tolist()
            if positions.tolist() != want:
                counts_padding = positions.tolist() == [list(range(shape[1]))] * shape[0]
                # padding slots are masked out, so any position there is fine: compare real tokens only
                real = expected.attention_mask
                if positions[real].tolist() != expected.positions[real].tolist():
                    hint = ("positions count the padding: each row's first real token is position 0, "
                            "so subtract the row's padding (a cumulative sum of the mask, minus 1, does it)."
                            if counts_padding else "positions run 0, 1, 2, ... along each row's real tokens.")
                    fail(exercise, f"positions {want} for prompts {prompts}", positions.tolist(), hint)
    passed(exercise, f"{len(LEFT_PAD_CASES)} batches padded on the left, masks right"
           + (", positions right." if positions is not None else "."))


def check_padding_waste(fn) -> None:
    """Check `fn(lengths) -> fraction of a padded batch's token slots that are padding`.

    Introduced in notebook 02 (batching).
    """
    exercise = "padding waste"
    for lengths in WASTE_CASES:
        expected = padding_waste(lengths)
        try:
            got = float(fn(list(lengths)))
        except (TypeError, ValueError):
            fail(exercise, "a number between 0 and 1", repr(fn(list(lengths))), "return a float.")
        if close_enough(got, expected, 1e-6) or abs(got - expected) < 1e-9:
            continue
        slots, real = len(lengths) * max(lengths), sum(lengths)
        if abs(got - (1 - expected)) < 1e-9:
            hint = "that is the fraction of real tokens; the waste is the padding: 1 minus it."
        elif close_enough(got, 100 * expected, 1e-6):
            hint = "return a fraction between 0 and 1, not a percentage."
        elif abs(got - (slots - real)) < 1e-9:
            hint = "that is the number of padding slots; divide by all slots (batch x longest)."
        elif close_enough(got, (slots - real) / real, 1e-6):
            hint = "divide the padding by all token slots (batch x longest), not by the real tokens."
        else:
            hint = "every row is padded to the longest prompt: slots = batch x max(lengths); waste = padding / slots."
        fail(exercise, f"{expected:.4f} for lengths {lengths}", f"{got:.4f}", hint)
    passed(exercise, f"{len(WASTE_CASES)} batches, from no padding to mostly padding.")
