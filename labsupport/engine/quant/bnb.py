"""bitsandbytes layers as a peer to labsupport's own int8/int4 layers.

Introduced in notebook 04 (quantization).

* "int8": ``bnb.nn.Linear8bitLt`` (LLM.int8(), Dettmers et al. 2022): int8
  weights with one scale per row; with ``threshold=6.0``, input columns holding
  an outlier above 6 are multiplied in 16-bit instead ("mixed-precision
  decomposition").
* "nf4" / "fp4": ``bnb.nn.Linear4bit`` (QLoRA, Dettmers et al. 2023): 4-bit
  weights in blocks of 64 with an absmax per block (itself quantized to 8 bits,
  "double quantization"); NF4's 16 levels are spaced like a normal distribution.

Both are built from the same weights as the nn.Linear they replace, on the
model's device. bitsandbytes 0.50 runs all three on a CPU (checked on the
course's 2-core AMD CPU): LLM.int8() through its own CPU ops, the 4-bit layers
by dequantizing in PyTorch unless the optional ``kernels`` package supplies a
fused CPU kernel (bitsandbytes logs "Failed to load CPU gemm_4bit_forward from
kernels-community" when it is absent). Older releases raise on a CPU; that
becomes a one-sentence `LabError`.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn

from ...errors import LabError, first_line, require_package

KINDS = ("int8", "nf4", "fp4")


def bnb_module():
    """bitsandbytes, imported on first use (it is optional). Notebook 04 (quantization)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*")   # its own, not ours
        return require_package("bitsandbytes", feature="bitsandbytes quantization")


@torch.no_grad()
def bnb_linear(linear: nn.Linear, kind: str) -> nn.Module:
    """An nn.Linear -> bitsandbytes' Linear8bitLt ("int8") or Linear4bit ("nf4", "fp4").
    Notebook 04 (quantization)."""
    if kind not in KINDS:
        raise LabError(f"Unknown bitsandbytes method {kind!r}; use one of {', '.join(KINDS)}.")
    bnb = bnb_module()
    device = linear.weight.device
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*")
            module = _build(bnb, linear, kind)
    except LabError:
        raise
    except Exception as error:                    # noqa: BLE001 - an unsupported device or version
        reason = first_line(error)
        raise LabError(f"bitsandbytes {kind} cannot run on {device.type} with bitsandbytes "
                       f"{getattr(bnb, '__version__', '?')} ({reason}); use method 'int8' or 'int4' instead.") from None
    return module


def _build(bnb, linear: nn.Linear, kind: str) -> nn.Module:
    """The bitsandbytes layer with `linear`'s weights, moved to its device (which quantizes)."""
    weight, device = linear.weight.detach(), linear.weight.device
    has_bias = linear.bias is not None
    # bitsandbytes 0.50: Linear8bitLt(input_features, output_features, bias, has_fp16_weights,
    # threshold, device) and Linear4bit(..., compute_dtype, quant_type, device); both quantize when
    # their Int8Params / Params4bit weight is moved to the device. bitsandbytes 0.50's installation
    # guide: CUDA needs compute capability 6.0+ for NF4/FP4 and 7.5+ for LLM.int8() (a T4 runs both);
    # its PyPI wheels are built for sm60-sm90. What it cannot run raises here, and bnb_linear says why.
    if kind == "int8":
        module = _fp16_inputs(bnb)(linear.in_features, linear.out_features, bias=has_bias,
                                   has_fp16_weights=False, threshold=6.0, device="meta")
        module.weight = bnb.nn.Int8Params(weight.clone(), requires_grad=False, has_fp16_weights=False)
    else:
        module = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                                   compute_dtype=weight.dtype, quant_type=kind, device="meta")
        module.weight = bnb.nn.Params4bit(weight.clone(), requires_grad=False, quant_type=kind)
    if has_bias:
        module.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    module = module.to(device)                    # quantization happens on this move
    # inference only: Linear8bitLt reads `training` on every call (MatmulLtState.is_training
    # re-quantizes the weight in training mode), Linear4bit repacks for the CPU only when not
    # training; nn.Module's default is training mode
    module.eval().requires_grad_(False)
    module(torch.zeros(1, linear.in_features, dtype=weight.dtype, device=device))   # does it run here?
    return module


@functools.cache
def _fp16_inputs(bnb):
    """bitsandbytes' Linear8bitLt, casting its inputs to fp16 itself and the output back.

    LLM.int8() quantizes fp16 activations whatever it is given: bitsandbytes 0.50's
    `MatMul8bitLt.forward` casts anything else and logs "inputs will be cast from ... to
    float16" on every call (every layer of every decode step). Casting first computes exactly
    the same and logs nothing. Notebook 04 (quantization)."""

    class Linear8bitLtFp16Inputs(bnb.nn.Linear8bitLt):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x.to(torch.float16)).to(x.dtype)

    return Linear8bitLtFp16Inputs


@torch.no_grad()
def bnb_roundtrip(w: torch.Tensor, kind: str = "nf4") -> torch.Tensor:
    """w quantized by bitsandbytes' 4-bit format (blocks of 64) and dequantized again.
    Notebook 04 (quantization)."""
    bnb = bnb_module()
    if kind not in ("nf4", "fp4"):
        raise LabError(f"bnb_roundtrip takes 'nf4' or 'fp4', got {kind!r}.")
    packed, state = bnb.functional.quantize_4bit(w.float().contiguous(), blocksize=64, quant_type=kind)
    return bnb.functional.dequantize_4bit(packed, state, quant_type=kind).float()
