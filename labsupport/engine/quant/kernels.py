"""Quantized linear layers: int8 and int4 weights, float activations, and their kernels.

Introduced in notebook 04 (quantization).

Whether fewer bytes become more speed depends on the kernel: a matmul that
first dequantizes the whole weight to float (``kernel="reference"``) reads the
small weight but writes and reads a float copy, and is slower than plain fp32.
The ``"fast"`` kernels dequantize inside the matmul, tile by tile:

* CPU: ``torch.ops.aten._weight_int8pack_mm`` (int8 weights, bf16 activations)
  and ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (weights repacked by
  ``_convert_weight_to_int4pack_for_cpu``; group sizes 32, 64, 128, 256).
* CPU, int4 in groups of 32: our own W4A8 kernel (w4a8.py, w4a8.cpp), which quantizes
  each activation row to int8 and multiplies with integer dot products, as llama.cpp
  does; the default where it builds, else the aten kernel above, with one sentence why.
* CUDA: int8 under ``torch.compile``, written as a reduction for decode-sized batches so
  that the conversion fuses into it (`_int8_weight_only_mm` says why a matmul would not),
  and int4 through
  ``torch.ops.aten._weight_int4pack_mm`` (the "tinygemm" kernel).

Both int4 kernels expect scales and zeros as one (in / group, out, 2) tensor
and compute w = (q - 8) * scale + zero', so our zero (the group minimum) is
passed as zero' = zero + 8 * scale. A kernel that is missing or fails on a
layer falls back to the reference path with one warning sentence.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import LabError, first_line
from .formats import (dequantize_int4, dequantize_int8, pack_int4, quantize_int4_groupwise,
                      quantize_int8_absmax, require_group_size, unpack_int4)
from .w4a8 import BLOCK as W4A8_BLOCK
from .w4a8 import default_path, gemm_min_rows, pack_q4_1, supported_paths, unpack_q4_1, w4a8_unavailable

KERNELS = ("auto", "fast", "reference")
INT4_KERNELS = ("auto", "w4a8", "fast", "reference")     # int4 has one more: our own W4A8 kernel (CPU)
KERNEL_INT4_GROUP_SIZES = (32, 64, 128, 256)


def require_kernel(kernel: str, kernels: tuple[str, ...] = KERNELS) -> None:
    """Refuse a kernel name other than one of `kernels`. Notebook 04 (quantization)."""
    if kernel not in kernels:
        raise LabError(f"Unknown kernel {kernel!r}; use one of {', '.join(kernels)}.")


def _warn_fallback(what: str, reason: str) -> None:
    warnings.warn(f"The fast {what} kernel is not usable here ({reason}); using the slower "
                  f"dequantize-then-matmul reference instead.", stacklevel=3)


def _check_close(fast: torch.Tensor, reference: torch.Tensor, tolerance: float = 0.03) -> None:
    """Raise unless a kernel's output matches the reference within `tolerance` of its scale
    (bf16 activations carry 8 bits of mantissa, so exact equality is not expected)."""
    error = (fast.float() - reference.float()).abs().max().item()
    size = reference.float().abs().max().item()
    if not error <= tolerance * size + 1e-4:
        raise RuntimeError(f"its output differs from the reference by {error:.3g} (scale {size:.3g})")


INT8_REDUCTION_ROWS = 8     # up to this many rows (decode batches), int8 on CUDA is one fused reduction


def _int8_weight_only_mm(x, q, scales):
    """x (M, in) @ q.T (in, out), scaled per output channel, for torch.compile on CUDA.

    Few rows (a decode step): multiply and sum over `in` in float32, as a reduction. Inductor
    always fuses a reduction's pointwise producers into it (here the int8 -> float conversion
    and the multiply), so this is ONE kernel that reads the weight once, as int8, and never
    writes a float copy: the point of int8 at batch 1. Written as a matmul instead, it is not:
    inductor calls cuBLAS for the product and converts the weight in a kernel of its own
    first (torch 2.13's `use_mixed_mm`, which gpt-fast set for a fused kernel, is "DEPRECATED.
    This setting is ignored." in torch/_inductor/config.py), writing and re-reading a float
    weight, about 2.25x fp32's bytes for int8's. Eagerly this form would build an (M, out, in)
    tensor, so it only runs compiled (`_compiled_int8_linear`).
    More rows (a batch that computes): the matmul, where the conversion's extra bytes cost
    little against the arithmetic.
    """
    if x.shape[0] <= INT8_REDUCTION_ROWS:
        products = x.float()[:, None, :] * q.float()[None, :, :]                   # (M, out, in), never stored
        return (products.sum(dim=-1) * scales.float()).to(x.dtype)                 # (M, out)
    return F.linear(x, q.to(x.dtype)) * scales.to(x.dtype)


@functools.cache
def _compiled_int8_linear():
    """`_int8_weight_only_mm` through torch.compile, built once on first use (CUDA).

    inductor generates Triton kernels, and Triton needs compute capability 7.0 or newer (a
    T4's 7.5 is fine, in fp16 activations); where compiling fails (an older GPU, no compiler)
    `Int8Linear._fast` falls back with the error's first line."""
    return torch.compile(_int8_weight_only_mm, dynamic=True)


def int4_kernel_unavailable(device, group_size: int, in_features: int) -> str | None:
    """Why the fused int4 kernel cannot run here (one sentence), or None when it can.

    Introduced in notebook 04 (quantization). The CUDA kernel (tinygemm) has tensor-core
    code for compute capability 8.0 and newer only: on a T4 (7.5) or a V100 (7.0) its
    launch has no code to run, so it is never tried there. Both kernels take group sizes
    32, 64, 128 or 256, and tinygemm wants in_features in whole tiles of 32 columns.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        return f"no int4 kernel for device {device.type}"
    if group_size not in KERNEL_INT4_GROUP_SIZES:
        return f"the kernel takes group sizes {KERNEL_INT4_GROUP_SIZES}, not {group_size}"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)      # (device=None) -> (major, minor)
        if (major, minor) < (8, 0):
            return (f"the tinygemm int4 kernel needs compute capability 8.0 or newer, and this "
                    f"{torch.cuda.get_device_name(device)} has {major}.{minor}")
        if in_features % 32:
            return f"in_features {in_features} is not a multiple of 32"
    return None


class _QuantizedLinear(nn.Module):
    """What Int8Linear and Int4Linear share: shapes, bias, kernel choice, 2-D reshaping.
    Weights live in buffers, so `Transformer.weight_bytes()` counts the quantized size."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)
        self.kernel = "reference"
        self.fallback_reason: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "w4a8":               # Int4Linear only: the kernel takes (..., in) as it is
            y = self._w4a8(x)                                                  # (..., out)
        else:
            x2 = x.reshape(-1, self.in_features)                               # (M, in)
            y = self._fast(x2) if self.kernel == "fast" else self._reference(x2)
            y = y.reshape(*x.shape[:-1], self.out_features)                    # (..., out)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


class Int8Linear(_QuantizedLinear):
    """nn.Linear with int8 weights (absmax, per output channel); activations stay float.

    Introduced in notebook 04 (quantization). Buffers: weight_int8 (out, in) int8,
    scales (out,), bias. kernel "fast": `_weight_int8pack_mm` on CPU (bf16 activations),
    a compiled dequantize-matmul on CUDA; "reference": dequantize, then F.linear.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str = "auto", warn: bool = True) -> "Int8Linear":
        require_kernel(kernel)
        self = cls(linear)
        q, scale = quantize_int8_absmax(linear.weight.detach())
        self.register_buffer("weight_int8", q)
        fast = kernel != "reference" and linear.weight.device.type in ("cpu", "cuda")
        on_cpu = linear.weight.device.type == "cpu"
        # the CPU kernel wants its scales in the activations' dtype (bf16)
        self.register_buffer("scales", scale.to(torch.bfloat16 if fast and on_cpu else torch.float32))
        if fast:
            self.kernel = "fast"
            if on_cpu:                               # CUDA is probed on first use (it compiles)
                self._probe(warn)
        elif kernel == "fast":
            self.fallback_reason = f"no int8 kernel for device {linear.weight.device.type}"
            if warn:
                _warn_fallback("int8", self.fallback_reason)
        return self

    def _probe(self, warn: bool) -> None:
        try:
            x = torch.randn(1, self.in_features, device=self.weight_int8.device)
            _check_close(self._fast_op(x), self._reference(x))
        except Exception as error:                   # noqa: BLE001 - any failure means: do not use it
            self._fall_back(first_line(error), warn)

    def _fall_back(self, reason: str, warn: bool = True) -> None:
        self.kernel, self.fallback_reason = "reference", reason
        if warn:
            _warn_fallback("int8", reason)

    def _fast_op(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight_int8, self.scales)
            return y.to(x.dtype)
        return _compiled_int8_linear()(x, self.weight_int8, self.scales)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self._fast_op(x)
        except Exception as error:                   # noqa: BLE001 - e.g. no compiler on this machine
            self._fall_back(first_line(error))
            return self._reference(x)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize_int8(self.weight_int8, self.scales, x.dtype))

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize_int8(self.weight_int8, self.scales)


class Int4Linear(_QuantizedLinear):
    """nn.Linear with int4 weights in groups (asymmetric, min/max); activations stay float,
    except in the W4A8 kernel, which quantizes them to int8 per block of 32 on the way.

    Introduced in notebook 04 (quantization). The buffers depend on the kernel:
    "reference" keeps our own layout (packed (out, in/2) uint8, scales and zeros
    (out, in/group)); "fast" keeps only aten's layout (weight_int4pack and
    scales_and_zeros (in/group, out, 2) in bf16); "w4a8" only its own (w4a8_packed
    (out, in/2) uint8, w4a8_scales and w4a8_mins (out, in/32) fp16: GGUF's Q4_1 block),
    so memory is never counted twice.

    kernel "auto" picks, in order, the first that holds the layer: "w4a8" (CPU, groups of 32,
    where the C++ kernel builds and float16 scales hold the weights; `w4a8_unused` says why not
    otherwise), "fast", "reference"; `kernel` says which one it took.

    A group size that does not divide in_features (128 on SmolLM2's 576) is
    handled as gpt-fast does: each row is padded with zeros to whole groups
    (``padded_in``), and so is every input; the padding costs memory, counted.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, kernel: str = "auto",
                    warn: bool = True) -> "Int4Linear":
        require_kernel(kernel, INT4_KERNELS)
        self = cls(linear)
        require_group_size(group_size)
        self.group_size = group_size
        self.w4a8_unused: str | None = None
        self.padded_in = -(-self.in_features // group_size) * group_size
        weight = F.pad(linear.weight.detach().float(), (0, self.padded_in - self.in_features))  # (out, padded_in)
        q, scales, zeros = quantize_int4_groupwise(weight, group_size)
        device = linear.weight.device
        reason = None
        if kernel in ("auto", "w4a8"):
            reason = self._build_w4a8(q, scales, zeros, device)
            if reason is None:
                return self
            self.w4a8_unused = reason
            if kernel == "w4a8" and warn:
                warnings.warn(f"The W4A8 kernel is not usable here ({reason}); using aten's fused int4 kernel "
                              f"or, without one, the reference.", stacklevel=2)
        if kernel != "reference":
            reason = self._build_fast(q, scales, zeros, device)
        if kernel == "reference" or reason is not None:
            self.kernel = "reference"
            self.register_buffer("packed", pack_int4(q))
            self.register_buffer("scales", scales)
            self.register_buffer("zeros", zeros)
            if reason is not None:
                self.fallback_reason = reason
                if warn:
                    _warn_fallback("int4", reason)
        return self

    def _build_w4a8(self, q, scales, zeros, device) -> str | None:
        """Pack for our W4A8 kernel and check it once; the reason it cannot run, or None."""
        if device.type != "cpu":
            return f"it is a CPU kernel and this layer is on {device.type}"
        if self.group_size != W4A8_BLOCK:
            return f"it takes groups of {W4A8_BLOCK}, not {self.group_size}"
        reason = w4a8_unavailable()
        if reason is not None:
            return reason
        try:
            # float16 scales and minimums: a layer that float16 cannot hold (beyond 65504, or so
            # small that they underflow) is refused here, and the next kernel takes it
            packed, w_scales, w_mins = pack_q4_1(q, scales, zeros)
            exact = dequantize_int4(q, scales, zeros)                             # (out, padded_in)
            lost = dequantize_int4(q, w_scales, w_mins).sub_(exact).abs_().max()
            if not lost <= 0.01 * max(-exact.min(), exact.max()):
                raise ValueError("its float16 scales lose this layer's weights (too small for float16)")
            del exact
            self.register_buffer("w4a8_packed", packed)
            self.register_buffer("w4a8_scales", w_scales)
            self.register_buffer("w4a8_mins", w_mins)
            self.kernel, self.w4a8_path = "w4a8", default_path()     # $LABSUPPORT_W4A8_PATH, else "auto"
            x = torch.randn(1, self.in_features, generator=torch.Generator().manual_seed(0))   # same choice each run
            _check_close(self._w4a8(x), F.linear(self._pad(x), self._w4a8_weight()))
            return None
        except Exception as error:                       # noqa: BLE001 - any failure: the next kernel
            for name in ("w4a8_packed", "w4a8_scales", "w4a8_mins"):
                self._buffers.pop(name, None)
            self.kernel = "reference"
            return first_line(error)

    def _build_fast(self, q, scales, zeros, device) -> str | None:
        """Repack for the device's kernel and check it once; the reason it cannot run, or None."""
        reason = int4_kernel_unavailable(device, self.group_size, self.padded_in)
        if reason is not None:
            return reason
        # the kernels want whole tiles of output rows: pad with zero rows, slice them off after
        padded_rows = -self.out_features % 64
        q, scales, zeros = (F.pad(t, (0, 0, 0, padded_rows)) for t in (q, scales, zeros))
        # kernel convention: w = (q - 8) * scale + zero'  =>  zero' = zero + 8 * scale
        scales_and_zeros = torch.stack([scales, zeros + 8 * scales], dim=-1)   # (out, G, 2)
        scales_and_zeros = scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16)  # (G, out, 2)
        try:
            if device.type == "cpu":
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
            else:
                # tinygemm (aten/src/ATen/native/cuda/int4mm.cu, torch 2.13):
                # _convert_weight_to_int4pack(in: uint8 (n, k/2) contiguous, innerKTiles in {2, 4, 8})
                # -> int32 (n/8, k/(innerKTiles*16), 32, innerKTiles/2); two values per byte, the even
                # column in the HIGH nibble; k*... must be a whole number of innerKTiles*16 columns.
                inner_k_tiles = next(t for t in (8, 4, 2) if self.padded_in % (16 * t) == 0)
                q_uint8 = (q[:, 0::2] << 4 | q[:, 1::2]).to(torch.uint8)           # (out, in/2)
                packed = torch.ops.aten._convert_weight_to_int4pack(q_uint8, inner_k_tiles)  # int32, 4-D
            self.register_buffer("weight_int4pack", packed)
            self.register_buffer("scales_and_zeros", scales_and_zeros)
            self.kernel = "fast"
            x = torch.randn(1, self.in_features, device=device)
            expected = F.linear(self._pad(x), dequantize_int4(q, scales, zeros))[:, :self.out_features]
            _check_close(self._fast(x), expected)
            return None
        except Exception as error:                       # noqa: BLE001 - any failure: use the reference
            for name in ("weight_int4pack", "scales_and_zeros"):
                self._buffers.pop(name, None)
            return first_line(error)

    def _w4a8_weight(self) -> torch.Tensor:
        """The float weight (out, padded_in) the W4A8 buffers stand for (fp16 scales and minimums)."""
        q = unpack_q4_1(self.w4a8_packed)                                     # (out, padded_in)
        return dequantize_int4(q, self.w4a8_scales, self.w4a8_mins)

    def _w4a8(self, x: torch.Tensor) -> torch.Tensor:
        # torch.ops.labsupport.w4a8_linear(x (..., k) float, packed, scales, mins, path) -> (..., n) in x's dtype
        return torch.ops.labsupport.w4a8_linear(self._pad(x), self.w4a8_packed, self.w4a8_scales,
                                                self.w4a8_mins, self.w4a8_path)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., padded_in): zeros for the padding columns of the weight."""
        return x if self.padded_in == self.in_features else F.pad(x, (0, self.padded_in - self.in_features))

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        # CUDA: _weight_int4pack_mm(A: bf16 (m, k) contiguous 2-D, B: the int32 4-D pack,
        # qGroupSize in {32, 64, 128, 256}, qScaleAndZeros: bf16 (k/group, n, 2)) -> bf16 (m, n);
        # its tensor-core code is compiled for capability 8.0+ only (`int4_kernel_unavailable`).
        # CPU: _weight_int4pack_mm_for_cpu, the same arguments with the CPU pack.
        op = (torch.ops.aten._weight_int4pack_mm_for_cpu if x.device.type == "cpu"
              else torch.ops.aten._weight_int4pack_mm)
        y = op(self._pad(x.to(torch.bfloat16)), self.weight_int4pack, self.group_size, self.scales_and_zeros)
        return y[:, :self.out_features].to(x.dtype)                          # drop the padding rows

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        weight = dequantize_int4(unpack_int4(self.packed), self.scales, self.zeros, x.dtype)  # (out, padded_in)
        return F.linear(self._pad(x), weight)

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight (out, in) these buffers stand for (with the fast layout, read
        back through the kernel itself: identity @ W.T, a trick torch's compiler uses too)."""
        if self.kernel == "reference":
            return dequantize_int4(unpack_int4(self.packed), self.scales, self.zeros)[:, :self.in_features]
        if self.kernel == "w4a8":
            return self._w4a8_weight()[:, :self.in_features]
        with torch.no_grad():
            eye = torch.eye(self.in_features, device=self.weight_int4pack.device)
            return self._fast(eye).t().float()                               # (out, in)


def kernel_description(layer: nn.Module) -> str:
    """The kernel a layer runs, in words: "fused int4 kernel (aten._weight_int4pack_mm_for_cpu,
    bf16 arithmetic)", "reference path: dequantize to float, then matmul", "bitsandbytes
    Linear4bit", "dense matmul". Introduced in notebook 04 (quantization): its explorer and
    tables name the kernel that ran, since the speed depends on it more than on the bits."""
    if isinstance(layer, _QuantizedLinear):
        bits = "int8" if isinstance(layer, Int8Linear) else "int4"
        if layer.kernel == "w4a8":
            path = layer.w4a8_path if layer.w4a8_path != "auto" else supported_paths()[-1]
            tiles = f"; from {gemm_min_rows()} rows, weight tiles unpacked once for all rows" if path != "portable" else ""
            return (f"W4A8 kernel of our own (int4 weights x int8 activations, integer dot products, "
                    f"{path} path{tiles})")
        if layer.kernel == "reference":
            why = f" (the fused kernel is not usable here: {layer.fallback_reason})" if layer.fallback_reason else ""
            return f"reference path: dequantize {bits} to float, then matmul{why}"
        on_cpu = next(layer.buffers()).device.type == "cpu"
        if bits == "int8":
            return ("fused int8 kernel (aten._weight_int8pack_mm, bf16 arithmetic)" if on_cpu else
                    f"int8 fused into one reduction by torch.compile (up to {INT8_REDUCTION_ROWS} rows)")
        op = "aten._weight_int4pack_mm_for_cpu" if on_cpu else "tinygemm, aten._weight_int4pack_mm"
        return f"fused int4 kernel ({op}, bf16 arithmetic)"
    bnb_class = next((c for c in type(layer).__mro__ if c.__module__.startswith("bitsandbytes")), None)
    if bnb_class is not None:
        return f"bitsandbytes {bnb_class.__name__}"
    return "dense matmul"

