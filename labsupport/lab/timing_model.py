"""The model a speed-only sweep times, and how big its sweeps may be on this device's memory.

Introduced in notebook 00 (where the time goes); notebook 02 (batching) and the benchmark
(`bench.core.BenchContext.timing_model`) choose their timed model here too.

On a CUDA GPU the course's 135M model decodes in a few dozen microseconds of kernel launches,
so a sweep of it measures the launches, not the memory or the arithmetic the lesson is about.
There a sweep times random weights at SmolLM2-1.7B's shape instead (built on the device, no
download) where the GPU's memory holds them (`workloads.timing_model_name`): in the sweep's
dtype where that fits, else in 16-bit (`engine.hardware.pick_dtype`: fp16 on a T4). Every CPU
keeps the course's model. Only speed is measured on it: its tokens mean nothing, so quality is
always measured on the course's model.

Every sweep's batch sizes and contexts are sized from the memory that is free when it runs
(`sweep_budget`, `batches_that_fit`): a point that would not fit is left out, and the sweep
says so (`Sweep.note`, and a `SweepCapped` warning), never silently.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from ..engine.compiled import bucket_length, bucket_rows
from ..engine.hardware import pick_dtype
from ..engine.kv_cache import kv_cache_bytes
from ..engine.config import PRESETS as MODEL_SHAPES
from ..errors import LabError
from ..weights.fixtures import random_model
from .workloads import timing_model_name

RANDOM = " (random weights)"           # what a timed model's name says when it is not the course's
HEADROOM = 0.65                        # a sweep may fill 65% of the free GPU memory: the allocator,
                                       # CUDA graphs and the notebook's other tensors need the rest
GIB = 2 ** 30
_BUILT = weakref.WeakValueDictionary()  # (name, device, dtype) -> a timing model alive now: built once


def timed_dtype(device, dtype) -> torch.dtype:
    """The dtype a sweep asked to run in `dtype` times the timing model in: `dtype` where its weights
    fit this GPU (`workloads.timing_model_name`), else the device's 16-bit (`pick_dtype`).
    Introduced in notebook 00 (where the time goes): a T4 times fp16, never an fp32 1.7B model."""
    return dtype if timing_model_name(device, dtype) is not None else pick_dtype(device)


def timing_model(model: torch.nn.Module, dtype=None) -> tuple[torch.nn.Module, str]:
    """(the model a speed sweep times, its name) in place of the course's `model`: `model` itself
    and its name, except on a GPU that holds SmolLM2-1.7B's shape in 16-bit (`workloads.timing_model_name`),
    where it is random weights at that shape in `dtype` (`model`'s own by default; 16-bit where
    `dtype`'s weights would not fit, `timed_dtype`) on its device. A course model at least that
    big (LABSUPPORT_MODEL=smollm2-1.7b) is timed itself.

    Introduced in notebook 00 (where the time goes); notebook 02 (batching) too."""
    device = model.device
    name = timing_model_name(device, pick_dtype(device))
    if name is None or model.config.num_parameters >= MODEL_SHAPES[name].num_parameters:
        return model, model.config.name
    dtype = timed_dtype(device, dtype or model.dtype)
    key = (name, str(device), dtype)
    if key not in _BUILT:                # fp32 and fp16 asked on a T4 share one fp16 model
        built = random_model(name, seed=0, device=device, dtype=dtype)
        _BUILT[key] = built
        return built, name + RANDOM
    return _BUILT[key], name + RANDOM


def timed_model_sentence(timed: str, course: str) -> str:
    """One sentence saying which model a sweep timed, and why when it is not the course's `course`.

    Introduced in notebook 00 (where the time goes); notebook 02 and the benchmark's notes say it too."""
    if timed == course:
        return f"Timed model: {course}, the course's model."
    return (f"Timed model: {timed}, not {course}: on a GPU the {course} decode step is launch-bound "
            "(kernel launches, not memory or arithmetic, set its time), so speed is timed at SmolLM2-1.7B's "
            "shape, whose tokens mean nothing.")


# --- sizing a sweep from the free memory ------------------------------------------------------

class SweepCapped(UserWarning):
    """Shown when a sweep leaves out points that would not fit in memory. Notebook 00 (where the time goes)."""


class Sweep(list):
    """A sweep's rows (a list of dicts) and `note`: which points were left out to fit in memory and
    why (None: none were). Introduced in notebook 00 (where the time goes)."""

    note: str | None = None


def sweep_budget(device) -> int | None:
    """Bytes a sweep may allocate on `device` beyond what is already there: `HEADROOM` of the free
    CUDA memory now (`torch.cuda.mem_get_info`), None on a CPU (uncapped: the presets are small).
    Introduced in notebook 00 (where the time goes)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)          # (free, total) bytes
    return int(HEADROOM * free)


def run_bytes(config, batch: int, positions: int, dtype, tokens: int = 1, bucketed: bool = False) -> int:
    """Memory one forward pass adds: the KV cache of `batch` rows x `positions` positions, and the
    widest activations of `tokens` new tokens per row (the MLP's three intermediate tensors, the
    attention scores, fp32 logits), counted twice for the allocator's spare blocks. bucketed: the
    rows and positions the compiled decoder really allocates (`compiled.cache_bytes`: powers of two).
    Introduced in notebook 00 (where the time goes); notebook 02's sweep is bucketed."""
    if bucketed:
        batch, positions = bucket_rows(batch), bucket_length(positions, config.max_position)
    size = torch.empty((), dtype=dtype).element_size()
    per_token = 3 * config.intermediate_size * size + config.num_heads * positions * 4
    activations = batch * (tokens * per_token + config.vocab_size * 4)
    return kv_cache_bytes(config, positions, batch, dtype) + 2 * activations


def capped(rows: list, note: str | None) -> Sweep:
    """`rows` as a `Sweep` carrying `note`, warned once (`SweepCapped`) when there is one.
    Introduced in notebook 00 (where the time goes)."""
    sweep = Sweep(rows)
    sweep.note = note
    if note:
        warnings.warn(note, SweepCapped, stacklevel=3)
    return sweep


def batches_that_fit(config, batches, positions: int, dtype, device, tokens: int = 1,
                     budget_bytes: int | None = None, bucketed: bool | None = None) -> tuple[list[int], str | None]:
    """(the batch sizes of `batches` whose `run_bytes` fits the budget, a note naming those left out
    or None). `budget_bytes` None: `sweep_budget(device)` (uncapped on a CPU). bucketed: size each
    cache as the compiled decoder allocates it (`compiled.cache_bytes`); None: on a CUDA GPU, where
    a timed `generate` decodes through it (`measure.timed_compile`). A sweep over a cache it makes
    itself, of exactly `positions` (`step_timing.filled_cache`), passes False.
    Introduced in notebook 00 (where the time goes); notebook 02's sweep is sized here too."""
    budget = sweep_budget(device) if budget_bytes is None else budget_bytes
    batches = list(batches)
    if budget is None:
        return batches, None
    bucketed = torch.device(device).type == "cuda" if bucketed is None else bucketed
    kept = [b for b in batches if run_bytes(config, b, positions, dtype, tokens, bucketed) <= budget]
    if not kept:
        raise LabError(f"Not even batch {min(batches)} of {config.name} at {positions} positions fits the "
                       f"{budget / GIB:.1f} GiB this sweep may use; free some memory (del a model) and re-run.")
    left_out = [b for b in batches if b not in kept]
    if not left_out:
        return kept, None
    need = run_bytes(config, max(left_out), positions, dtype, tokens, bucketed)
    cache = (f" (its cache {bucket_rows(max(left_out))} rows x {bucket_length(positions, config.max_position)} "
             f"positions, the compiled decoder's buckets)" if bucketed else "")
    return kept, (f"Batches {left_out} left out: batch {max(left_out)} of {config.name} at {positions} positions "
                  f"needs {need / GIB:.1f} GiB{cache}, over the {budget / GIB:.1f} GiB this sweep may use "
                  f"({HEADROOM:.0%} of the free memory).")
