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
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from ..errors import LabError
from ..engine.quant import dequantize_int4, quantize_int4_groupwise, quantize_linear

AWQ_GRID = [i / 10 for i in range(11)]             # alpha = 0 is plain int4: the search never does worse


def _submodule(model: nn.Module, name: str) -> nn.Module:
    """model.get_submodule(name), or one sentence naming what to pass."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise LabError(f"{model.__class__.__name__} has no submodule {name!r}; name a linear layer such as "
                       f"'blocks.0.mlp.down' (model.named_modules() lists them).") from None


@torch.inference_mode()
def layer_inputs(model: nn.Module, name: str, ids) -> torch.Tensor:
    """The inputs that the submodule `name` of `model` sees in one forward pass over `ids`
    (a list of token ids): (tokens, in_features), float32, on the CPU. Notebook 04 (quantization)."""
    layer = _submodule(model, name)
    seen = []
    hook = layer.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].detach()))
    try:
        model(torch.as_tensor(list(ids), dtype=torch.long, device=layer.weight.device).reshape(1, -1))
    finally:
        hook.remove()
    return seen[0].reshape(-1, seen[0].shape[-1]).float().cpu()


def scales_for(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha per input channel, divided by sqrt(max(s) * min(s)) so that the scales
    sit around 1 (any constant factor gives the same quantized layer). Notebook 04 (quantization)."""
    s = mean_abs.float().pow(alpha).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def awq_weight(weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The weight the quantized layer computes with: Q(W * s) / s, int4 in groups of
    `group_size` (min/max per group), dequantized. (out, in) float32. Notebook 04 (quantization)."""
    scaled = weight.float() * scales.float()[None, :]                   # column j times s_j
    return dequantize_int4(*quantize_int4_groupwise(scaled, group_size)) / scales.float()[None, :]


def output_error(weight: torch.Tensor, approx: torch.Tensor, activations: torch.Tensor) -> float:
    """||X W^T - X Ŵ^T||, the Frobenius norm of what quantizing the layer changed in its
    outputs over these activations (tokens, in). Notebook 04 (quantization)."""
    x = activations.float()
    return torch.linalg.norm(x @ weight.float().T - x @ approx.float().T).item()


def awq_search(weight: torch.Tensor, activations: torch.Tensor, group_size: int,
               grid=AWQ_GRID) -> tuple[torch.Tensor, list[float]]:
    """AWQ's search: for each alpha of `grid`, s = mean|x|^alpha (`scales_for`), the output
    error of Q(W * s) / s on `activations`; returns (the scales of the best alpha: (in,),
    the error of each alpha in grid order). Notebook 04 (quantization), exercise 3's answer."""
    weight = weight.detach().float()
    if activations.dim() != 2 or activations.shape[1] != weight.shape[1]:
        raise LabError(f"activations must be (tokens, {weight.shape[1]}) for a weight of shape "
                       f"{tuple(weight.shape)}, got {tuple(activations.shape)}.")
    x = activations.float()
    mean_abs = x.abs().mean(dim=0)                                      # (in,): one per input channel
    y = x @ weight.T                                                    # the float layer's output, once
    errors, best = [], None
    for alpha in grid:
        s = scales_for(mean_abs, alpha)
        errors.append(torch.linalg.norm(y - x @ awq_weight(weight, s, group_size).T).item())
        if best is None or errors[-1] < best[0]:
            best = (errors[-1], s)
    return best[1], errors


def error_removed(weight: torch.Tensor, activations: torch.Tensor, group_size: int,
                  scales: torch.Tensor) -> dict:
    """Plain int4's output error on `activations`, the scaled layer's, and the fraction the scales
    removed: {"plain", "awq", "removed"}. Notebook 04 (quantization)."""
    plain = output_error(weight, awq_weight(weight, torch.ones_like(scales), group_size), activations)
    awq = output_error(weight, awq_weight(weight, scales, group_size), activations)
    return {"plain": plain, "awq": awq, "removed": 1 - awq / plain if plain > 0 else 0.0}


@contextmanager
def awq_int4_down(model: nn.Module, name: str, group_size: int, scales: torch.Tensor | None = None):
    """While the block runs, the MLP down projection `name` is the package's int4 layer (groups of
    `group_size`, its fastest kernel) of W * s, and the up projection's rows are divided by s, so
    the down projection's input arrives as x / s. scales None: plain int4 (s = 1). Puts both
    layers back afterwards. Notebook 04 (quantization)."""
    parent_name, _, child = name.rpartition(".")
    parent = _submodule(model, parent_name)
    down, gate_up = getattr(parent, child, None), getattr(parent, "gate_up", None)
    if child != "down" or not isinstance(down, nn.Linear) or not isinstance(gate_up, nn.Linear):
        raise LabError(f"{name} is not an MLP down projection after a fused gate/up projection "
                       "(blocks.<i>.mlp.down of a Llama-style model).")
    s = (torch.ones(down.in_features) if scales is None else scales.detach().float()).to(down.weight.device)
    if s.shape != (down.in_features,):
        raise LabError(f"scales must hold one value per input channel of {name}: shape ({down.in_features},), "
                       f"got {tuple(s.shape)}.")
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
