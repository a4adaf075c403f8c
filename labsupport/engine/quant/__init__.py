"""Weight-only quantization: int8 and int4 weights, float activations.

Introduced in notebook 04 (quantization).

A decode step at batch 1 reads every weight once for one token's worth of
arithmetic (notebook 00), so storing the weights in fewer bits reads fewer
bytes and can make the step faster. The activations stay in floating point;
each weight is stored as a small integer plus a scale shared by many weights.

The parts, in the order of the idea; notebook 04 reads them all from here
(``from labsupport.engine import quant as Q``):

* formats: the number formats (int8 absmax per row, int4 in groups,
  two 4-bit values per byte); what they cost is measured in the lab
  (`lab.quantization_error.weight_error_stats`);
* kernels: `Int8Linear` and `Int4Linear`, whose speed depends on the
  kernel (fast: dequantize inside the matmul; reference: dequantize, then matmul);
* this module: the methods, a small registry (`METHODS`: name -> `Method`, its
  builder per kernel and whether it takes a group size), and a whole model's layers
  quantized through the linear swap (`linear_swap.swap_linears`):
  `quantized_replacement` is the replacement it takes, `quantize_model` the one call
  most code uses;
* lab/quality.py (above the engine): bytes a decode step reads, perplexity, top-1 agreement.

`quantize_model` swaps a model's ``nn.Linear`` modules in place and returns a
handle that puts the originals back (``handle.restore()``, or use it as a
context manager). bitsandbytes' LLM.int8() and NF4/FP4 layers (Dettmers et al.
2022, 2023) plug in the same way (see bnb.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from ...errors import LabError
from ..linear_swap import SwapHandle, swap_linears
from .formats import (dequantize_int4, dequantize_int8, pack_int4, quantize_int4_groupwise,
                      quantize_int8_absmax, require_group_size, unpack_int4)
from .kernels import Int4Linear, Int8Linear, kernel_description

# (the nn.Linear to replace, the group size, whether to warn on a fallback) -> its quantized replacement
Builder = Callable[[nn.Linear, int, bool], nn.Module]


@dataclass(frozen=True)
class Method:
    """One quantization method of the registry (`METHODS`). Introduced in notebook 04 (quantization).

    kernels: kernel name -> the `Builder` of one layer ("auto", the default, first);
    group_size: whether the method takes a group size (int4: weights sharing a scale and a
    zero); the others ignore it; requires: called once before the first layer is swapped
    (an optional package's import, so that a missing one is one sentence), or None.
    """

    kernels: dict[str, Builder]
    group_size: bool = False
    requires: Callable[[], object] | None = None

    def builder(self, name: str, kernel: str) -> Builder:
        """The builder of `kernel`, or one sentence naming the kernels this method has."""
        if kernel not in self.kernels:
            raise LabError(f"Method {name!r} has no kernel {kernel!r}; use one of {', '.join(self.kernels)}.")
        return self.kernels[kernel]


def _int8(kernel: str) -> Builder:
    return lambda linear, group_size, warn: Int8Linear.from_linear(linear, kernel=kernel, warn=warn)


def _int4(kernel: str) -> Builder:
    return lambda linear, group_size, warn: Int4Linear.from_linear(linear, group_size=group_size, kernel=kernel,
                                                                   warn=warn)


def _bnb(kind: str) -> Builder:
    def build(linear, group_size, warn):
        from .bnb import bnb_linear
        return bnb_linear(linear, kind)
    return build


def _bnb_importable():
    from .bnb import bnb_module
    return bnb_module()


# The registry: a new kernel of a method is one more line in its `kernels`.
METHODS: dict[str, Method] = {
    "int8": Method(kernels={"auto": _int8("auto"), "fast": _int8("fast"), "reference": _int8("reference")}),
    "int4": Method(kernels={"auto": _int4("auto"), "w4a8": _int4("w4a8"), "fast": _int4("fast"),
                            "reference": _int4("reference")}, group_size=True),
    "bnb-int8": Method(kernels={"auto": _bnb("int8")}, requires=_bnb_importable),
    "bnb-nf4": Method(kernels={"auto": _bnb("nf4")}, requires=_bnb_importable),
    "bnb-fp4": Method(kernels={"auto": _bnb("fp4")}, requires=_bnb_importable),
}

__all__ = ["METHODS", "Method", "QuantizedHandle", "find_method", "quantize_linear", "quantized_replacement",
           "quantize_model", "quantize_int8_absmax", "dequantize_int8", "require_group_size",
           "quantize_int4_groupwise", "dequantize_int4", "pack_int4", "unpack_int4",
           "Int8Linear", "Int4Linear", "kernel_description"]


def find_method(name: str) -> Method:
    """The registered `Method` called `name`, or one sentence listing them. Notebook 04 (quantization)."""
    if name not in METHODS:
        raise LabError(f"Unknown quantization method {name!r}; use one of {', '.join(METHODS)}.")
    return METHODS[name]


class QuantizedHandle(SwapHandle):
    """What `quantize_model` did, and how to undo it.

    Introduced in notebook 04 (quantization). A `linear_swap.SwapHandle`:
    ``restore()`` puts the original modules back; ``apply()`` swaps the quantized
    ones in again (no re-quantizing); ``with handle:`` applies on entry and
    restores on exit. It also says what was done: ``method``, ``group_size``
    (int4 only), ``kernels`` per layer, and ``fallbacks``: [(layer name, reason)]
    for the layers that run the reference kernel.
    """

    def __init__(self, swap: SwapHandle, method: str, group_size: int | None, fallbacks: list):
        super().__init__(swap.model, swap.swaps, swap.restored, swap.layout)
        self.method, self.group_size, self.fallbacks = method, group_size, fallbacks

    @property
    def kernels(self) -> dict[str, int]:
        """How many layers run each kernel, e.g. {"fast": 210} or {"bitsandbytes": 211}."""
        counts: dict[str, int] = {}
        for swap in self.swaps:
            kind = getattr(swap.replacement, "kernel", "bitsandbytes")
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    @property
    def kernel_names(self) -> dict[str, int]:
        """How many layers run each kernel, in words (`kernels.kernel_description`),
        e.g. {"fused int4 kernel (aten._weight_int4pack_mm_for_cpu, bf16 arithmetic)": 211}."""
        counts: dict[str, int] = {}
        for swap in self.swaps:
            name = kernel_description(swap.replacement)
            counts[name] = counts.get(name, 0) + 1
        return counts

    def describe(self) -> str:
        """The kernels in one phrase: the most common one, and how many layers run another."""
        names = sorted(self.kernel_names.items(), key=lambda item: -item[1])
        if not names:
            return "no layer swapped"
        main, others = names[0][0], sum(count for _, count in names[1:])
        return main + (f" ({others} of {len(self.swaps)} layers: another kernel)" if others else "")

    def __repr__(self) -> str:
        return (f"QuantizedHandle(method={self.method!r}, layers={len(self.swaps)}, "
                f"kernels={self.kernels}, applied={self.applied})")


def quantize_linear(linear: nn.Linear, method: str, group_size: int = 32, kernel: str = "auto",
                    warn: bool = True) -> nn.Module:
    """One nn.Linear -> its quantized replacement (same inputs, same outputs, fewer bytes):
    the registry's builder (`METHODS`) for this method and kernel.

    Introduced in notebook 04 (quantization)."""
    return find_method(method).builder(method, kernel)(linear, group_size, warn)


def quantized_replacement(method: str, group_size: int = 32, kernel: str = "auto",
                          include_lm_head: bool = True):
    """The replacement `linear_swap.swap_linears` takes to quantize: (name, linear) ->
    `quantize_linear(linear, ...)`, or None for the output layer when `include_lm_head` is False.

    Introduced in notebook 04 (quantization). Every argument is checked here, before
    the first layer is swapped, so a mistake never leaves a half-quantized model.
    """
    spec = find_method(method)
    build = spec.builder(method, kernel)
    if spec.group_size:
        require_group_size(group_size)
    if spec.requires is not None:
        spec.requires()

    def replace(name: str, linear: nn.Linear) -> nn.Module | None:
        if not include_lm_head and name.split(".")[-1] == "lm_head":
            return None
        return build(linear, group_size, False)

    return replace


def quantize_model(model: nn.Module, method: str, group_size: int = 32, kernel: str = "auto",
                   include_lm_head: bool = True) -> QuantizedHandle:
    """Swap every nn.Linear of `model` for a quantized one, in place; returns the handle
    that undoes it (``handle.restore()`` or ``with quantize_model(...):``).

    Introduced in notebook 04 (quantization). method: a name of `METHODS`: "int8",
    "int4" (with `group_size`), "bnb-int8", "bnb-nf4" or "bnb-fp4". kernel: one of the
    method's kernels ("auto", "fast" or "reference" for ours, and "w4a8" for int4; "auto" for
    bitsandbytes).
    The output projection tied to the embedding is quantized as its own module; the
    embedding keeps the float weight for lookups.
    It is `swap_linears(model, quantized_replacement(...))`, plus one warning when
    layers fall back to the reference kernel.
    """
    swap = swap_linears(model, quantized_replacement(method, group_size, kernel, include_lm_head))
    fallbacks = [(s.name, s.replacement.fallback_reason) for s in swap.swaps
                 if getattr(s.replacement, "fallback_reason", None)]
    if fallbacks and kernel != "reference":
        warnings.warn(f"{len(fallbacks)} of {len(swap.swaps)} layers use the slower reference kernel because the "
                      f"fast {method} kernel is not usable here ({fallbacks[0][1]}).", stacklevel=2)
    _warn_w4a8_unused(swap.swaps, kernel, group_size)
    return QuantizedHandle(swap, method, group_size if METHODS[method].group_size else None, fallbacks)


def _warn_w4a8_unused(swaps, kernel: str, group_size: int) -> None:
    """One warning naming how many layers the W4A8 kernel did not take, why (the first one's
    reason) and which kernels took them; none where "auto" skips it by design (off the CPU,
    another group size). A kernel asked for by name ("w4a8") that falls back always warns."""
    moved = [s for s in swaps if getattr(s.replacement, "w4a8_unused", None) and s.replacement.kernel != "w4a8"]
    if kernel == "auto":
        moved = [s for s in moved if group_size == 32 and "CPU kernel" not in s.replacement.w4a8_unused]
    if moved:
        took: dict[str, int] = {}
        for s in moved:
            took[s.replacement.kernel] = took.get(s.replacement.kernel, 0) + 1
        warnings.warn(f"The W4A8 kernel does not hold {len(moved)} of {len(swaps)} layers ({moved[0].name}: "
                      f"{moved[0].replacement.w4a8_unused}); they run the next kernel that holds them instead "
                      f"({', '.join(f'{k}: {n}' for k, n in took.items())}).", stacklevel=3)
