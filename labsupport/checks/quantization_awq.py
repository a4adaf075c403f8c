"""Checker for notebook 04's exercise 3: AWQ's scale search on one layer's own activations.

Introduced in notebook 04 (quantization). The learner's `search_fn(weight, activations,
group_size, grid) -> (scales, errors)` is compared with the package's reference
(`labsupport.lab.quantization_awq.awq_search`): first on two made-up layers whose activations have
channels of very different sizes, then on the notebook's layer and the activations it
captured. The error curve (one output error per alpha) must be the reference's, the scales
those of its best alpha (up to a constant factor, which changes no quantized weight), and on
held-out activations they must remove as much of plain int4's output error as the
reference's do. Each usual slip gives another curve or other scales, and the hint names it.
"""

from __future__ import annotations

import torch

from ..engine.quant import dequantize_int4, quantize_int4_groupwise
from ..lab.quantization_awq import AWQ_GRID, awq_search, awq_weight, error_removed, output_error, scales_for
from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded

EXERCISE = "AWQ scale search"
# The search is the answer; the int4 round trip in groups is its building block (section 2's format, the
# notebook's `Q.quantize_int4_groupwise` and `Q.dequantize_int4`). The package's own search
# (lab.quantization_awq) sits above the engine: denied with every other lab function.
AWQ = Exercise(
    title=EXERCISE,
    teaches="AWQ's search over alpha: scales s = mean|x| ** alpha per input channel, the layer's output error "
            "with the int4 weight Q(W * s) / s for each alpha, and the scales of the best one",
    allowed=("labsupport.engine.quant.formats.quantize_int4_groupwise", "labsupport.engine.quant.formats.dequantize_int4"))
TOLERANCE = 0.005          # the learner's scales may remove this much less of the held-out error than the reference's


def _made_up(seed: int, out_features: int, in_features: int, tokens: int, group_size: int, grid) -> dict:
    """A layer whose input channels differ in size by a factor of about 30 (log-normal), as
    an LLM's do, with weights whose columns differ less; calibration and held-out tokens
    drawn alike."""
    generator = torch.Generator().manual_seed(seed)
    channel = torch.exp(1.2 * torch.randn(in_features, generator=generator))
    column = torch.exp(0.5 * torch.randn(in_features, generator=generator))
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05 * column
    calibration = torch.randn(tokens, in_features, generator=generator) * channel
    held_out = torch.randn(tokens, in_features, generator=generator) * channel
    return {"name": f"a made-up ({out_features}, {in_features}) layer, groups of {group_size}, {len(grid)} alphas",
            "weight": weight, "calibration": calibration, "held_out": held_out, "group_size": group_size,
            "grid": list(grid)}


def _cases() -> list[dict]:
    # best alpha 0.4 and 0.6, neither an end of its grid; in_features divisible by 128 (a group size fixed
    # at 128 runs, and gives another curve)
    return [_made_up(200, 40, 256, 48, 64, [i / 10 for i in range(11)]),
            _made_up(300, 48, 384, 64, 32, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])]


# --- the slips, each as the curve it computes ---------------------------------------------------

def _curve(weight, x, group_size, grid, statistic: torch.Tensor, how: str = "divided") -> list[float]:
    """The error per alpha of a search that computes s from `statistic` and measures `how`."""
    errors = []
    for alpha in grid:
        s = scales_for(statistic, alpha)
        if how == "divided":
            errors.append(output_error(weight, awq_weight(weight, s, group_size), x))
        elif how == "not divided":
            kept = dequantize_int4(*quantize_int4_groupwise(weight * s[None, :], group_size))
            errors.append(output_error(weight, kept, x))
        elif how == "x multiplied":
            kept = dequantize_int4(*quantize_int4_groupwise(weight * s[None, :], group_size))
            errors.append(torch.linalg.norm(x @ weight.T - (x * s) @ kept.T).item())
        else:                                                           # "weight": the weight's own error
            errors.append(torch.linalg.norm(weight - awq_weight(weight, s, group_size)).item())
    return errors


def _same_curve(got: torch.Tensor, expected: list[float]) -> bool:
    """got equals expected up to a constant factor (a norm, an RMS), or expected squared up to one
    (a sum of squares, a mean squared error): each picks the same alpha."""
    reference = torch.tensor(expected, dtype=torch.float64)
    if got.shape != reference.shape or not torch.isfinite(got).all() or (got <= 0).any() or (reference <= 0).any():
        return False
    for ratio in (got / reference, got / reference ** 2):
        if (ratio.max() / ratio.min() - 1).item() < 2e-3:
            return True
    return False


def _curve_hint(case: dict, got: torch.Tensor) -> str:
    """The usual slip behind a wrong error curve."""
    weight, x, g, grid = case["weight"], case["calibration"], case["group_size"], case["grid"]
    mean_abs = x.abs().mean(dim=0)
    if not torch.isfinite(got).all():
        return ("an error is not a number: take |x| before the mean (a signed mean can be negative, "
                "and a negative number to the power alpha is nan).")
    if got.numel() > 1 and (got.max() - got.min()).item() <= 1e-6 * got.abs().max().item():
        return ("every alpha gave the same error: scale W's columns, the input channels (W * s[None, :]). "
                "Scaling a row changes nothing, since each group's scale follows the row.")
    slips = [(_curve(weight, x, g, grid, mean_abs, "not divided"),
              "divide the dequantized weight back by s: Ŵ = dequantize(quantize(W * s)) / s. The layer then "
              "computes (x / s) (W * s)^T = x W^T; without dividing, every alpha > 0 looks worse."),
             (_curve(weight, x, g, grid, mean_abs, "x multiplied"),
              "the activations are divided by s, not multiplied: (x / s) @ Q(W * s).T, the same as x @ (Q(W * s) / s).T."),
             (_curve(weight, x, g, grid, mean_abs, "weight"),
              "that is the weight's error ||W - Ŵ||. AWQ measures the layer's output on the activations, "
              "||X W^T - X Ŵ^T||: an error in a channel with large activations counts for more."),
             (_curve(weight, x, g, grid, weight.abs().mean(dim=0)),
              "the scales come from the weights' magnitude. AWQ takes them from the activations': "
              "mean |x| per input channel, over the tokens (activations.abs().mean(dim=0))."),
             (_curve(weight, x, g, grid, x.abs().amax(dim=0)),
              "s uses each channel's largest |x|. AWQ uses the mean |x| over the tokens, activations.abs().mean(dim=0).")]
    slips += [(_curve(weight, x, other, grid, mean_abs),
               f"quantize in groups of the group_size you are given ({g} here), not {other}.")
              for other in (32, 64, 128) if other != g and weight.shape[1] % other == 0]
    for curve, hint in slips:
        if _same_curve(got, curve):
            return hint
    return ("for each alpha: s = mean|x| ** alpha per input channel, Ŵ = dequantize(quantize(W * s)) / s in "
            "groups of group_size, error = torch.linalg.norm(X @ W.T - X @ Ŵ.T).")


def _normalised(s: torch.Tensor) -> torch.Tensor:
    return s.double() / s.double().log().mean().exp()


def _scales_hint(case: dict, scales: torch.Tensor, errors: list[float]) -> str:
    """The usual slip behind scales that are not those of the best alpha."""
    grid, x, weight = case["grid"], case["calibration"], case["weight"]
    best, worst = errors.index(min(errors)), errors.index(max(errors))
    for statistic, where in ((x.abs().mean(dim=0), ""), (weight.abs().mean(dim=0), " of the weights' magnitude")):
        for i, alpha in enumerate(grid):
            if torch.allclose(_normalised(scales), _normalised(scales_for(statistic, alpha)), rtol=1e-3):
                if where:
                    return ("these scales come from the weights' magnitude: return s = mean|x| ** alpha "
                            "from the activations, for the alpha of the smallest error.")
                if i == worst:
                    last = ", the last alpha tried and" if i == len(grid) - 1 else ","
                    return (f"these are the scales of alpha = {alpha}{last} the largest error: keep the scales "
                            "of the smallest error.")
                return (f"these are the scales of alpha = {alpha}, but your own errors are smallest at alpha = "
                        f"{grid[best]}: search the grid and return the scales of the best alpha.")
    return "return the scales s = mean|x| ** alpha of the alpha with the smallest error, one per input channel."


def _answer_hint(error: Exception) -> str:
    return ("s has one value per input channel, the columns of W (out, in): W * s[None, :] scales them, "
            "and mean |x| over the tokens is activations.abs().mean(dim=0), of shape (in,).")


def _check_case(search_fn, case: dict) -> dict:
    """One layer: the curve, the scales, then the error removed on held-out activations."""
    weight, x, g, grid = case["weight"], case["calibration"], case["group_size"], case["grid"]
    label = f"{EXERCISE} ({case['name']})"
    in_features = weight.shape[1]
    answer = call_learner(label, "(scales, errors)", _answer_hint, search_fn, weight.clone(), x.clone(), g, list(grid))
    if isinstance(answer, torch.Tensor) or not isinstance(answer, (tuple, list)) or len(answer) != 2:
        fail(label, "a pair (scales, errors)", type(answer).__name__,
             "end with `return scales, errors`: the best alpha's scales, and one error per alpha of grid.")
    scales, errors = answer
    if isinstance(scales, (list, tuple)):
        fail(label, f"scales as a torch tensor of shape ({in_features},)", type(scales).__name__,
             "keep the scales a tensor: s = mean_abs ** alpha is one already.")
    if not isinstance(scales, torch.Tensor) or scales.numel() == 1:
        value = float(scales) if isinstance(scales, (int, float, torch.Tensor)) else None
        fail(label, f"scales of shape ({in_features},)", f"{type(scales).__name__} {value}",
             "return the scales s = mean|x| ** alpha, one per input channel, not alpha itself."
             if value is not None and any(abs(value - a) < 1e-9 for a in grid) else
             "one scale per input channel: the mean |x| over the tokens only, activations.abs().mean(dim=0).")
    scales = scales.detach().cpu()
    if scales.dim() == 2 and 1 in scales.shape:                         # (1, in) or (in, 1): the same scales
        scales = scales.reshape(-1)
    if scales.shape != (in_features,):
        fail(label, f"scales of shape ({in_features},), one per input channel", f"shape {tuple(scales.shape)}",
             "those are scales on the output dimension (W's rows). AWQ scales the input channels, W's columns: "
             "s from activations.abs().mean(dim=0), applied as W * s[None, :]."
             if scales.numel() == weight.shape[0] else _answer_hint(ValueError()))
    try:
        got = torch.as_tensor([float(e) for e in errors], dtype=torch.float64)
    except (TypeError, ValueError):
        fail(label, f"errors as {len(grid)} numbers", type(errors).__name__,
             "errors: a list of floats, one per alpha of grid, e.g. errors.append(torch.linalg.norm(...).item()).")
    reference_scales, reference_errors = awq_search(weight, x, g, grid)
    if got.numel() != len(grid):
        fail(label, f"{len(grid)} errors, one per alpha of grid {grid}", f"{got.numel()}",
             "try every alpha of grid, in its order: the search is what chooses alpha, "
             "so none may be fixed in advance.")
    if not _same_curve(got, reference_errors):
        fail(label, f"errors {[round(e, 3) for e in reference_errors[:4]]}...",
             f"{[round(e, 3) for e in got.tolist()[:4]]}...", _curve_hint(case, got))
    if not torch.isfinite(scales.float()).all() or (scales <= 0).any() or \
            not torch.allclose(_normalised(scales), _normalised(reference_scales), rtol=1e-3):
        best = case["grid"][reference_errors.index(min(reference_errors))]
        fail(label, f"the scales of alpha = {best}, the smallest error", "other scales",
             _scales_hint(case, scales.float(), got.tolist()))
    ours = error_removed(weight, case["held_out"], g, scales.float())
    reference = error_removed(weight, case["held_out"], g, reference_scales)
    if reference["removed"] <= 0:
        fail(label, "held-out activations on which the reference's scales remove some error",
             f"{reference['removed']:.1%} removed", "calibrate and check on activations of the same layer.")
    if ours["removed"] < reference["removed"] - TOLERANCE:
        fail(label, f"at least {reference['removed'] - TOLERANCE:.1%} of plain int4's output error removed on "
                    "held-out activations", f"{ours['removed']:.1%}",
             "return the best alpha's scales as they are: positive, one per input channel.")
    return {"alpha": case["grid"][reference_errors.index(min(reference_errors))], **ours}


@grades_quietly
@graded(AWQ)
def check_awq_search(search_fn, weight=None, calibration=None, held_out=None, group_size: int = 128,
                     grid=AWQ_GRID, layer: str = "the notebook's layer") -> None:
    """Check a learner's `search_fn(weight, activations, group_size, grid) -> (scales, errors)`:
    AWQ's search over alpha with s = mean|x|^alpha per input channel, the output error of
    Q(W * s) / s for each alpha, and the scales of the best one.

    Introduced in notebook 04 (quantization). Runs on two made-up layers, then, when given,
    on the notebook's `weight` (out, in) with its `calibration` activations (tokens, in): the
    scales must remove as much of plain int4's output error on `held_out` activations as the
    reference's (`lab.quantization_awq.awq_search`) do, within half a percentage point.
    """
    cases = _cases()
    if weight is not None:
        if calibration is None or held_out is None:
            fail(EXERCISE, "calibration and held-out activations with the weight", "only the weight",
                 "pass the activations the notebook captured: check_awq_search(awq_search, W, X_calib, X_held, ...).")
        cases.append({"name": layer, "weight": weight.detach().float().cpu(), "calibration": calibration.float().cpu(),
                      "held_out": held_out.float().cpu(), "group_size": group_size, "grid": list(grid)})
    results = [_check_case(search_fn, case) for case in cases]
    last = results[-1]
    passed(EXERCISE, f"Same error curve and scales as the reference on {len(cases)} layers. On the held-out "
                     f"activations of {cases[-1]['name']}, alpha = {last['alpha']} removes {last['removed']:.1%} of "
                     f"plain int4's output error ({last['plain']:.4g} -> {last['awq']:.4g}).")
