"""Fewer operators per decode step: the norm, the residual add, the rotary embedding and the
SwiGLU product in one call each, on a CPU.

Introduced in notebook 00 (where the time goes), whose profile shows a step before and after.

A batch-1 decode step is mostly tiny operators: each costs a few microseconds of dispatch
whatever its size, and one RMSNorm in plain torch is seven of them (a float cast, a square, a
mean that is a sum and a divide, an add, a reciprocal square root, two multiplies). On a CPU,
where nothing compiles a step unless asked, `fused_ops.cpp` (beside this file) does each in
one call with the same arithmetic; `transformer.py` asks `active(x)` before taking it, and
keeps its plain-torch code as the reference and as every other path:

* a GPU (or any device but the CPU): torch.compile fuses these itself (compiled.py);
* gradients enabled (training, or a learner's autograd experiment): the ops have no backward;
* the kernels did not build (no compiler, no ninja): `unavailable()` says why;
* switched off: LABSUPPORT_FUSED_OPS=0, or `switched(False)` around a block of code (notebook
  00's before-and-after profile).

A plain decode step goes one further: `decode_block` runs a whole Llama layer (both norms, the
linears, the rotation, the cache write, attention for the one new row, the MLP) in one C++ call,
where the pass is one token per row with no mask over a float32 `StaticKVCache` (issue 40).

The build happens once per cache (cpp_build.py), when a model is loaded onto a CPU
(`prepare`, called by `layout.apply_layout`, which every loader runs), never inside a forward
pass; torch.compile traces through the ops by their fake (shape-only) implementations.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import NamedTuple

import torch

from ..cache_dir import cache_root
from ..cpp_build import try_build

SOURCE = Path(__file__).with_name("fused_ops.cpp")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ENABLED = os.environ.get("LABSUPPORT_FUSED_OPS", "1").strip() != "0"     # read once, at import
LOADED = False                       # set by load(): the ops are registered in torch.ops.labsupport


def _fake_rms_norm(x, weight, eps):
    return torch.empty_like(x)


def _fake_add_rms_norm(x, delta, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


def _fake_rope(qkv, cos, sin, heads):
    return torch.empty_like(qkv)


def _fake_silu_mul(gate_up):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


@functools.cache
def load() -> str | None:
    """Build (first time) and load the fused kernels once per process: None, or why not (one
    sentence, no final period). Notebook 00 (where the time goes)."""
    global LOADED
    reason = try_build(SOURCE, cache_root() / "kernels", "the fused norm, rotary and SwiGLU kernels", "fused",
                       flags=("-ffp-contract=off",))
    if reason is None:
        torch.library.register_fake("labsupport::rms_norm")(_fake_rms_norm)
        torch.library.register_fake("labsupport::add_rms_norm")(_fake_add_rms_norm)
        torch.library.register_fake("labsupport::rope")(_fake_rope)
        torch.library.register_fake("labsupport::silu_mul")(_fake_silu_mul)
        LOADED = True
    return reason


def prepare(device: torch.device) -> None:
    """Build and load the kernels before the first pass on a CPU (never while torch.compile
    traces, and never for a GPU model: Colab builds nothing it will not use). Notebook 00."""
    if not torch.compiler.is_compiling() and ENABLED and not LOADED and device.type == "cpu":
        load()


def unavailable() -> str | None:
    """Why a CPU step runs the plain-torch norms and rotations (one sentence), or None when it
    fuses them. Notebook 00 (where the time goes)."""
    if not ENABLED:
        return "the fused kernels are switched off (LABSUPPORT_FUSED_OPS=0 or fused.switched(False))"
    return load()


def active(x: torch.Tensor) -> bool:
    """Whether the layers take the fused kernels for activations `x` (see the module's list).
    Reads plain module globals, so torch.compile can guard on them. Notebook 00."""
    return ENABLED and LOADED and x.device.type == "cpu" and x.dtype in DTYPES and not torch.is_grad_enabled()


def rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """The fused rotation of the first `heads` heads of qkv (B, T, H, D), for inputs of any
    strides (a transposed or sliced qkv, cos or sin is copied to a contiguous one first) and
    cos, sin that broadcast to (B, T, D), as the plain-torch reference takes them: the kernel
    reads contiguous (B, T, D) tables only. Notebook 00 (where the time goes)."""
    if qkv.dim() == 4:
        rows = (qkv.shape[0], qkv.shape[1], qkv.shape[3])
        cos = cos if cos.shape == rows else cos.expand(rows)
        sin = sin if sin.shape == rows else sin.expand(rows)
    return torch.ops.labsupport.rope(qkv.contiguous(), cos.contiguous(), sin.contiguous(), heads)


def _linear_weights(linear) -> list | None:
    """What `decode_block` takes for one linear without bias: [weight] for a float32 nn.Linear,
    [packed, scales, mins] for an int4 layer on our W4A8 kernel (quant/kernels.py); None for any
    other kind (int8, int4 on aten's kernel, a bias, padded columns): the layer then runs in Python."""
    if getattr(linear, "bias", None) is not None:
        return None
    if type(linear) is torch.nn.Linear and linear.weight.dtype == torch.float32:
        return [linear.weight]
    if getattr(linear, "kernel", None) == "w4a8" and linear.padded_in == linear.in_features:
        return [linear.w4a8_packed, linear.w4a8_scales, linear.w4a8_mins]
    return None


def _hooked(modules) -> bool:
    """Whether a forward hook would see any of `modules` called (its own, or a global one): the
    one call never calls them, so the Python layer runs instead (notebook 03 records a linear's
    inputs this way, lab/quantization_awq.py its activations)."""
    hooks = torch.nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return True
    return any(m is not None and (m._forward_hooks or m._forward_pre_hooks) for m in modules)


# Every registration of a module, parameter or buffer, anywhere (quantize_model swapping a linear,
# a weight assigned anew, a buffer registered), moves this count on. A layer's arguments are
# gathered once (`_layer_args`, about 25 us of attribute lookups) and kept on the layer with the
# count they were gathered at: a later count gathers them again.
REGISTRATIONS = 0


def _registered(*_) -> None:
    global REGISTRATIONS
    REGISTRATIONS += 1


for _hook in (torch.nn.modules.module.register_module_module_registration_hook,
              torch.nn.modules.module.register_module_parameter_registration_hook,
              torch.nn.modules.module.register_module_buffer_registration_hook):
    _hook(_registered)


class LayerArgs(NamedTuple):
    """What `decode_block` passes to C++ for one Llama layer, gathered once (`_layer_args`).
    Notebook 00 (where the time goes)."""
    parts: tuple            # attn, mlp, both norms and the four linears: where a forward hook may be
    norms: tuple            # the two norms' weights
    weights: list           # each linear's weight list (`_linear_weights`)
    path: str               # the W4A8 path the linears share ("auto" for float32 linears)
    dtypes: list            # every tensor's dtype when gathered: `model.to(...)` changes data, not parameters


def _gather_layer_args(block) -> LayerArgs | None:
    """The `LayerArgs` of a Llama `block`, or None where the call does not apply (a linear of another
    kind, linears on different paths, norms not float32)."""
    attn, mlp = block.attn, block.mlp
    linears = (attn.qkv, attn.out, getattr(mlp, "gate_up", None), getattr(mlp, "down", None))
    weights = [_linear_weights(linear) for linear in linears]
    paths = {getattr(linear, "w4a8_path", "auto") for linear in linears}
    norms = (block.attn_norm.weight, block.mlp_norm.weight)
    if None in weights or len(paths) != 1 or len({len(w) for w in weights}) != 1 or \
            any(norm.dtype != torch.float32 for norm in norms):
        return None
    return LayerArgs((attn, mlp, block.attn_norm, block.mlp_norm, *linears), norms, weights, paths.pop(),
                     _dtypes(norms, weights))


def _dtypes(norms, weights) -> list:
    return [t.dtype for t in norms] + [t.dtype for w in weights for t in w]


def _layer_args(block) -> LayerArgs | None:
    """`_gather_layer_args(block)`, kept on the block while no registration happened since
    (`REGISTRATIONS`) and every tensor keeps its dtype."""
    count, args = block.__dict__.get("_decode_block_args", (None, None))
    if count != REGISTRATIONS or (args is not None and _dtypes(args.norms, args.weights) != args.dtypes):
        count, args = REGISTRATIONS, _gather_layer_args(block)
        block.__dict__["_decode_block_args"] = (count, args)
    return args


def decode_block(block, x: torch.Tensor, rope, writer, mask) -> torch.Tensor | None:
    """The whole of a Llama `block` (transformer.py) for one new token per row, in one C++ call
    (`fused_ops.cpp`'s decode_block, issue 40), or None where it does not apply and the block runs
    its Python code, which stays the reference. It applies to a float32 CPU decode pass (x (B, 1,
    hidden)) over a float32 cache that is either a `StaticKVCache` (kv_cache.py) with no mask (no
    padding, no window), or the serving engine's paged pool through a `PagedView` that the runner
    marked as one token per row with nothing but each row's length to mask (`decode_lengths`), and
    to a layer whose linears are all float32 or all W4A8 with one path (`_linear_weights`) and whose
    parts have no forward hooks (`_hooked`). Introduced in notebook 00 (where the time goes)."""
    from ..kv_cache import PassWriter, StaticKVCache
    if rope is None or x.shape[1] != 1 or x.dtype != torch.float32 or not active(x) or torch.compiler.is_compiling():
        return None
    paged_lengths = getattr(writer, "decode_lengths", None)      # (B,): a PagedView marked by the serving runner
    static = (mask is None and isinstance(writer, PassWriter) and type(writer.cache) is StaticKVCache
              and writer.cache.dtype == torch.float32)
    if not static and (paged_lengths is None or writer.cache.dtype != torch.float32):
        return None
    args = _layer_args(block)
    if args is None or _hooked(args.parts):
        return None
    attn, attn_norm = args.parts[0], args.parts[2]
    cache, layer, rows = writer.cache, attn.layer_index, x.shape[0]
    if not static:     # the pool's layer (slots, kv_heads, D), read through each row's block table
        return torch.ops.labsupport.decode_block_paged(
            x.contiguous(), *args.norms, *args.weights, *rope, cache.keys[layer], cache.values[layer],
            writer.write_slots, writer.read_blocks, paged_lengths, cache.block_size, attn.num_heads, attn_norm.eps,
            args.path)                                                            # (B, 1, hidden)
    # the pass's rows of the layer's buffers (a compiled decoder's cache may hold more: its bucket)
    keys, values = cache.layer_keys[layer][:rows], cache.layer_values[layer][:rows]   # (B, kv_heads, max_len, D)
    return torch.ops.labsupport.decode_block(
        x.contiguous(), *args.norms, *args.weights, *rope, keys, values, writer.start, attn.num_heads,
        attn_norm.eps, args.path)                                                 # (B, 1, hidden)


@contextlib.contextmanager
def switched(on: bool):
    """Fused kernels on (where `active`) or off inside the block; the setting before it comes
    back after. Notebook 00 (where the time goes): the profile of one step, before and after."""
    global ENABLED
    before, ENABLED = ENABLED, bool(on)
    try:
        yield
    finally:
        ENABLED = before
