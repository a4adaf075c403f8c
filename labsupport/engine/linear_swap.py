"""The linear-layer swap: one extension point, with an undo handle.

Introduced in notebook 04 (quantization); notebook 00's weight layout uses it too.

Almost all of a decoder's weights, and so almost all the bytes a decode step
reads, sit in its ``nn.Linear`` layers. Several techniques change only those
layers and leave the rest of the engine alone:

* quantization replaces each layer by one that stores int8 or int4 weights
  (``quantize.quantized_replacement``), or by a bitsandbytes layer;
* the weight layout keeps each layer but stores its weight row- or column-major
  (``models.layout.apply_layout``).

`swap_linears` walks the model's float ``nn.Linear`` layers once, asks a
replacement function for each one's substitute (or None to keep it), swaps the
substitutes in, optionally re-stores the kept layers' weights (``layout``), and
returns a `SwapHandle`: ``restore()`` puts back the very same module and weight
objects, ``apply()`` swaps the substitutes in again without rebuilding them, and
``with handle:`` applies on entry and restores on exit, also when the block
raises. A replacement that raises leaves the model as it was.

A layout is done in place, not as a swap: the weight ``Parameter`` is kept and
only its storage changes, so a weight tied to the embedding stays tied and a
new module never doubles it. What the handle remembers to undo it is the
weight's original strides, not a second copy of its values.

Casting to 16 bits is not a linear swap: `precision.cast_model` copies the whole
model (embeddings, norms and buffers too), so that every operation runs in 16 bits.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn as nn

Replacement = Callable[[str, nn.Linear], "nn.Module | None"]
Layout = Callable[[torch.Tensor], torch.Tensor]


class Swap(NamedTuple):
    """One swapped layer: `parent.attribute` was `original` and is now `replacement`.
    Notebook 04 (quantization)."""
    name: str
    parent: nn.Module
    attribute: str
    original: nn.Module
    replacement: nn.Module


class Restored(NamedTuple):
    """One weight re-stored in place: its Parameter and the strides it had before.
    Notebook 00 (where the time goes), for the weight layout."""
    name: str
    weight: nn.Parameter
    stride: tuple[int, ...]


def float_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(dotted name, module) of every nn.Linear with a floating-point weight, in module order.

    Introduced in notebook 04 (quantization). bitsandbytes' layers subclass nn.Linear
    with integer weights, and labsupport's own quantized layers are not nn.Linear:
    both are skipped, so a swap never wraps an already swapped layer."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module.weight.is_floating_point()]


def _restride(weight: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """The same values stored with the given strides (an exact copy)."""
    out = torch.empty_strided(weight.shape, stride, dtype=weight.dtype, device=weight.device)
    return out.copy_(weight)


class SwapHandle:
    """What `swap_linears` did to a model, and how to undo it.

    Introduced in notebook 04 (quantization). ``swaps`` lists the swapped layers
    (`Swap`: name, parent, attribute, original, replacement); ``restored`` the kept
    layers whose weight storage the layout changed. ``restore()`` puts back the
    original modules and weight storage; ``apply()`` redoes the swap with the same
    replacement objects; ``with handle:`` applies on entry and restores on exit.
    """

    def __init__(self, model: nn.Module, swaps: list[Swap], restored: list[Restored],
                 layout: Layout | None = None):
        self.model, self.swaps, self.restored, self.layout = model, swaps, restored, layout
        self.applied = True

    @property
    def names(self) -> list[str]:
        """The dotted names of the swapped layers, in module order."""
        return [swap.name for swap in self.swaps]

    def apply(self) -> "SwapHandle":
        if self.applied:
            return self
        for swap in self.swaps:
            setattr(swap.parent, swap.attribute, swap.replacement)
        with torch.no_grad():
            for entry in self.restored:
                entry.weight.data = self.layout(entry.weight.data)
        self.applied = True
        return self

    def restore(self) -> None:
        with torch.no_grad():
            for entry in reversed(self.restored):
                if entry.weight.stride() != entry.stride:
                    entry.weight.data = _restride(entry.weight.data, entry.stride)
        for swap in reversed(self.swaps):
            setattr(swap.parent, swap.attribute, swap.original)
        self.applied = False

    def __enter__(self) -> "SwapHandle":
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.restore()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(swapped={len(self.swaps)}, re-stored={len(self.restored)}, "
                f"applied={self.applied})")


def swap_linears(model: nn.Module, replacement: Replacement | None = None, *,
                 layout: Layout | None = None) -> SwapHandle:
    """Swap `model`'s float nn.Linear layers in place; returns the `SwapHandle` that undoes it.

    Introduced in notebook 04 (quantization). replacement(name, linear) returns the
    module to put in the layer's place (same inputs and outputs), or None to keep
    the layer. layout(weight) returns a kept layer's weight (out, in) with the same
    values in the storage wanted (e.g. `models.layout.relayout`); it is applied in
    place, once per weight even when layers share it. Both run under no_grad.
    """
    handle = SwapHandle(model, [], [], layout)
    seen: set[int] = set()
    try:
        with torch.no_grad():
            for name, linear in float_linears(model):
                new = replacement(name, linear) if replacement is not None else None
                if new is not None:
                    parent_name, _, attribute = name.rpartition(".")
                    parent = model.get_submodule(parent_name)
                    handle.swaps.append(Swap(name, parent, attribute, linear, new))
                    setattr(parent, attribute, new)
                elif layout is not None and id(linear.weight) not in seen:
                    seen.add(id(linear.weight))
                    old, stored = linear.weight.data, layout(linear.weight.data)
                    if stored.data_ptr() != old.data_ptr() or stored.stride() != old.stride():
                        handle.restored.append(Restored(name, linear.weight, old.stride()))
                        linear.weight.data = stored
    except BaseException:
        handle.restore()                          # a failed swap leaves the model as it was
        raise
    return handle
