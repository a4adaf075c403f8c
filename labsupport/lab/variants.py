"""One model in each precision and weight format, each built once and shared.

Introduced in notebook 03 (mixed precision); notebooks 00 and 07 and the benchmark
reuse it.

Comparing precisions or stacking techniques needs the same model several times
over: in float32, in bfloat16 or float16 (`precision.cast_model`: a copy in that
dtype, laid out for the fastest kernel on its device), and with int8 or int4
weights on top (`quantize.quantize_model`). `ModelVariants` makes each of these
the first time it is asked for and hands back the same object afterwards, so a
notebook, its explorer and its claims table all time and count the same copies.
Keys are canonical names (`hardware.dtype_name`): "fp32", "float32" and
torch.float32 all name the "float32" variant.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ..errors import LabError
from ..engine.hardware import as_dtype, dtype_name
from ..engine.precision import cast_model

FLOAT = "float"                      # the weight format of a plain (unquantized) variant


class ModelVariants:
    """The model in each precision ("float32", "bfloat16", "float16") and weight format
    ("float", or a method of `quant.METHODS`: "int8", "int4", "bnb-int8", ...), each made on
    first use and then reused.

    Introduced in notebook 03 (mixed precision); notebooks 00 and 07 and the benchmark
    reuse it (the benchmark keeps one per run: every section and draft gets its models here).
    model: the model every other precision is cast from (`precision.cast_model`); it is
    itself the variant of its own dtype. models: variants made elsewhere, {dtype: model},
    kept as given (e.g. each loaded from disk in its dtype). factory: dtype -> model, called
    once per missing precision instead of casting. Without `model` and `factory`, asking for
    a precision that was not given is one sentence.
    """

    def __init__(self, model: torch.nn.Module | None = None, models: dict | None = None,
                 factory: Callable[[torch.dtype], torch.nn.Module] | None = None):
        self.base, self.factory = model, factory
        self._made: dict[tuple, torch.nn.Module] = {}
        self._handles: dict[tuple, object] = {}
        for dtype, given in (models or {}).items():
            self._made[(dtype_name(dtype), FLOAT, None)] = given
        if model is not None:
            self._made.setdefault((dtype_name(model.dtype), FLOAT, None), model)

    def _key(self, precision, weights: str, group_size: int) -> tuple:
        """(precision, weights, group size): the group size only for a method that takes one."""
        if weights == FLOAT:
            return dtype_name(precision), FLOAT, None
        from ..engine.quant import find_method
        return dtype_name(precision), weights, group_size if find_method(weights).group_size else None

    def get(self, precision="float32", weights: str = FLOAT, group_size: int = 32) -> torch.nn.Module:
        """The model in `precision` (any spelling `hardware.as_dtype` reads) with `weights`
        ("float", or a quantization method: that precision's model, copied and quantized,
        int4 in groups of `group_size`). Made on first use, the same object afterwards."""
        key = self._key(precision, weights, group_size)
        if key not in self._made:
            self._made[key] = self._float(key[0]) if weights == FLOAT else self._quantized(key)
        return self._made[key]

    def handle(self, precision="float32", weights: str = "int4", group_size: int = 32):
        """What quantizing the variant did (its `quant.QuantizedHandle`: ``kernels`` per layer,
        ``describe()``, ``fallbacks``), the variant made first if need be. Keep it applied:
        restoring it would turn the shared variant back into a float copy."""
        key = self._key(precision, weights, group_size)
        if weights == FLOAT:
            raise LabError("A float variant has no quantization handle; ask for weights='int8', 'int4', ...")
        self.get(precision, weights, group_size)
        return self._handles[key]

    def _float(self, name: str) -> torch.nn.Module:
        if self.factory is not None:
            return self.factory(as_dtype(name))
        if self.base is None:
            raise LabError(f"No {name} model was given and there is none to cast it from; "
                           "pass a model for each precision, or one model to cast.")
        return cast_model(self.base, name)

    def _quantized(self, key: tuple) -> torch.nn.Module:
        from ..engine.quant import quantize_model
        precision, weights, group_size = key
        quantized = copy.deepcopy(self.get(precision))
        self._handles[key] = quantize_model(quantized, weights, group_size=group_size or 32)
        return quantized

    def names(self) -> list[str]:
        """The precisions of the float variants made (or given) so far, in the order they came."""
        return [name for name, weights, _ in self._made if weights == FLOAT]
