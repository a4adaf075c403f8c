"""A latency model: how long a request should take, from two numbers on a data sheet.

Introduced in notebook 00 (where the time goes). A request's time has two parts:

    TTFT (time to first token) = the prefill: every prompt token passes through every weight.
        It does 2 x parameters x prompt FLOPs and reads the weights once, so it is compute-bound
        for any prompt longer than the ridge (some tens of tokens on a CPU, hundreds on a GPU):
        TTFT ~ prefill FLOPs / peak FLOP/s.
    TPOT (time per output token) = one decode step: one token passes through every weight,
        2 FLOPs per weight read, far below the ridge, so it is memory-bound:
        TPOT ~ bytes read per step / memory bandwidth.

Each estimate takes the larger of its two roofs (the roofline's max(FLOPs / peak, bytes /
bandwidth)), so it is a floor: a real engine adds kernel launches, Python and the attention
it does not fuse. Notebook 00 sets the floor beside this machine's measured TTFT and TPOT.

Token counts are whole numbers (not bools) from 1 to MAX_TOKENS, and bandwidths and FLOP/s
finite numbers of at least 1 (bytes/s, FLOP/s); anything else gets one sentence (a LabError),
so every estimate is a finite number of seconds and grows with the prompt and the answer.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

from ..engine.config import ModelConfig
from ..errors import LabError
from .roofline_hardware import DATA_SHEETS, DataSheet, sixteen_bit
from .roofline import attention_flops, bytes_per_value, decode_step_cost, matmul_params, params_read_per_step

MAX_TOKENS = 10 ** 12            # a trillion tokens: beyond any request, and every estimate stays a finite float


def _tokens(value, name: str, need: str) -> int:
    """A token count as an int from 1 to MAX_TOKENS (an integer NumPy or torch scalar too); else one
    sentence that starts with `need` ("A prefill needs at least 1 prompt token")."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0 and "int" in str(getattr(value, "dtype", "")):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_TOKENS:
        raise LabError(f"{need} and at most {MAX_TOKENS:.0e} (a whole number); got {name}={value!r:.40}.")
    return int(value)


def _rate(value, name: str) -> float:
    """A bandwidth (bytes/s) or a FLOP rate (FLOP/s) as a float, finite and at least 1 (below one byte
    or one FLOP a second no estimate is a finite number of seconds); else one sentence."""
    try:
        rate = math.nan if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(value)
    except OverflowError:                                   # an int beyond float's range
        rate = math.inf
    if not 1 <= rate < math.inf:                            # nan fails too
        raise LabError(f"Bandwidth and peak FLOP/s must be positive finite numbers, in bytes/s and FLOP/s "
                       f"(at least 1); got {name}={value!r:.40}.")
    return rate


def _config(config) -> ModelConfig:
    """A ModelConfig; else one sentence."""
    if not isinstance(config, ModelConfig):
        raise LabError(f"config must be a ModelConfig (model.config, or PRESETS['smollm2-135m']), "
                       f"got {type(config).__name__}.")
    return config


def _bytes_per_value(dtype) -> int:
    """Bytes per stored value of `dtype` (a dtype, its name, or a whole number of bytes >= 1); else one sentence."""
    if isinstance(dtype, bool) or (isinstance(dtype, numbers.Number) and not isinstance(dtype, numbers.Integral)) \
            or (isinstance(dtype, numbers.Integral) and not 1 <= dtype <= 64):
        raise LabError(f"dtype must be a torch dtype, its name (\"float32\", \"bf16\") or bytes per value from "
                       f"1 to 64, got {dtype!r:.40}.")
    return bytes_per_value(int(dtype) if isinstance(dtype, numbers.Integral) else dtype)


def prefill_flops(config, prompt_tokens: int) -> float:
    """FLOPs of one prefill of `prompt_tokens` tokens: every matmul weight twice per token, the output
    layer for the last position only (the engine projects only what it samples from), and causal
    attention (position t attends to t earlier positions). Notebook 00 (where the time goes)."""
    config = _config(config)
    prompt_tokens = _tokens(prompt_tokens, "prompt_tokens", "A prefill needs at least 1 prompt token")
    output_layer = config.vocab_size * config.hidden_size
    matmuls = 2 * (matmul_params(config) - output_layer) * prompt_tokens + 2 * output_layer
    # position t attends to the t positions before it: 0 + 1 + ... + (T - 1) = T (T - 1) / 2
    attention = attention_flops(config, 1, 1) * prompt_tokens * (prompt_tokens - 1) // 2
    return float(matmuls + attention)


@dataclass(frozen=True)
class LatencyEstimate:
    """TTFT and TPOT floors for one request on one machine, and which roof sets each.
    Notebook 00 (where the time goes)."""

    machine: str
    dtype: str
    ttft_s: float
    ttft_bound: str          # "compute" or "memory"
    tpot_s: float
    tpot_bound: str
    request_s: float         # TTFT + (new tokens - 1) x TPOT

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(config, prompt_tokens: int, new_tokens: int, bandwidth: float, peak_flops: float,
             dtype="float32", machine: str = "") -> LatencyEstimate:
    """The latency model for one request of `prompt_tokens` in and `new_tokens` out, on a machine with
    `bandwidth` bytes/s and `peak_flops` FLOP/s in `dtype` (the weights' and the cache's storage type).
    TPOT is the decode step at the request's mean context. Notebook 00 (where the time goes)."""
    prompt_tokens = _tokens(prompt_tokens, "prompt_tokens", "A prefill needs at least 1 prompt token")
    flops = prefill_flops(config, prompt_tokens)                        # and checks config
    new_tokens = _tokens(new_tokens, "new_tokens", "A request makes at least 1 new token")
    bandwidth, peak_flops = _rate(bandwidth, "bandwidth"), _rate(peak_flops, "peak_flops")
    size = _bytes_per_value(dtype)
    if not isinstance(machine, str):
        raise LabError(f"machine must be a name (a str), got {type(machine).__name__}.")
    weights = params_read_per_step(config) * size
    ttft_compute, ttft_memory = flops / peak_flops, weights / bandwidth
    step = decode_step_cost(config, 1, prompt_tokens + new_tokens // 2, size)
    tpot_compute, tpot_memory = step.flops / peak_flops, step.bytes / bandwidth
    ttft, tpot = max(ttft_compute, ttft_memory), max(tpot_compute, tpot_memory)
    return LatencyEstimate(machine=machine, dtype=str(dtype).replace("torch.", ""),
                           ttft_s=ttft, ttft_bound="compute" if ttft_compute >= ttft_memory else "memory",
                           tpot_s=tpot, tpot_bound="compute" if tpot_compute >= tpot_memory else "memory",
                           request_s=ttft + (new_tokens - 1) * tpot)


def data_sheet_estimates(config, prompt_tokens: int, new_tokens: int, sheets=DATA_SHEETS) -> list[LatencyEstimate]:
    """`estimate` on every data sheet of `roofline_hardware`, in 16 bits where the chip has a 16-bit rate,
    else fp32. Notebook 00 (where the time goes)."""
    if not isinstance(sheets, (list, tuple)) or not all(isinstance(sheet, DataSheet) for sheet in sheets):
        raise LabError("sheets must be a list of DataSheets (roofline_hardware.DATA_SHEETS, or some of them).")
    rows = []
    for sheet in sheets:
        dtype = sixteen_bit(sheet) or "float32"
        if dtype not in sheet.flops:
            raise LabError(f"The data sheet {sheet.name!r} has no 16-bit or float32 FLOP/s; give it one.")
        rows.append(estimate(config, prompt_tokens, new_tokens, sheet.bandwidth, sheet.flops[dtype], dtype, sheet.name))
    return rows


def markdown_estimates(rows: list[LatencyEstimate]) -> str:
    """Estimates as a markdown table, times in milliseconds. Notebook 00 (where the time goes)."""
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, LatencyEstimate) for r in rows):
        raise LabError("markdown_estimates takes a list of LatencyEstimates (estimate's or data_sheet_estimates').")
    lines = ["| machine | dtype | TTFT ms (bound) | TPOT ms (bound) | whole request ms |", "|---|---|---|---|---|"]
    lines += [f"| {r.machine} | {r.dtype} | {r.ttft_s * 1e3:,.2f} ({r.ttft_bound}) | "
              f"{r.tpot_s * 1e3:,.3f} ({r.tpot_bound}) | {r.request_s * 1e3:,.1f} |" for r in rows]
    return "\n".join(lines)
