"""The handbook chapter's claims of notebook 00 (where the time goes), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested."""

from __future__ import annotations

import math

from ..measure import HardwareProfile


def _nearest_row(rows: list[dict], batch: int) -> dict:
    """The measured row whose batch is closest to `batch`."""
    return min(rows, key=lambda r: abs(r["batch"] - batch))


def roofline_claims(rows: list[dict], profile: HardwareProfile) -> list[dict]:
    """The handbook chapter's claims about batching, each set against one dtype's decode sweep.

    Introduced in notebook 00 (where the time goes). Returns dicts with claim,
    dtype, measured (a sentence with the numbers) and verdict. The thresholds:
    "extra rows are nearly free" means 4 rows take under 1.5x the time of one;
    "compute-bound" means the step's intensity is past the ridge and its time
    grows at least half as fast as the batch between the last two batch sizes.
    """
    rows = sorted(rows, key=lambda r: r["batch"])
    name, ridge = rows[0]["dtype"], profile.ridge(rows[0]["dtype"])
    first, small, last, before_last = rows[0], _nearest_row(rows, 4), rows[-1], rows[-2]
    weight_bandwidth = first["bytes_per_s"]
    small_ratio = small["seconds"] / first["seconds"]
    growth = math.log(last["seconds"] / before_last["seconds"]) / math.log(last["batch"] / before_last["batch"])
    sixteen = _nearest_row(rows, 16)
    speedup = sixteen["tokens_per_s"] / first["tokens_per_s"]
    return [
        {"claim": "a small batch is memory-bandwidth-bound", "dtype": name,
         "measured": f"batch 1: {first['intensity']:.1f} FLOP/B (ridge {ridge:.1f}), "
                     f"{weight_bandwidth / 1e9:.1f} GB/s = {weight_bandwidth / profile.bandwidth:.0%} of copy "
                     f"bandwidth; {small['batch']} rows take {small_ratio:.2f}x the time of 1",
         "verdict": "holds" if small_ratio < 1.5 else
                    "partly: below the ridge, but extra rows are not free here"},
        {"claim": "a large batch is compute-bound", "dtype": name,
         "measured": f"batch {last['batch']}: {last['intensity']:.1f} FLOP/B, "
                     f"{last['flops_per_s'] / profile.flops[name]:.0%} of matmul peak; time grows as "
                     f"batch^{growth:.2f} from {before_last['batch']} to {last['batch']}",
         "verdict": "holds" if last["intensity"] > ridge and growth >= 0.5 else
                    ("partly: past the ridge, but time still grows slowly" if last["intensity"] > ridge
                     else "not reached in this sweep")},
        {"claim": "batch 1 -> 16 gives 10-15x the throughput", "dtype": name,
         "measured": f"batch 1 -> {sixteen['batch']}: {speedup:.1f}x "
                     f"({first['tokens_per_s']:.0f} -> {sixteen['tokens_per_s']:.0f} tokens/s)",
         "verdict": "holds" if speedup >= 10 else "less here"},
    ]
