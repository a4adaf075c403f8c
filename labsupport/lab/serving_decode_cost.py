"""Where a paged decode step spends its time: block tables, the gather, the rest.

Introduced in notebook 06 (continuous batching).

Every decode step of the engine does two things a contiguous cache does not:

* it builds the block tables of the batch (`ModelRunner.tables`): picked from the block
  manager's tensor with one index; the first engine rebuilt them from Python lists
  every step (`list_tables`, timed here too, for comparison);
* in every layer it gathers each row's whole context out of the pool
  (`PagedView.gather`), a copy of every key and value the step attends to, whole
  blocks at a time (one index per block; timed against one index per position,
  `gather_by_slots`, the way the first engine gathered).

`decode_step_costs` serves a batch of sequences of one context length, then times decode
steps of the layers' Python code (the fused kernels off, so that each gather is an operation
of its own) three ways: with every table build and gather timed (the shares), plain, and with
attention over the pool in place (`attention="pool"`: no gather, a bigger masked attention).
A fourth way is the step as the engine runs it on a CPU: each layer one C++ call that reads each
row's keys through its block table inside the attention, with no copy (`fused.decode_block`, as
PagedAttention does on a GPU). It returns a flat dict for the notebook, with the raw `Timing`s
for `busy.busy_reason`.
"""

from __future__ import annotations

import time

import torch

from ..engine.hardware import synchronize
from ..engine.models import fused
from ..inputs import whole_number
from .measure import Timing
from ..engine.serving.block_manager import BlockManager, blocks_needed
from ..engine.serving.model_runner import ModelRunner
from ..engine.serving.paged_cache import PagedKVCache, PagedView
from ..engine.serving.request import Request, ServedSequence


class IntervalClock:
    """The total seconds of many short intervals inside one step, without stalling the device
    between them: on a GPU each interval is a pair of CUDA events recorded on the stream (read
    once, after the step: `total`); on a CPU the host clock. Synchronizing around every layer's
    gather instead would time a different, slower step. Notebook 06 (continuous batching)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Forget every interval: the next step starts from zero."""
        self.events: list = []
        self.host_seconds = 0.0

    def measure(self, fn):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self.events.append((start, end))
            return out
        start = time.perf_counter()
        out = fn()
        self.host_seconds += time.perf_counter() - start
        return out

    def total(self) -> float:
        if not self.events:
            return self.host_seconds
        synchronize(self.device)
        return sum(start.elapsed_time(end) for start, end in self.events) / 1e3


def _timed_runner(model, pool, blocks, tables_clock: IntervalClock, gathers_clock: IntervalClock) -> ModelRunner:
    """A `ModelRunner` that times each block-table build on `tables_clock`, reading the pool
    through a `PagedView` that times each gather on `gathers_clock`: both chosen at construction."""

    class TimedView(PagedView):
        def gather(self, layer):
            return gathers_clock.measure(lambda: PagedView.gather(self, layer))

    class TimedRunner(ModelRunner):
        def tables(self, seqs, padding_rows=0, width=1):
            return tables_clock.measure(lambda: ModelRunner.tables(self, seqs, padding_rows, width))

    return TimedRunner(model, pool, blocks, reader=TimedView)


def decode_step_costs(model, batch_size: int = 8, context: int = 128, block_size: int = 16,
                      steps: int = 5, warmup: int = 1, seed: int = 0) -> dict:
    """Time paged decode steps of `batch_size` sequences holding about `context` positions.

    Returns seconds per step (medians), of the layers' Python code: "step_s" (gathering),
    "pool_step_s" (attention over the pool instead), "timed_step_s" (with every table
    build and gather timed) split into "table_build_s", "gather_s" and "rest_s", their
    shares of the timed step, "table_build_lists_s" (the tables rebuilt from lists
    instead), "gather_by_slots_s" (every layer's gather with one index per position instead of
    per block); "paged_kernel_step_s", the step as the engine runs it (on a CPU with the fused
    kernels, one call per layer reading the pool in place; elsewhere the same as "step_s"); and
    "timings": {name: Timing} for `busy.busy_reason`.
    Introduced in notebook 06 (continuous batching).
    """
    batch_size = whole_number(batch_size, "batch_size (sequences decoded together)")
    context = whole_number(context, "context (positions each sequence holds)",
                           maximum=model.config.max_position - steps - warmup - 1)
    steps, warmup = whole_number(steps, "steps (timed decode steps)"), whole_number(warmup, "warmup", minimum=0)
    positions = context + warmup + steps + 1
    blocks = BlockManager(batch_size * blocks_needed(positions, block_size), block_size, device=model.device)
    pool = PagedKVCache(model.config, blocks.num_blocks, block_size, model.device, model.dtype)
    tables_clock, gathers_clock = IntervalClock(model.device), IntervalClock(model.device)   # reset every step
    runner = _timed_runner(model, pool, blocks, tables_clock, gathers_clock)
    plain = {"step": ModelRunner(model, pool, blocks),                      # as the engine runs it
             "pool_step": ModelRunner(model, pool, blocks, attention="pool")}
    generator = torch.Generator().manual_seed(seed)
    seqs = [ServedSequence(Request(torch.randint(0, model.config.vocab_size, (context,), generator=generator)
                                   .tolist(), max_new_tokens=positions), i, model.device)
            for i in range(batch_size)]
    for grown in range(block_size, positions + block_size, block_size):   # grow in turns: tables interleave
        for seq in seqs:
            blocks.grow(seq.index, min(grown, positions))
    for seq in seqs:
        logits = runner.prefill(seq)                         # the runner moves no counter: this loop is
        seq.num_cached = len(seq.tokens)                     # its own scheduler
        seq.output.append(int(logits.argmax()))
    samples = {name: [] for name in ("step", "pool_step", "timed_step", "table_build", "gather",
                                     "table_build_lists", "gather_by_slots", "paged_kernel_step")}
    for step in range(warmup + steps):
        record = {"table_build_lists": _seconds(lambda: list_tables(
            [blocks.table(s.index) for s in seqs], pool.scratch_block, 1, model.device), model.device),
            "gather_by_slots": _seconds(lambda: gather_by_slots(
                pool, blocks.table_rows([s.index for s in seqs]), seqs[0].num_cached + 1), model.device)}
        tables_clock.reset(), gathers_clock.reset()
        with fused.switched(False):                          # the Python layers: each gather its own copy
            record["timed_step"] = _seconds(lambda: runner.decode(seqs), model.device)
            record["table_build"], record["gather"] = tables_clock.total(), gathers_clock.total()
            for name, other in plain.items():                # the same step again: the same position
                record[name] = _seconds(lambda: other.decode(seqs), model.device)
        record["paged_kernel_step"] = _seconds(lambda: plain["step"].decode(seqs), model.device)
        for seq in seqs:
            seq.num_cached += 1
            seq.output.append(seq.output[-1])               # any token: the cost does not depend on it
        if step >= warmup:
            for name, seconds in record.items():
                samples[name].append(seconds)
    timings = {name: Timing(values) for name, values in samples.items()}
    timed = timings["timed_step"].median
    table, gather = timings["table_build"].median, timings["gather"].median
    return {
        "batch_size": batch_size, "context": context, "block_size": block_size, "device": str(model.device),
        "step_s": timings["step"].median, "pool_step_s": timings["pool_step"].median,
        "timed_step_s": timed, "table_build_s": table, "gather_s": gather,
        "rest_s": max(0.0, timed - table - gather),
        "table_build_share": table / timed, "gather_share": gather / timed,
        "rest_share": max(0.0, timed - table - gather) / timed,
        "table_build_lists_s": timings["table_build_lists"].median,
        "gather_by_slots_s": timings["gather_by_slots"].median,
        "paged_kernel_step_s": timings["paged_kernel_step"].median,
        "timings": timings,
    }


def gather_by_slots(pool: PagedKVCache, tables: torch.Tensor, context: int) -> list:
    """Every layer's keys and values of `context` positions per row, read one pool slot per
    position (B, S, kv_heads, D): the gather of the first engine. Notebook 06 (continuous batching)."""
    positions = torch.arange(context, device=tables.device).expand(len(tables), context)
    slots = pool.slots(tables, positions)                                        # (B, S)
    return [(pool.keys[layer][slots], pool.values[layer][slots]) for layer in range(len(pool.keys))]


def _seconds(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def list_tables(tables: list[list[int]], scratch_block: int, width: int, device) -> torch.Tensor:
    """Block tables rebuilt from Python lists: (B, max(width, longest)), padded with the scratch
    block (the first engine's slow path: one new tensor every step). Notebook 06 (continuous batching)."""
    width = max(width, max(len(t) for t in tables))
    padded = [t + [scratch_block] * (width - len(t)) for t in tables]
    return torch.tensor(padded, dtype=torch.long, device=device)
