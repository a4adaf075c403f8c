"""Weight-only quantization: int8 and int4 weights, float activations.

Introduced in notebook 04 (quantization).

A decode step at batch 1 reads every weight once for one token's worth of
arithmetic (notebook 00), so storing the weights in fewer bits reads fewer
bytes and can make the step faster. The activations stay in floating point;
each weight is stored as a small integer plus a scale shared by many weights:

* int8, absmax, per output channel (symmetric): scale = max|w| / 127 for each
  row, q = round(w / scale) in -127..127, w ~ q * scale. 8 bits per weight plus
  one scale per row: about 25% of fp32.
* int4, groupwise, asymmetric (min/max): each row is cut into groups of
  `group_size` consecutive input features; per group scale = (max - min) / 15
  and zero = min, q = round((w - zero) / scale) in 0..15, w ~ q * scale + zero.
  Two values are packed into one byte. 4 bits per weight plus a scale and a
  zero per group: about 12.5% of fp32 plus 2 x 16 / group_size bits.

Whether fewer bytes become more speed depends on the kernel: a matmul that
first dequantizes the whole weight to float (``kernel="reference"``) reads the
small weight but writes and reads a float copy, and is slower than plain fp32.
The ``"fast"`` kernels dequantize inside the matmul, tile by tile:

* CPU: ``torch.ops.aten._weight_int8pack_mm`` (int8 weights, bf16 activations)
  and ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (weights repacked by
  ``_convert_weight_to_int4pack_for_cpu``; group sizes 32, 64, 128, 256).
* CUDA: int8 as dequantize-then-matmul under ``torch.compile`` (the compiler
  fuses the conversion into the matmul, as gpt-fast does), and int4 through
  ``torch.ops.aten._weight_int4pack_mm`` (the "tinygemm" kernel).

Both int4 kernels expect scales and zeros as one (in / group, out, 2) tensor
and compute w = (q - 8) * scale + zero', so our zero (the group minimum) is
passed as zero' = zero + 8 * scale. A kernel that is missing or fails on a
layer falls back to the reference path with one warning sentence.

`quantize_model` swaps a model's ``nn.Linear`` modules in place and returns a
handle that puts the originals back (``handle.restore()``, or use it as a
context manager). bitsandbytes' LLM.int8() and NF4/FP4 layers (Dettmers et al.
2022, 2023) plug in the same way (see quantize_bnb.py).

Quality is measured as perplexity on a fixed text shipped with the package,
``labsupport/data/eval_text.txt``: the opening of chapter 1 of Lewis Carroll's
"Alice's Adventures in Wonderland" (1865, public domain), plain ASCII, about
4 KB (some 900 tokens with the SmolLM2 tokenizer). It is a well-known English
text, so a small instruct model predicts it well and a damaged model shows it.
The embedded SmolLM2 weights were distributed as Q4_1 (4 bits, blocks of 32):
int4 with groups of 32 reproduces every block's weights exactly (error 0), so
on this model all of its loss comes from the output layer, tied to the embedding,
which the file stored at a finer precision (``include_lm_head=False`` keeps it
float). Other group sizes cut across the original blocks and lose more (on the
evaluation text: perplexity 22.3 fp32, 23.1 g32, 34.8 g64, 43.6 g128). Models
that arrive in 16-bit show the usual pattern instead: smaller groups, less error.
"""

from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import LabError

METHODS = ("int8", "int4", "bnb-int8", "bnb-nf4", "bnb-fp4")
KERNELS = ("auto", "fast", "reference")
KERNEL_INT4_GROUP_SIZES = (32, 64, 128, 256)
EVAL_TEXT_PATH = Path(__file__).parent / "data" / "eval_text.txt"


# --- the arithmetic -------------------------------------------------------------------

def _check_matrix(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise LabError("Quantization expects a 2-D floating-point weight matrix (out_features, in_features).")


def quantize_int8_absmax(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8, one scale per output channel (row).

    Returns q: int8 (out, in) in -127..127 and scale: float32 (out,), with w ~ q * scale[:, None].
    """
    _check_matrix(w)
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127                    # (out,)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)     # (out, in)
    q = q.contiguous()                  # row-major, whatever layout the weight had (models/layout.py)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q (out, in) int8 and scale (out,) -> the approximate weight (out, in) in `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def require_group_size(group_size: int, in_features: int | None = None) -> None:
    """Refuse group sizes that are not an even integer >= 2 (two 4-bit values share a byte)
    or, when `in_features` is given, that cannot cut a row into whole groups."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise LabError(f"group_size must be an even integer of at least 2, got {group_size!r}.")
    if in_features is not None and in_features % group_size:
        divisors = [g for g in (16, 32, 64, 96, 128, 192, 256) if in_features % g == 0] or [in_features]
        raise LabError(f"group_size {group_size} does not divide in_features {in_features}; "
                       f"choose a divisor such as {', '.join(map(str, divisors))}.")


def quantize_int4_groupwise(w: torch.Tensor, group_size: int = 32):
    """Asymmetric int4 in groups of `group_size` input features (min/max per group).

    Returns q: uint8 (out, in) with values 0..15, scales and zeros: float32
    (out, in / group_size), with w ~ q * scale + zero (zero is the group minimum).
    """
    _check_matrix(w)
    out_features, in_features = w.shape
    require_group_size(group_size, in_features)
    groups = w.float().reshape(out_features, in_features // group_size, group_size)  # (out, G, g)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)                             # (out, G)
    scales = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15)
    return q.to(torch.uint8).reshape(out_features, in_features).contiguous(), scales, low


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    dtype=torch.float32) -> torch.Tensor:
    """q (out, in) 0..15 with scales, zeros (out, in / group) -> weight (out, in) in `dtype`."""
    out_features, in_features = q.shape
    group_size = in_features // scales.shape[1]
    groups = q.float().reshape(out_features, -1, group_size)                 # (out, G, g)
    w = groups * scales.float()[..., None] + zeros.float()[..., None]
    return w.reshape(out_features, in_features).to(dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit values per byte: column 2j in the low nibble, 2j + 1 in the high one.
    q: (out, in) values 0..15 -> uint8 (out, in / 2)."""
    if q.shape[-1] % 2:
        raise LabError(f"pack_int4 needs an even number of columns, got {q.shape[-1]}.")
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: uint8 (out, in / 2) -> uint8 (out, in) values 0..15."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)     # interleave columns


def weight_error_stats(w: torch.Tensor, method: str = "int8", group_size: int = 32) -> dict:
    """What quantizing `w` costs: the error tensor (dequantized - w, same shape) and its
    summary (max and mean absolute error, relative Frobenius error, bits per weight).
    method: "int8", "int4", or a bitsandbytes method "bnb-nf4" / "bnb-fp4"."""
    _check_matrix(w)
    w = w.detach().float()
    if method == "int8":
        q, scale = quantize_int8_absmax(w)
        approx, bits = dequantize_int8(q, scale), 8 + 32 / w.shape[1]
    elif method == "int4":
        q, scales, zeros = quantize_int4_groupwise(w, group_size)
        approx, bits = dequantize_int4(q, scales, zeros), 4 + 2 * 32 / group_size
    elif method in ("bnb-nf4", "bnb-fp4"):
        from .quantize_bnb import bnb_roundtrip
        approx, bits = bnb_roundtrip(w, method.removeprefix("bnb-")), 4 + 32 / 64
    else:
        raise LabError(f"Unknown method {method!r} for weight_error_stats; use int8, int4, bnb-nf4 or bnb-fp4.")
    error = approx - w
    return {"error": error, "max_abs": error.abs().max().item(), "mean_abs": error.abs().mean().item(),
            "relative_frobenius": (error.norm() / w.norm().clamp(min=1e-12)).item(),
            "bits_per_weight": bits}


# --- kernels ----------------------------------------------------------------------------

def _warn_fallback(what: str, reason: str) -> None:
    warnings.warn(f"The fast {what} kernel is not usable here ({reason}); using the slower "
                  f"dequantize-then-matmul reference instead.", stacklevel=3)


def _short(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__


def _check_close(fast: torch.Tensor, reference: torch.Tensor, tolerance: float = 0.03) -> None:
    """Raise unless a kernel's output matches the reference within `tolerance` of its scale
    (bf16 activations carry 8 bits of mantissa, so exact equality is not expected)."""
    error = (fast.float() - reference.float()).abs().max().item()
    size = reference.float().abs().max().item()
    if not error <= tolerance * size + 1e-4:
        raise RuntimeError(f"its output differs from the reference by {error:.3g} (scale {size:.3g})")


def _int8_dequant_linear(x, q, scales):
    """x (M, in) @ q.T (in, out), scaled per output channel; the compiler fuses the
    int8 -> float conversion into the matmul, so the float weight is never written."""
    return F.linear(x, q.to(x.dtype)) * scales.to(x.dtype)


@functools.cache
def _compiled_int8_linear():
    """`_int8_dequant_linear` through torch.compile, built once on first use (CUDA)."""
    return torch.compile(_int8_dequant_linear, dynamic=True)


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

    @staticmethod
    def _check_kernel(kernel: str) -> None:
        if kernel not in KERNELS:
            raise LabError(f"Unknown kernel {kernel!r}; use one of {', '.join(KERNELS)}.")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)                                  # (M, in)
        y = self._fast(x2) if self.kernel == "fast" else self._reference(x2)  # (M, out)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

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
        cls._check_kernel(kernel)
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
            self._fall_back(_short(error), warn)

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
            self._fall_back(_short(error))
            return self._reference(x)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, dequantize_int8(self.weight_int8, self.scales, x.dtype))

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize_int8(self.weight_int8, self.scales)


class Int4Linear(_QuantizedLinear):
    """nn.Linear with int4 weights in groups (asymmetric, min/max); activations stay float.

    Introduced in notebook 04 (quantization). The buffers depend on the kernel:
    "reference" keeps our own layout (packed (out, in/2) uint8, scales and zeros
    (out, in/group)); "fast" keeps only the kernel's layout (weight_int4pack and
    scales_and_zeros (in/group, out, 2) in bf16), so memory is never counted twice.

    A group size that does not divide in_features (128 on SmolLM2's 576) is
    handled as gpt-fast does: each row is padded with zeros to whole groups
    (``padded_in``), and so is every input; the padding costs memory, counted.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, kernel: str = "auto",
                    warn: bool = True) -> "Int4Linear":
        cls._check_kernel(kernel)
        self = cls(linear)
        require_group_size(group_size)
        self.group_size = group_size
        self.padded_in = -(-self.in_features // group_size) * group_size
        weight = F.pad(linear.weight.detach().float(), (0, self.padded_in - self.in_features))  # (out, padded_in)
        q, scales, zeros = quantize_int4_groupwise(weight, group_size)
        device = linear.weight.device
        reason = None
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

    def _build_fast(self, q, scales, zeros, device) -> str | None:
        """Repack for the device's kernel and check it once; the reason it cannot run, or None."""
        if device.type not in ("cpu", "cuda"):
            return f"no int4 kernel for device {device.type}"
        if self.group_size not in KERNEL_INT4_GROUP_SIZES:
            return f"the kernel takes group sizes {KERNEL_INT4_GROUP_SIZES}, not {self.group_size}"
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
                # tinygemm: two values per byte, the even column in the HIGH nibble; the inner
                # tile count must divide in_features / 16
                inner_k_tiles = next((t for t in (8, 4, 2) if self.padded_in % (16 * t) == 0), None)
                if inner_k_tiles is None:
                    return f"in_features {self.padded_in} is not a multiple of 32"
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
            return _short(error)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """(M, in) -> (M, padded_in): zeros for the padding columns of the weight."""
        return x if self.padded_in == self.in_features else F.pad(x, (0, self.padded_in - self.in_features))

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
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
        with torch.no_grad():
            eye = torch.eye(self.in_features, device=self.weight_int4pack.device)
            return self._fast(eye).t().float()                               # (out, in)


# --- swapping a model's layers -----------------------------------------------------------

class QuantizedHandle:
    """What `quantize_model` did, and how to undo it.

    Introduced in notebook 04 (quantization). ``restore()`` puts the original
    modules back; ``apply()`` swaps the quantized ones in again (no re-quantizing);
    ``with handle:`` applies on entry and restores on exit.
    """

    def __init__(self, model, method: str, group_size: int | None, swaps: list, fallbacks: list):
        self.model, self.method, self.group_size = model, method, group_size
        self._swaps = swaps                       # [(parent, attribute, original, quantized)]
        self.fallbacks = fallbacks                # [(module name, reason)] that run the reference
        self.applied = True

    @property
    def names(self) -> list[str]:
        return [name for name, *_ in self._swaps]

    @property
    def kernels(self) -> dict[str, int]:
        """How many layers run each kernel, e.g. {"fast": 210} or {"bitsandbytes": 211}."""
        counts: dict[str, int] = {}
        for *_, quantized in self._swaps:
            kind = getattr(quantized, "kernel", "bitsandbytes")
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def apply(self) -> "QuantizedHandle":
        for _, parent, attribute, _, quantized in self._swaps:
            setattr(parent, attribute, quantized)
        self.applied = True
        return self

    def restore(self) -> None:
        for _, parent, attribute, original, _ in reversed(self._swaps):
            setattr(parent, attribute, original)
        self.applied = False

    def __enter__(self) -> "QuantizedHandle":
        return self if self.applied else self.apply()

    def __exit__(self, *exc) -> None:
        self.restore()

    def __repr__(self) -> str:
        return (f"QuantizedHandle(method={self.method!r}, layers={len(self._swaps)}, "
                f"kernels={self.kernels}, applied={self.applied})")


def quantize_linear(linear: nn.Linear, method: str, group_size: int = 32, kernel: str = "auto",
                    warn: bool = True) -> nn.Module:
    """One nn.Linear -> its quantized replacement (same inputs, same outputs, fewer bytes)."""
    if method == "int8":
        return Int8Linear.from_linear(linear, kernel=kernel, warn=warn)
    if method == "int4":
        return Int4Linear.from_linear(linear, group_size=group_size, kernel=kernel, warn=warn)
    if method.startswith("bnb-"):
        from .quantize_bnb import bnb_linear
        return bnb_linear(linear, method.removeprefix("bnb-"))
    raise LabError(f"Unknown quantization method {method!r}; use one of {', '.join(METHODS)}.")


def quantize_model(model: nn.Module, method: str, group_size: int = 32, kernel: str = "auto",
                   include_lm_head: bool = True) -> QuantizedHandle:
    """Swap every nn.Linear of `model` for a quantized one, in place; returns the handle
    that undoes it (``handle.restore()`` or ``with quantize_model(...):``).

    Introduced in notebook 04 (quantization). method: "int8", "int4" (with
    `group_size`), "bnb-int8", "bnb-nf4" or "bnb-fp4". kernel: "auto"/"fast" or
    "reference" (ours only). The output projection tied to the embedding is
    quantized as its own module; the embedding keeps the float weight for lookups.
    """
    if method not in METHODS:
        raise LabError(f"Unknown quantization method {method!r}; use one of {', '.join(METHODS)}.")
    _QuantizedLinear._check_kernel(kernel)
    # float nn.Linear layers only (bitsandbytes' layers subclass nn.Linear, with integer weights)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and module.weight.is_floating_point()
               and (include_lm_head or name.split(".")[-1] != "lm_head")]
    # every argument is checked before the first swap, so a mistake never leaves a half-quantized model
    if method == "int4":
        require_group_size(group_size)
    if method.startswith("bnb-"):
        from .quantize_bnb import bnb_module
        bnb_module()
    swaps, fallbacks = [], []
    for name, linear in targets:
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        with torch.no_grad():
            quantized = quantize_linear(linear, method, group_size, kernel, warn=False)
        if getattr(quantized, "fallback_reason", None):
            fallbacks.append((name, quantized.fallback_reason))
        swaps.append((name, parent, name.rpartition(".")[2], linear, quantized))
        setattr(parent, name.rpartition(".")[2], quantized)
    if fallbacks and kernel != "reference":
        warnings.warn(f"{len(fallbacks)} of {len(swaps)} layers use the slower reference kernel because the "
                      f"fast {method} kernel is not usable here ({fallbacks[0][1]}).", stacklevel=2)
    return QuantizedHandle(model, method, group_size if method == "int4" else None, swaps, fallbacks)


def quantized_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads: `weight_bytes()` plus the side tensors bitsandbytes keeps
    outside parameters and buffers (LLM.int8()'s row scales, 4-bit block absmax)."""
    from .quantize_bnb import bnb_side_bytes
    return model.weight_bytes() + sum(bnb_side_bytes(m) for m in model.modules())


# --- quality -------------------------------------------------------------------------------

def eval_text() -> str:
    """The fixed evaluation text (see the module docstring)."""
    return EVAL_TEXT_PATH.read_text(encoding="ascii")


def eval_tokens(tokenizer, text: str | None = None, max_tokens: int = 512) -> list[int]:
    ids = tokenizer.encode(eval_text() if text is None else text, add_special_tokens=False)[:max_tokens]
    if len(ids) < 2:
        raise LabError("The evaluation text needs at least 2 tokens; give a longer text.")
    return ids


@torch.inference_mode()
def _score(model, ids) -> tuple[float, torch.Tensor]:
    """Mean next-token negative log-likelihood over `ids`, and the argmax predictions (T,)."""
    tokens = torch.as_tensor(ids, dtype=torch.long, device=model.device).reshape(1, -1)   # (1, T)
    logits = model(tokens)[0].float()                                                    # (T, vocab)
    nll = F.cross_entropy(logits[:-1], tokens[0, 1:])
    return nll.item(), logits.argmax(-1)


def perplexity(model, tokenizer, text: str | None = None, max_tokens: int = 512) -> float:
    """exp(mean negative log-likelihood) of the next token over the first `max_tokens`
    tokens of `text` (default: the shipped evaluation text). Lower is better.

    Introduced in notebook 04 (quantization)."""
    return math.exp(_score(model, eval_tokens(tokenizer, text, max_tokens))[0])


def top1_agreement(reference_model, model, tokens) -> float:
    """Fraction of positions where both models predict the same next token (argmax).

    Introduced in notebook 04 (quantization). tokens: ids as a list or 1-D tensor."""
    return (_score(reference_model, tokens)[1] == _score(model, tokens)[1]).float().mean().item()
