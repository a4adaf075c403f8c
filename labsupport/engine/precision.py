"""Casting a model to another floating-point precision (fp32, bf16, fp16).

Introduced in notebook 03 (mixed precision); what the casts save and break is measured
in lab/precision.py.
"""

from __future__ import annotations

import copy

import torch

from .hardware import as_dtype, require_usable_dtype
from .models.layout import apply_layout


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer of `model`, shared tensors counted once.
    Notebook 03 (mixed precision)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.nbytes
    return total


def cast_model(model: torch.nn.Module, dtype) -> torch.nn.Module:
    """A copy of `model` with its weights in `dtype` (the original is untouched),
    laid out for the fastest kernel on its device (see engine/models/layout.py).

    Introduced in notebook 03 (mixed precision). Not a linear swap
    (`linear_swap.swap_linears`): every parameter and buffer is cast, embeddings,
    norms and position tables included, so the whole forward runs in `dtype` and the
    memory halves; the swap would cast the Linear weights alone. Only the layout
    step (`apply_layout`) goes through the swap."""
    dtype = as_dtype(dtype)
    require_usable_dtype(model.device, dtype)
    copy_ = copy.deepcopy(model).to(dtype)
    apply_layout(copy_)
    return copy_
