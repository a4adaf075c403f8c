"""Notebook 02's explorer: batch size and prompt-length spread, live.

Introduced in notebook 02 (batching).

It opens with the notebook's own batch sweep (spread 0: every prompt equally long).
Releasing the batch slider (or the spread slider) generates a few tokens for a
batch of that many prompts, whose lengths differ by that much, and redraws two
figures: throughput and per-token latency against batch size (one line per
spread, with ideal linear scaling dashed), and the padded batch itself with
its padding waste. Every measurement is kept, so a setting already seen shows
at once.
"""

from __future__ import annotations

import ipywidgets as widgets

from ..lab.batching_timing import measure_batch
from ..lab.batching import batch_sizes, prompts_of_lengths, spread_lengths
from ..engine.padding import padding_waste
from ..weights.chat import chat_prompt
from ..plots.batching import padding_figure, scaling_figure
from ..lab.workloads import BATCHING_SOURCE_TEXT, preset
from .base import Explorer

SPREADS = (0.0, 0.25, 0.5, 0.75, 1.0)


def spread_label(spread: float) -> str:
    """The group name of one prompt-length spread in the figures, e.g. 'spread 0.50'.
    Notebook 02 (batching)."""
    return f"spread {spread:.2f}"


class BatchPoints:
    """Measured batches keyed by (batch, spread); measures on a miss. Notebook 02 (batching)."""

    def __init__(self, model, source_ids: list[int], longest: int, new_tokens: int, measured=()):
        self.model, self.source_ids = model, source_ids
        self.longest, self.new_tokens = longest, new_tokens
        self.rows: dict[tuple[int, float], dict] = {
            (r["batch"], r["spread"]): {**r, "group": spread_label(r["spread"])} for r in measured}

    def lengths(self, batch: int, spread: float) -> list[int]:
        return spread_lengths(batch, self.longest, spread)

    def get(self, batch: int, spread: float) -> dict:
        key = (batch, spread)
        if key not in self.rows:
            prompts = prompts_of_lengths(self.source_ids, self.lengths(batch, spread))
            row = measure_batch(self.model, prompts, self.new_tokens, repeats=1, warmup=0)
            self.rows[key] = {**row, "spread": spread, "group": spread_label(spread)}
        return self.rows[key]

    def all(self) -> list[dict]:
        return sorted(self.rows.values(), key=lambda r: (r["spread"], r["batch"]))


def batching_explorer(model, tokenizer, batches=None, spreads=SPREADS, longest: int = 48,
                      new_tokens: int = 8, measured=(), use_widget: bool | None = None) -> Explorer:
    """Controls: batch size and prompt-length spread; figures: throughput and latency against
    batch size, and the padded batch with its waste.

    Introduced in notebook 02 (batching).
    model, tokenizer: labsupport's model and its tokenizer (prompts are cut from a
    fixed text, `workloads.BATCHING_SOURCE_TEXT`). batches: slider positions (default
    `batching.batch_sizes`, up to the device's ``batching_explorer_max_batch``, `workloads.PRESETS`:
    32 on a CPU). spreads: 0 = every prompt `longest` tokens; 1 = lengths from `longest`
    down to 1. new_tokens: tokens generated per row at each measurement (few, so
    that a CPU answers in seconds). measured: rows already measured (dicts from
    `measure_batch` with a "spread" key), shown at once.
    """
    largest = preset(model.device).batching_explorer_max_batch
    batches = list(batches or [b for b in batch_sizes(model.device) if largest is None or b <= largest])
    spreads = list(spreads)
    source = tokenizer.encode(chat_prompt(tokenizer, BATCHING_SOURCE_TEXT * 4), add_special_tokens=False)
    points = BatchPoints(model, source, longest, new_tokens, measured)

    controls = {
        "batch": widgets.SelectionSlider(options=batches, value=batches[0], description="batch size",
                                         continuous_update=False, style={"description_width": "initial"}),
        "spread": widgets.SelectionSlider(options=spreads, value=spreads[0],
                                          description="prompt-length spread", continuous_update=False,
                                          style={"description_width": "initial"}),
    }

    def render(values: dict):
        current = points.get(values["batch"], values["spread"])
        lengths = points.lengths(values["batch"], values["spread"])
        picture = padding_figure([lengths], titles=(
            f"batch {values['batch']}, {current['tokens_per_s']:.0f} tokens/s, "
            f"{current['ms_per_token']:.0f} ms/token", ""))
        picture.update_layout(title=f"the padded batch: {padding_waste(lengths):.0%} of its prompt slots are padding")
        return [scaling_figure(points.all(), highlight=current, axis_batches=batches), picture]

    return Explorer(controls, render, use_widget=use_widget,
                    title=f"Batch size and prompt-length spread ({new_tokens} new tokens per row, "
                          f"prompts up to {longest} tokens)")
