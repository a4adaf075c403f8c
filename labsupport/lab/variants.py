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
    ("float", "int8", "int4"), each made on first use and then reused.

    Introduced in notebook 03 (mixed precision); notebooks 00 and 07 and the benchmark
    reuse it. model: the model every other precision is cast from (`precision.cast_model`);
    it is itself the variant of its own dtype. models: variants made elsewhere, {dtype:
    model}, kept as given (e.g. each loaded from disk in its dtype). factory: dtype ->
    model, called once per missing precision instead of casting. Without `model` and
    `factory`, asking for a precision that was not given is one sentence.
    """

    def __init__(self, model: torch.nn.Module | None = None, models: dict | None = None,
                 factory: Callable[[torch.dtype], torch.nn.Module] | None = None):
        self.base, self.factory = model, factory
        self._made: dict[tuple[str, str], torch.nn.Module] = {}
        for dtype, given in (models or {}).items():
            self._made[(dtype_name(dtype), FLOAT)] = given
        if model is not None:
            self._made.setdefault((dtype_name(model.dtype), FLOAT), model)

    def get(self, precision="float32", weights: str = FLOAT) -> torch.nn.Module:
        """The model in `precision` (any spelling `hardware.as_dtype` reads) with `weights`
        ("float", or "int8"/"int4": that precision's model quantized, groups of 32, with the
        kernels used in ``.kernels``). Made on first use, the same object afterwards."""
        key = (dtype_name(precision), weights)
        if key not in self._made:
            self._made[key] = self._float(key[0]) if weights == FLOAT else self._quantized(key[0], weights)
        return self._made[key]

    def _float(self, name: str) -> torch.nn.Module:
        if self.factory is not None:
            return self.factory(as_dtype(name))
        if self.base is None:
            raise LabError(f"No {name} model was given and there is none to cast it from; "
                           "pass a model for each precision, or one model to cast.")
        return cast_model(self.base, name)

    def _quantized(self, name: str, weights: str) -> torch.nn.Module:
        from ..engine.quant import quantize_model
        quantized = copy.deepcopy(self.get(name))
        handle = quantize_model(quantized, weights, group_size=32)
        quantized.kernels = handle.kernels               # e.g. {"fast": 211}: shown in notes
        return quantized

    def names(self) -> list[str]:
        """The precisions of the float variants made (or given) so far, in the order they came."""
        return [name for name, weights in self._made if weights == FLOAT]

