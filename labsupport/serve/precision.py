"""What the server serves: the model's precision and the kernel its matmuls run.

Introduced in notebook 09 (serving over HTTP). ``python -m labsupport serve --dtype bfloat16``
loads the model in that precision (refused in one sentence where the hardware cannot run it,
`hardware.require_usable_dtype`); ``--quantize int8|int4`` then swaps its linear layers for the
quantized ones of notebook 04 (`quant.quantize_model`; int4 runs our W4A8 kernel on a CPU
that can build it). `/v1/models` says which (`describe`), so that a comparison between
servers never mixes precisions unknowingly.
"""

from __future__ import annotations

from ..engine import quant
from ..engine.hardware import as_dtype, dtype_name, require_usable_dtype
from ..engine.quant.kernels import Int4Linear, Int8Linear
from ..errors import LabError

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZE = ("int8", "int4")


def served_dtype(device, dtype: str, quantize: str | None):
    """The torch dtype to load in, after checking both choices; one sentence (a LabError) for a
    name this server does not take or a dtype the device cannot run. Notebook 09 (serving over HTTP)."""
    if dtype not in DTYPES:
        raise LabError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
    if quantize not in (None,) + QUANTIZE:
        raise LabError(f"--quantize must be one of {', '.join(QUANTIZE)} (or left out), got {quantize!r}.")
    require_usable_dtype(device, dtype)
    return as_dtype(dtype)


def quantize_for_serving(model, quantize: str | None):
    """Swap the model's linear layers for `quantize`'s ("int8", "int4": group size 32, the
    default kernel, W4A8 on a CPU), in place; nothing for None. Notebook 09 (serving over HTTP)."""
    if quantize is not None:
        quant.quantize_model(model, quantize)
    return model


def describe(model) -> dict:
    """The served model's precision and kernel, as /v1/models reports them: {"dtype", "weights",
    "kernel"}. Notebook 09 (serving over HTTP)."""
    layer = next((m for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))), None)
    dtype = dtype_name(model.dtype)
    if layer is None:
        return {"dtype": dtype, "weights": dtype, "kernel": "dense matmul"}
    weights = "int8" if isinstance(layer, Int8Linear) else "int4"
    return {"dtype": dtype, "weights": weights, "kernel": quant.kernel_description(layer)}


def precision_words(described: dict) -> str:
    """`describe`'s dict (or /v1/models' "precision") in a few words for a table's row: "float32
    weights", or "int4 weights, <the kernel>". Notebook 09 (serving over HTTP)."""
    if described["weights"] == described["dtype"]:
        return f"{described['dtype']} weights"
    return f"{described['weights']} weights, {described['kernel']}"
