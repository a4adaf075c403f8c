"""The model a speed-only sweep times: the course's own, or on a big GPU one at SmolLM2-1.7B's shape.

Introduced in notebook 00 (where the time goes); notebook 02 (batching) and the benchmark
(`bench.core.BenchContext.timing_model`) choose their timed model here too.

`workloads.timing_model_name` decides: on a CUDA GPU with 40 GiB or more (an A100, H100,
H200) the course's 135M model decodes in a few dozen microseconds of kernel launches, so a
sweep of it measures the launches, not the memory or the arithmetic the lesson is about.
There a sweep times random weights at SmolLM2-1.7B's shape instead (built on the device, no
download); a T4 and every CPU keep the course's model. Only speed is measured on it: its
tokens mean nothing, so quality is always measured on the course's model.
"""

from __future__ import annotations

import torch

from ..weights.fixtures import random_model
from .workloads import timing_model_name

RANDOM = " (random weights)"           # what a timed model's name says when it is not the course's


def timing_model(model: torch.nn.Module, dtype=None) -> tuple[torch.nn.Module, str]:
    """(the model a speed sweep times, its name) in place of the course's `model`: `model` itself
    and its name, except on a big GPU (`workloads.timing_model_name`), where it is a new
    random-weight model at SmolLM2-1.7B's shape in `dtype` (`model`'s own by default) on its device.

    Introduced in notebook 00 (where the time goes); notebook 02 (batching) too."""
    name = timing_model_name(model.device)
    if name is None:
        return model, model.config.name
    return random_model(name, seed=0, device=model.device, dtype=dtype or model.dtype), name + RANDOM


def timed_model_sentence(timed: str, course: str) -> str:
    """One sentence saying which model a sweep timed, and why when it is not the course's `course`.

    Introduced in notebook 00 (where the time goes); notebook 02 and the benchmark's notes say it too."""
    if timed == course:
        return f"Timed model: {course}, the course's model."
    return (f"Timed model: {timed}, not {course}: on a GPU this big the {course} decode step is launch-bound "
            "(kernel launches, not memory or arithmetic, set its time), so speed is timed at SmolLM2-1.7B's "
            "shape, whose tokens mean nothing.")
