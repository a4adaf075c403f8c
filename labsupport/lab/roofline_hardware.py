"""Real hardware from the vendors' data sheets, and this run's decode set against it (MBU, MFU).

Introduced in notebook 00 (where the time goes). `ls.probe` measures the two roofs of the
machine the notebook runs on; this module holds the same two numbers for the machines
learners meet (a Colab T4, an A100, an H100, an H200, an AVX2 laptop, an Apple M2), as the
vendors publish them, so that a ridge point measured here can be read next to theirs.

The numbers are peak figures from data sheets (dense tensor-core math for the GPUs' 16-bit
rows, no sparsity), not measurements: a copy kernel reaches some 80-90% of a GPU's
memory bandwidth, a matmul some 70-80% of its peak. Each chip names its source.

Two utilisations put one measured decode step against a machine's limits (the names are
from the PaLM paper, Chowdhery et al. 2022, for MFU, and from Databricks' and others'
inference write-ups for MBU):

    MBU (model bandwidth utilisation) = bytes read per step / step time / bandwidth
    MFU (model FLOPs utilisation)     = FLOPs per step / step time / peak FLOP/s

At batch 1 decode is memory-bound, so a good engine's MBU is high and its MFU tiny.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.hardware import dtype_name
from .roofs import HardwareProfile

SIXTEEN_BITS = ("bfloat16", "float16")


@dataclass(frozen=True)
class DataSheet:
    """One machine as its vendor publishes it: memory bandwidth (bytes/s), peak FLOP/s per
    dtype name, and where the numbers come from. Introduced in notebook 00 (where the time goes)."""

    name: str
    kind: str                      # "cuda", "cpu" or "mps": what labsupport would pick there
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)
    source: str = ""
    note: str = ""

    def profile(self) -> HardwareProfile:
        """The data sheet as a `roofs.HardwareProfile`, so `roofline.ridge_batch` reads it like a probe.
        Notebook 00 (where the time goes)."""
        return HardwareProfile(device=self.kind, name=self.name, bandwidth=self.bandwidth, flops=dict(self.flops))

    def ridge(self, dtype) -> float | None:
        """Peak FLOP/s / bandwidth in `dtype` (None where the sheet gives no rate for it).
        Notebook 00 (where the time goes)."""
        peak = self.flops.get(dtype_name(dtype))
        return None if peak is None else peak / self.bandwidth


T, G = 1e12, 1e9
DATA_SHEETS: tuple[DataSheet, ...] = (
    DataSheet("AVX2 laptop (AMD Ryzen 7 5800U)", "cpu", 51.2 * G, {"float32": 486 * G},
              "AMD product page (8 Zen 3 cores, 1.9 GHz base, dual-channel DDR4-3200 = 51.2 GB/s); "
              "Zen 3 does 32 fp32 FLOP per cycle per core (two 256-bit FMA units): 8 x 1.9 GHz x 32",
              "no bf16 or fp16 instructions: 16-bit is emulated, at or below the fp32 rate"),
    DataSheet("Apple M2 (10-core GPU)", "mps", 100 * G, {"float32": 3.6 * T},
              "Apple newsroom, 'Apple unveils M2' (June 2022): 100 GB/s unified memory, GPU 3.6 TFLOPS",
              "Apple publishes no separate 16-bit rate"),
    DataSheet("NVIDIA T4", "cuda", 320 * G, {"float32": 8.1 * T, "float16": 65 * T},
              "NVIDIA T4 Tensor Core GPU data sheet: 320 GB/s GDDR6, FP32 8.1 TFLOPS, FP16 tensor 65 TFLOPS",
              "no bf16 units (compute capability 7.5)"),
    DataSheet("NVIDIA A100 SXM 80GB", "cuda", 2039 * G,
              {"float32": 19.5 * T, "bfloat16": 312 * T, "float16": 312 * T},
              "NVIDIA A100 Tensor Core GPU data sheet: 2,039 GB/s HBM2e, FP32 19.5 TFLOPS, "
              "BF16/FP16 tensor 312 TFLOPS dense"),
    DataSheet("NVIDIA H100 SXM", "cuda", 3350 * G,
              {"float32": 67 * T, "bfloat16": 989 * T, "float16": 989 * T},
              "NVIDIA H100 Tensor Core GPU data sheet: 3.35 TB/s HBM3, FP32 67 TFLOPS, "
              "BF16/FP16 tensor 1,979 TFLOPS with sparsity, 989 dense"),
    DataSheet("NVIDIA H200 SXM", "cuda", 4800 * G,
              {"float32": 67 * T, "bfloat16": 989 * T, "float16": 989 * T},
              "NVIDIA H200 Tensor Core GPU data sheet: 4.8 TB/s HBM3e, FP32 67 TFLOPS, "
              "BF16/FP16 tensor 1,979 TFLOPS with sparsity, 989 dense"),
)


def sixteen_bit(sheet: DataSheet) -> str | None:
    """The 16-bit dtype a sheet has a rate for (bfloat16 before float16), None if neither.
    Notebook 00 (where the time goes)."""
    return next((d for d in SIXTEEN_BITS if d in sheet.flops), None)


def hardware_rows(config, context: int = 0, sheets=DATA_SHEETS) -> list[dict]:
    """One row per data sheet: bandwidth, peaks, ridge per dtype, the batch at which a decode step
    of `config` reaches each ridge (`roofline.ridge_batch`), and the batch-1 tokens/s ceiling
    (bandwidth / bytes read per step) in 16 bits where the chip has them, else fp32.

    Introduced in notebook 00 (where the time goes)."""
    from .roofline import decode_step_cost, ridge_batch
    rows = []
    for sheet in sheets:
        half = sixteen_bit(sheet)
        ceiling_dtype = half or "float32"
        one_row = decode_step_cost(config, 1, context, ceiling_dtype)
        row = {"machine": sheet.name, "GB/s": sheet.bandwidth / G,
               "fp32 TFLOP/s": sheet.flops["float32"] / T,
               "16-bit TFLOP/s": sheet.flops[half] / T if half else None, "16-bit": half,
               "ridge fp32": sheet.ridge("float32"), "ridge 16-bit": sheet.ridge(half) if half else None,
               "ridge batch fp32": ridge_batch(sheet.profile(), config, "float32", context),
               "ridge batch 16-bit": ridge_batch(sheet.profile(), config, half, context) if half else None,
               "batch-1 tokens/s ceiling": sheet.bandwidth / one_row.bytes, "ceiling dtype": ceiling_dtype,
               "source": sheet.source, "note": sheet.note}
        rows.append(row)
    return rows


def markdown_hardware_table(rows: list[dict], model_name: str) -> str:
    """`hardware_rows` as a markdown table, the sources as a numbered list under it.
    Notebook 00 (where the time goes)."""
    def num(value, fmt):
        return "-" if value is None else ("never" if value == float("inf") else format(value, fmt))

    lines = [f"| machine | memory GB/s | fp32 TFLOP/s | 16-bit TFLOP/s | ridge fp32 [FLOP/B] | ridge 16-bit "
             f"| {model_name} ridge batch fp32 | ridge batch 16-bit | batch-1 tokens/s at most |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        half = f" ({r['16-bit']})" if r["16-bit"] else ""
        lines.append(f"| {r['machine']} [{i}] | {r['GB/s']:,.0f} | {r['fp32 TFLOP/s']:.2f} | "
                     f"{num(r['16-bit TFLOP/s'], '.0f')}{half} | {r['ridge fp32']:.1f} | "
                     f"{num(r['ridge 16-bit'], '.0f')} | {num(r['ridge batch fp32'], '.0f')} | "
                     f"{num(r['ridge batch 16-bit'], '.0f')} | {r['batch-1 tokens/s ceiling']:,.0f} "
                     f"({r['ceiling dtype']}) |")
    lines.append("")
    lines += [f"[{i}] {r['source']}" + (f"; {r['note']}" if r["note"] else "") + "." for i, r in enumerate(rows, 1)]
    return "\n".join(lines)


def utilisation(row: dict, profile: HardwareProfile) -> dict:
    """MBU and MFU of one measured step (a `roofline.sweep_decode` row) against `profile`'s measured
    bandwidth and matmul peak in the row's dtype: {"mbu": ..., "mbu_copy": ..., "mfu": ...},
    fractions. "mbu" is against the read probe (a step only reads), "mbu_copy" against the copy
    probe; where the read probe was not measured, "mbu" is against the copy too.

    Introduced in notebook 00 (where the time goes)."""
    reached = row["bytes"] / row["seconds"]
    return {"mbu": reached / (profile.read_bandwidth or profile.bandwidth), "mbu_copy": reached / profile.bandwidth,
            "mfu": row["flops"] / row["seconds"] / profile.flops[row["dtype"]]}
