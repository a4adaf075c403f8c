"""AWQ's scale search for one linear layer: protect the input channels the activations use most.

Introduced in notebook 04 (quantization), exercise 3; `awq_search` is that exercise's answer
and `checks.quantization_awq.check_awq_search` compares a learner's search with it.

J. Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration" (MLSys 2024, arXiv:2306.00978). A layer computes y = x W^T. Scaling
column j of W (input channel j) by s_j and dividing x_j by s_j leaves y unchanged:
y = (x / s) (W * s)^T. Quantized, the column with a larger s_j gets a finer grid relative to
its weights (the group's step is set by its largest weights), so the channels with large
activations, whose weights' errors the output feels most, lose less. AWQ picks
s = mean|x|^alpha per input channel, alpha from a grid, and keeps the alpha whose
quantized layer gives the smallest output error on calibration activations:
||X W^T - X Ŵ^T|| with Ŵ = Q(W * s) / s. Only the scales are searched; rounding stays
round-to-nearest int4 in groups (`engine.quant.quantize_int4_groupwise`).

At run time the 1/s goes into the layer before: for an MLP's down projection, the up
projection's rows (`awq_int4_down`), so it costs nothing per token.

Every function here checks what it is given and answers a mistake in one sentence (a LabError):
weights and activations are non-empty 2-D tensors of finite values, each alpha of a grid a number
from 0 to 1, and scales finite and > 0, one per input channel. A scale of 0 is refused, not
clamped: it would divide by zero when folded (1 / s), and quietly replacing it would hand back
another layer than the one asked for. They compute under torch.no_grad() on detached tensors, so
an nn.Linear's weight (which requires grad) and activations caught in inference mode mix freely.
"""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager

import torch
import torch.nn as nn

from ..errors import LabError
from ..engine.quant import dequantize_int4, quantize_int4_groupwise, quantize_linear
from ..inputs import token_rows

AWQ_GRID = [i / 10 for i in range(11)]             # alpha = 0 is plain int4: the search never does worse


def _submodule(model: nn.Module, name: str) -> nn.Module:
    """model.get_submodule(name), or one sentence naming what to pass."""
    try:
        return model.get_submodule(name)
    except (AttributeError, TypeError):
        raise LabError(f"{model.__class__.__name__} has no submodule {name!r}; name a linear layer such as "
                       f"'blocks.0.mlp.down' (model.named_modules() lists them).") from None


def _matrix(tensor, name: str, columns: int | None = None) -> torch.Tensor:
    """`tensor` detached as float32, if it is a non-empty 2-D real tensor of finite values (with
    `columns` columns when given); else one sentence."""
    shape = f"(rows, {columns})" if columns is not None else "(rows, columns)"
    if not isinstance(tensor, torch.Tensor) or tensor.is_complex() or tensor.dtype == torch.bool:
        raise LabError(f"{name} must be a real 2-D torch tensor {shape}, got {type(tensor).__name__}"
                       f"{' ' + str(tensor.dtype) if isinstance(tensor, torch.Tensor) else ''}.")
    if tensor.dim() != 2 or tensor.numel() == 0 or (columns is not None and tensor.shape[1] != columns):
        raise LabError(f"{name} must be a non-empty 2-D tensor {shape}, got shape {tuple(tensor.shape)}.")
    matrix = tensor.detach().float()
    if not torch.isfinite(matrix).all():
        raise LabError(f"{name} holds nan or inf values (or values beyond float32's range); give finite numbers.")
    return matrix


def _activations(activations, weight: torch.Tensor) -> torch.Tensor:
    """Activations (tokens, in) for `weight` (out, in), as float32; else one sentence."""
    if not isinstance(activations, torch.Tensor) or activations.dim() != 2 or activations.numel() == 0 \
            or activations.shape[1] != weight.shape[1]:
        got = tuple(activations.shape) if isinstance(activations, torch.Tensor) else type(activations).__name__
        raise LabError(f"activations must be (tokens, {weight.shape[1]}) for a weight of shape "
                       f"{tuple(weight.shape)}, with at least one token; got {got}.")
    return _matrix(activations, "activations", weight.shape[1])


def _scales(scales, in_features: int, name: str = "the layer") -> torch.Tensor:
    """Scales as float32 (in_features,), if finite and > 0; else one sentence."""
    if not isinstance(scales, torch.Tensor) or scales.is_complex() or scales.dtype == torch.bool \
            or tuple(scales.shape) != (in_features,):
        got = f"shape {tuple(scales.shape)}" if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise LabError(f"scales must hold one value per input channel of {name}: a tensor of shape "
                       f"({in_features},), got {got}.")
    scales = scales.detach().float()
    if not (torch.isfinite(scales) & (scales > 0)).all():
        raise LabError(f"scales must be finite and > 0 (x / s and W * s need every s), got min "
                       f"{scales.min().item():g} and max {scales.max().item():g}; awq_search returns such scales.")
    return scales


def _alpha(alpha) -> float:
    """One alpha of a grid, a number from 0 to 1; else one sentence."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
        raise LabError(f"Each alpha must be a number from 0 to 1 (s = mean|x| ** alpha), got {alpha!r:.40}.")
    return float(alpha)


def _finite(value, what: str):
    """`value` (a float or a tensor) if finite; else one sentence: float32 overflowed on these inputs."""
    if not (math.isfinite(value) if isinstance(value, float) else bool(torch.isfinite(value).all())):
        raise LabError(f"{what} is not finite in float32: the weights, activations or scales are too large "
                       "for it; scale them down (e.g. divide by their largest absolute value).")
    return value


@torch.no_grad()
def layer_inputs(model: nn.Module, name: str, ids) -> torch.Tensor:
    """The inputs that the linear layer `name` of `model` sees in one forward pass over `ids`
    (a list of token ids): (tokens, in_features), float32, on the CPU. Notebook 04 (quantization)."""
    layer = _submodule(model, name)
    if not isinstance(layer, nn.Linear):
        raise LabError(f"{name} is a {type(layer).__name__}, not a linear layer; AWQ scales a linear layer's input "
                       "channels: name one such as 'blocks.0.mlp.down'.")
    if not hasattr(ids, "__iter__"):
        raise LabError(f"ids must be a list of token ids (tokenizer.encode(text)), got {ids!r:.40}.")
    rows = token_rows(ids, getattr(getattr(model, "config", None), "vocab_size", None), what="ids")
    if len(rows) != 1:
        raise LabError(f"ids must be one sequence of token ids, got a batch of {len(rows)}.")
    seen = []
    hook = layer.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].detach()))
    try:
        model(torch.tensor(rows, dtype=torch.long, device=layer.weight.device))
    finally:
        hook.remove()
    if not seen:
        raise LabError(f"{name} did not run in the model's forward pass; name a layer the model uses.")
    return seen[0].reshape(-1, seen[0].shape[-1]).float().cpu()


@torch.no_grad()
def scales_for(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha per input channel, divided by sqrt(max(s) * min(s)) so that the scales
    sit around 1 (any constant factor gives the same quantized layer). Notebook 04 (quantization)."""
    alpha = _alpha(alpha)
    if not isinstance(mean_abs, torch.Tensor) or mean_abs.dim() != 1 or mean_abs.numel() == 0:
        got = tuple(mean_abs.shape) if isinstance(mean_abs, torch.Tensor) else type(mean_abs).__name__
        raise LabError(f"mean_abs must be a 1-D tensor of one mean |x| per input channel, got {got}.")
    mean_abs = _matrix(mean_abs[None, :], "mean_abs")[0]
    if (mean_abs < 0).any():
        raise LabError("mean_abs must be >= 0 (a mean of |x|): take activations.abs().mean(dim=0).")
    s = mean_abs.pow(alpha).clamp(min=1e-4)
    s = s / (s.max() * s.min()).sqrt()
    return _finite(torch.where(s > 0, s, math.nan), "A scale")          # max * min overflowed: s = 0


@torch.no_grad()
def awq_weight(weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The weight the quantized layer computes with: Q(W * s) / s, int4 in groups of
    `group_size` (min/max per group), dequantized. (out, in) float32. Notebook 04 (quantization)."""
    weight = _matrix(weight, "weight")
    scales = _scales(scales, weight.shape[1])
    scaled = weight * scales[None, :]                                   # column j times s_j
    approx = dequantize_int4(*quantize_int4_groupwise(scaled, group_size)) / scales[None, :]
    return _finite(approx, "The quantized weight")


@torch.no_grad()
def output_error(weight: torch.Tensor, approx: torch.Tensor, activations: torch.Tensor) -> float:
    """||X W^T - X Ŵ^T||, the Frobenius norm of what quantizing the layer changed in its
    outputs over these activations (tokens, in). Notebook 04 (quantization)."""
    weight = _matrix(weight, "weight")
    approx = _matrix(approx, "approx (the quantized weight)")
    if approx.shape != weight.shape:
        raise LabError(f"approx must have the weight's shape {tuple(weight.shape)}, got {tuple(approx.shape)}.")
    x = _activations(activations, weight)
    return _finite(torch.linalg.norm(x @ weight.T - x @ approx.T).item(), "The output error")


@torch.no_grad()
def awq_search(weight: torch.Tensor, activations: torch.Tensor, group_size: int,
               grid=AWQ_GRID) -> tuple[torch.Tensor, list[float]]:
    """AWQ's search: for each alpha of `grid`, s = mean|x|^alpha (`scales_for`), the output
    error of Q(W * s) / s on `activations`; returns (the scales of the best alpha: (in,),
    the error of each alpha in grid order). Notebook 04 (quantization), exercise 3's answer."""
    weight = _matrix(weight, "weight")
    x = _activations(activations, weight)
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise LabError(f"grid must be a list of alphas from 0 to 1 (e.g. AWQ_GRID), got {grid!r:.40}.")
    grid = [_alpha(alpha) for alpha in grid]
    if not grid:
        raise LabError("grid is empty; give at least one alpha from 0 to 1 (e.g. AWQ_GRID).")
    mean_abs = x.abs().mean(dim=0)                                      # (in,): one per input channel
    y = x @ weight.T                                                    # the float layer's output, once
    errors, best = [], None
    for alpha in grid:
        s = scales_for(mean_abs, alpha)
        error = torch.linalg.norm(y - x @ awq_weight(weight, s, group_size).T).item()
        errors.append(_finite(error, f"The output error at alpha = {alpha}"))
        if best is None or errors[-1] < best[0]:
            best = (errors[-1], s)
    return best[1], errors


@torch.no_grad()
def error_removed(weight: torch.Tensor, activations: torch.Tensor, group_size: int,
                  scales: torch.Tensor) -> dict:
    """Plain int4's output error on `activations`, the scaled layer's, and the fraction the scales
    removed: {"plain", "awq", "removed"}. Notebook 04 (quantization)."""
    weight = _matrix(weight, "weight")
    x = _activations(activations, weight)
    scales = _scales(scales, weight.shape[1])
    plain = output_error(weight, awq_weight(weight, torch.ones_like(scales), group_size), x)
    awq = output_error(weight, awq_weight(weight, scales, group_size), x)
    return {"plain": plain, "awq": awq, "removed": 1 - awq / plain if plain > 0 else 0.0}


@contextmanager
def awq_int4_down(model: nn.Module, name: str, group_size: int, scales: torch.Tensor | None = None):
    """While the block runs, the MLP down projection `name` is the package's int4 layer (groups of
    `group_size`, its fastest kernel) of W * s, and the up projection's rows are divided by s, so
    the down projection's input arrives as x / s. scales None: plain int4 (s = 1). Puts both
    layers back afterwards. Notebook 04 (quantization)."""
    if not isinstance(name, str):
        raise LabError(f"name must be a layer's name such as 'blocks.0.mlp.down', got {name!r:.40}.")
    parent_name, _, child = name.rpartition(".")
    parent = _submodule(model, parent_name)
    down, gate_up = getattr(parent, child, None), getattr(parent, "gate_up", None)
    if child != "down" or not isinstance(down, nn.Linear) or not isinstance(gate_up, nn.Linear):
        raise LabError(f"{name} is not an MLP down projection after a fused gate/up projection "
                       "(blocks.<i>.mlp.down of a Llama-style model).")
    s = torch.ones(down.in_features) if scales is None else _scales(scales, down.in_features, name)
    s = s.to(down.weight.device)
    if not (torch.isfinite(s.to(down.weight.dtype)) & (s.to(down.weight.dtype) > 0)).all():
        raise LabError(f"scales must stay finite and > 0 in the model's {down.weight.dtype}; these reach "
                       f"{s.min().item():g} to {s.max().item():g}.")
    up_rows = slice(gate_up.out_features // 2, gate_up.out_features)    # gate first, then up
    with torch.no_grad():
        saved = [p[up_rows].clone() for p in (gate_up.weight, gate_up.bias) if p is not None]
        scaled = nn.Linear(down.in_features, down.out_features, bias=down.bias is not None,
                           device=down.weight.device, dtype=down.weight.dtype)
        scaled.weight.copy_(down.weight * s.to(down.weight.dtype)[None, :])
        if down.bias is not None:
            scaled.bias.copy_(down.bias)
        replacement = quantize_linear(scaled, "int4", group_size=group_size, warn=False)
        gate_up.weight[up_rows] /= s.to(gate_up.weight.dtype)[:, None]  # x / s, folded into the layer before
        if gate_up.bias is not None:
            gate_up.bias[up_rows] /= s.to(gate_up.bias.dtype)
    setattr(parent, child, replacement)
    try:
        yield replacement
    finally:
        setattr(parent, child, down)
        with torch.no_grad():
            for p, rows in zip((gate_up.weight, gate_up.bias), saved):
                p[up_rows] = rows
