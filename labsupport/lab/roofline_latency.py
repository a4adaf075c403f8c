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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import LabError
from .roofline_hardware import DATA_SHEETS, sixteen_bit
from .roofline import attention_flops, bytes_per_value, decode_step_cost, matmul_params, params_read_per_step


def prefill_flops(config, prompt_tokens: int) -> float:
    """FLOPs of one prefill of `prompt_tokens` tokens: every matmul weight twice per token, the output
    layer for the last position only (the engine projects only what it samples from), and causal
    attention (position t attends to t earlier positions). Notebook 00 (where the time goes)."""
    if prompt_tokens < 1:
        raise LabError(f"A prefill needs at least 1 prompt token, got {prompt_tokens}.")
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
    if new_tokens < 1:
        raise LabError(f"A request makes at least 1 new token, got new_tokens={new_tokens}.")
    if not (bandwidth > 0 and peak_flops > 0):
        raise LabError(f"Bandwidth and peak FLOP/s must be positive, got {bandwidth} and {peak_flops}.")
    flops = prefill_flops(config, prompt_tokens)
    weights = params_read_per_step(config) * bytes_per_value(dtype)
    ttft_compute, ttft_memory = flops / peak_flops, weights / bandwidth
    step = decode_step_cost(config, 1, prompt_tokens + new_tokens // 2, dtype)
    tpot_compute, tpot_memory = step.flops / peak_flops, step.bytes / bandwidth
    ttft, tpot = max(ttft_compute, ttft_memory), max(tpot_compute, tpot_memory)
    return LatencyEstimate(machine=machine, dtype=str(dtype).replace("torch.", ""),
                           ttft_s=ttft, ttft_bound="compute" if ttft_compute >= ttft_memory else "memory",
                           tpot_s=tpot, tpot_bound="compute" if tpot_compute >= tpot_memory else "memory",
                           request_s=ttft + (new_tokens - 1) * tpot)


def data_sheet_estimates(config, prompt_tokens: int, new_tokens: int, sheets=DATA_SHEETS) -> list[LatencyEstimate]:
    """`estimate` on every data sheet of `roofline_hardware`, in 16 bits where the chip has a 16-bit rate,
    else fp32. Notebook 00 (where the time goes)."""
    rows = []
    for sheet in sheets:
        dtype = sixteen_bit(sheet) or "float32"
        rows.append(estimate(config, prompt_tokens, new_tokens, sheet.bandwidth, sheet.flops[dtype], dtype, sheet.name))
    return rows


def markdown_estimates(rows: list[LatencyEstimate]) -> str:
    """Estimates as a markdown table, times in milliseconds. Notebook 00 (where the time goes)."""
    lines = ["| machine | dtype | TTFT ms (bound) | TPOT ms (bound) | whole request ms |", "|---|---|---|---|---|"]
    lines += [f"| {r.machine} | {r.dtype} | {r.ttft_s * 1e3:,.2f} ({r.ttft_bound}) | "
              f"{r.tpot_s * 1e3:,.3f} ({r.tpot_bound}) | {r.request_s * 1e3:,.1f} |" for r in rows]
    return "\n".join(lines)
