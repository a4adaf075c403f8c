"""Checking what a learner passes in: the one place where public inputs are validated.

Introduced in notebook 01 (KV cache), where `generate` first takes a prompt.

Every public entry point (`generate`, `generate_naive`, speculative decoding, the
serving engine's `Request` and `Engine`, `SamplingConfig`) sends its arguments
through these functions, so the same mistake gets the same one-sentence answer
everywhere, and nothing wrong reaches torch, where it would become a traceback, a
hang, or (on a GPU) a device-side assert that breaks the whole CUDA context:

* whole numbers are whole (2.5 new tokens is a mistake, not 2) and in range;
* real numbers are finite: every range check is written as `low <= x <= high`,
  which NaN fails, never as `x < low`, which NaN passes;
* a prompt is token ids, not text (`tok.encode(text)` turns text into ids), and
  every id lies inside the model's vocabulary.
"""

from __future__ import annotations

import math
import numbers

import torch

from .errors import LabError


def whole_number(value, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an int, if it is a whole number from `minimum` to `maximum`; else one sentence.
    Notebook 01 (KV cache)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise LabError(f"{name} must be a whole number, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if not (value >= minimum and (maximum is None or value <= maximum)):
        bound = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        shown = value if value.bit_length() < 64 else f"an integer of {value.bit_length()} bits"
        raise LabError(f"{name} must be {bound}, got {shown}.")
    return value


def finite_number(value, name: str, minimum: float | None = None, maximum: float | None = None,
                  above_minimum: bool = False) -> float:
    """`value` as a float, if it is a finite number in range; else one sentence.

    above_minimum: the minimum itself is excluded (`minimum < value`).

    Notebook 01 (KV cache).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise LabError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    try:
        value = float(value)
    except OverflowError:                                      # an int past float's range, e.g. 10**400
        raise LabError(f"{name} must be a finite number, got an integer of {value.bit_length()} bits.") from None
    low_ok = minimum is None or (value > minimum if above_minimum else value >= minimum)
    high_ok = maximum is None or value <= maximum
    if not (math.isfinite(value) and low_ok and high_ok):      # NaN fails every comparison
        low = "" if minimum is None else (f"> {minimum}" if above_minimum else f">= {minimum}")
        high = "" if maximum is None else f"<= {maximum}"
        wanted = " and ".join(part for part in ("finite", low, high) if part)
        raise LabError(f"{name} must be {wanted}, got {value}.")
    return value


def _as_id_list(prompt, what: str) -> list[int]:
    """One prompt (a list/tuple of ints or a 1-D integer tensor/array) as a list of ints."""
    if isinstance(prompt, str):
        raise LabError(f"The {what} is text; give token ids instead, e.g. tokenizer.encode(text).")
    if hasattr(prompt, "dtype") and hasattr(prompt, "tolist"):              # tensor or NumPy array
        dtype = str(prompt.dtype)
        if "float" in dtype or "complex" in dtype or "bool" in dtype:
            raise LabError(f"The {what} holds {dtype} values; token ids are whole numbers "
                           f"(use a long tensor, e.g. torch.tensor(ids)).")
        prompt = prompt.tolist()
    ids = []
    for position, token in enumerate(prompt):
        if isinstance(token, str):
            raise LabError(f"The {what} holds text at position {position} ({token!r}); give token ids "
                           f"instead, e.g. tokenizer.encode(text).")
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise LabError(f"The {what} holds {token!r} at position {position}; token ids are whole numbers.")
        ids.append(int(token))
    return ids


def token_rows(prompt, vocab_size: int | None = None, what: str = "prompt") -> list[list[int]]:
    """The one prompt normaliser: a prompt, or a batch of prompts, as a list of id lists.

    Accepts a list of ids, a 1-D tensor (one prompt), a 2-D tensor (a batch), or a list of
    prompts of any lengths. Refuses text, non-integer values, an empty prompt, and (when
    `vocab_size` is given) ids outside [0, vocab_size), naming the first bad one.

    Notebook 01 (KV cache).
    """
    if isinstance(prompt, str):
        raise LabError(f"The {what} is text; give token ids instead, e.g. tokenizer.encode(text).")
    if hasattr(prompt, "dim") or hasattr(prompt, "ndim"):                  # tensor or NumPy array
        dims = prompt.dim() if hasattr(prompt, "dim") else prompt.ndim
        if dims not in (1, 2):
            raise LabError(f"The {what} must be 1-D (one prompt) or 2-D (batch, T), got {dims} dimensions.")
        rows = [_as_id_list(prompt, what)] if dims == 1 else [_as_id_list(r, what) for r in prompt]
    else:
        try:
            prompt = list(prompt)
        except TypeError:                                                   # None, a number, ...
            raise LabError(f"The {what} must be token ids (a list of ints or a tensor), got "
                           f"{type(prompt).__name__}.") from None
        if prompt and not isinstance(prompt[0], str) and hasattr(prompt[0], "__len__"):
            rows = [_as_id_list(p, f"{what} {i} of the batch") for i, p in enumerate(prompt)]
        else:
            rows = [_as_id_list(prompt, what)]
    if not rows:
        raise LabError(f"The {what} is empty (no prompts); give at least one token.")
    for i, row in enumerate(rows):
        name = what if len(rows) == 1 else f"{what} {i} of the batch"
        if not row:
            raise LabError(f"The {name} is empty; give it at least one token.")
        if vocab_size is not None:
            bad = next((t for t in row if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise LabError(f"The {name} holds token id {bad}, outside the model's vocabulary "
                               f"[0, {vocab_size}); encode text with this model's tokenizer.")
    return rows


def token_id_set(ids, name: str = "eos_token_ids") -> list[int]:
    """A collection of token ids, such as end-of-sequence ids, as a list of ints (may be empty).
    Notebook 01 (KV cache)."""
    if isinstance(ids, (numbers.Number, str)):
        raise LabError(f"{name} must be a list of token ids (or () for none), got {ids!r}.")
    return [whole_number(t, f"each of {name}", minimum=0) for t in ids]
