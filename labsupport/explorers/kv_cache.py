"""Notebook 01's explorer: sequence length and cache on/off, live.

Introduced in notebook 01 (KV cache).

It opens with the notebook's own measurements: the step times of section 4 and the
allocations of section 6. Moving the length slider (on release) times one generation
step at that length, with or without the cache, and redraws two figures: time per
token against the lengths measured so far, and cache memory against length. Every
measured point is kept, so going back to a length already seen is instant and the
curves fill in as the learner explores.
"""

from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets

from ..engine.kv_cache import StaticKVCache
from ..lab.kv_cache_timing import MODES, time_per_token_by_position
from ..plots.kv_cache import cache_memory_figure, per_token_time_figure
from ..lab.workloads import preset
from .base import Explorer


class StepTimes:
    """Measured seconds per step, keyed by (sequence length, use_cache); measures on a miss.
    Notebook 01 (KV cache)."""

    def __init__(self, model, prompt_len: int, repeats: int, measured: Sequence[dict] = ()):
        self.model, self.prompt_len, self.repeats = model, prompt_len, repeats
        self.seconds: dict[tuple[int, bool], float] = {
            (row["sequence_length"], use_cache): row[name]
            for row in measured for use_cache, name in MODES.items() if name in row}

    def get(self, length: int, use_cache: bool) -> float:
        key = (length, use_cache)
        if key not in self.seconds:
            prompt_len = min(self.prompt_len, length)
            row, = time_per_token_by_position(self.model, [length - prompt_len], prompt_len,
                                              use_cache=use_cache, repeats=self.repeats)
            self.seconds[key] = row[MODES[use_cache]]
        return self.seconds[key]

    def rows(self) -> list[dict]:
        """Everything measured so far, one row per length (as per_token_time_figure reads them)."""
        by_length: dict[int, dict] = {}
        for (length, use_cache), seconds in self.seconds.items():
            row = by_length.setdefault(length, {"sequence_length": length, "position": length})
            row[MODES[use_cache]] = seconds
        return list(by_length.values())


def _opening_length(measured: Sequence[dict], step: int, max_length: int, fallback: int) -> int:
    """The longest measured sequence length the slider can show (a multiple of `step`), else `fallback`."""
    on_slider = [r["sequence_length"] for r in measured
                 if r["sequence_length"] % step == 0 and step <= r["sequence_length"] <= max_length]
    return max(on_slider, default=fallback)


def kv_cache_explorer(model, max_length: int | None = None, initial_length: int | None = None,
                      step: int = 16, prompt_len: int = 16, repeats: int = 3,
                      measured: Sequence[dict] = (), allocated: Sequence[tuple[int, int]] = (),
                      use_widget: bool | None = None) -> Explorer:
    """Controls: sequence length (slider) and KV cache on/off; figures: time per token
    and cache memory.

    Introduced in notebook 01 (KV cache). max_length defaults to the device's
    ``kv_explorer_max_length`` (`workloads.PRESETS`: 1024 on a CPU, 4096 on a GPU), never
    past the model's context. measured: rows already timed
    (`kv_cache_timing.time_per_token_by_position` with the same prompt_len), shown at once and
    never timed again; allocated: (length, bytes) pairs already allocated. initial_length:
    where the slider opens; default the longest measured length on the slider (128 if none),
    so that opening the explorer measures nothing new.
    """
    config = model.config
    if max_length is None:
        max_length = preset(model.device).kv_explorer_max_length
    max_length = min(max_length, config.max_position)
    if initial_length is None:
        initial_length = _opening_length(measured, step, max_length, fallback=128)
    times = StepTimes(model, prompt_len, repeats, measured)
    allocated = dict(allocated)         # length -> bytes a StaticKVCache of that length allocates

    controls = {
        "length": widgets.IntSlider(value=min(initial_length, max_length), min=step, max=max_length,
                                    step=step, description="sequence length", continuous_update=False,
                                    style={"description_width": "initial"}),
        "use_cache": widgets.ToggleButtons(options=[("KV cache on", True), ("KV cache off", False)],
                                           value=True, description="cache"),
    }

    def render(values: dict):
        length, use_cache = values["length"], values["use_cache"]
        seconds = times.get(length, use_cache)
        if length not in allocated:
            allocated[length] = StaticKVCache(config, 1, length, device=model.device, dtype=model.dtype).nbytes
        label = f"{length} tokens, cache {'on' if use_cache else 'off'}: {1e3 * seconds:.1f} ms"
        timing = per_token_time_figure(times.rows(), highlight={"sequence_length": length,
                                                               "seconds": seconds, "label": label})
        longest = max([max_length, *allocated])                         # the notebook's allocations reach further
        curve = list(range(step, longest + 1, step))
        memory = cache_memory_figure(config, curve, sorted(allocated.items()), dtype=model.dtype,
                                     highlight_length=length)
        if not use_cache:
            memory.update_layout(title="KV cache memory (cache off: nothing is kept, everything is recomputed)")
        return [timing, memory]

    return Explorer(controls, render, title="KV cache: time per token and memory",
                    use_widget=use_widget)
