"""The serving engine: requests in, tokens out, one step at a time.

Introduced in notebook 06 (continuous batching).

An engine step reads like the pseudocode of every continuous-batching server::

    plan = scheduler.schedule(now)         # who leaves, who joins, who is preempted
    for seq in plan.prefill:               # newcomers: their prompt through the model
        emit(seq, sample(runner.prefill(seq)))
    logits = runner.decode(plan.decode)    # everyone else: one token each, in one batch
    for seq, row in zip(plan.decode, logits):
        emit(seq, sample(row))             # a sequence that ends frees its blocks

`Engine.run(requests)` feeds requests in as they arrive and steps until all are
done; its `ServingResult` holds every sequence and a log of every step, from
which `metrics.py` computes throughput, latency percentiles and slot use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import LabError
from ..inputs import whole_number
from ..hardware import synchronize
from .block_manager import BlockManager, blocks_needed
from .model_runner import ModelRunner
from .paged_cache import PagedKVCache
from .request import Request, ServedSequence, next_token
from .scheduler import Scheduler


@dataclass
class StepRecord:
    """What one engine step did, for the timeline and the utilization plot.
    Notebook 06 (continuous batching)."""

    start: float
    end: float
    prefills: int
    decode_rows: int
    padding_rows: int
    preempted: int
    blocks_used: int


@dataclass
class ServingResult:
    """Everything a run produced. `sequences` are in order of arrival. Notebook 06 (continuous batching)."""

    sequences: list[ServedSequence]
    steps: list[StepRecord]
    rejected: dict = field(default_factory=dict)     # request id -> the reason, one sentence
    policy: str = ""
    max_slots: int = 0
    peak_blocks: int = 0
    block_bytes: int = 0
    block_size: int = 1

    def tokens(self) -> dict:
        """Request id -> generated tokens."""
        return {seq.id: list(seq.output) for seq in self.sequences}

    def metrics(self) -> dict:
        from .metrics import summarize
        return summarize(self)


class Engine:
    """A model, a paged cache, a block manager and a scheduler, stepped together.

    max_slots: the most sequences decoded together (the batch size).
    cache_tokens: positions the paged cache holds over all sequences (default: one
        full-context request per slot, capped at 1,024 positions each);
        the pool has ceil(cache_tokens / block_size) blocks.
    policy: "continuous" or "static" (see scheduler.py).

    Notebook 06 (continuous batching).
    """

    def __init__(self, model, max_slots: int = 8, policy: str = "continuous",
                 block_size: int = 16, cache_tokens: int | None = None):
        max_slots = whole_number(max_slots, "max_slots (the server's batch slots)")
        block_size = whole_number(block_size, "block_size (positions per cache block)")
        if cache_tokens is None:
            cache_tokens = max_slots * min(model.config.max_position, 1024)
        cache_tokens = whole_number(cache_tokens, "cache_tokens (positions the paged cache holds)")
        num_blocks = blocks_needed(cache_tokens, block_size)
        self.model = model
        self.blocks = BlockManager(num_blocks, block_size)
        self.cache = PagedKVCache(model.config, num_blocks, block_size, model.device, model.dtype)
        self.scheduler = Scheduler(policy, max_slots, self.blocks)
        self.runner = ModelRunner(model, self.cache, self.blocks.table)
        self.sequences: list[ServedSequence] = []
        self.steps: list[StepRecord] = []
        self.clock = _RunClock("wall")

    @property
    def capacity(self) -> int:
        """Positions the whole cache holds: a request longer than this can never run."""
        return self.blocks.num_blocks * self.blocks.block_size

    def add_request(self, request: Request, now: float = 0.0) -> ServedSequence:
        """Queue a request; a request that can never fit is refused here, in one sentence,
        and nothing else changes."""
        context = self.model.config.max_position
        name = request.request_id if request.request_id is not None else len(self.sequences)
        if request.max_length > context:
            raise LabError(
                f"Request {name!r} needs {request.max_length} positions (prompt {len(request.prompt)} "
                f"+ max_new_tokens {request.max_new_tokens}) but the model's context holds {context}; "
                "shorten the prompt or ask for fewer tokens.")
        if request.max_length > self.capacity:
            raise LabError(
                f"Request {name!r} needs {request.max_length} positions but the whole paged cache "
                f"holds {self.capacity}; give the engine a larger cache_tokens or shorten the request.")
        vocab = self.model.config.vocab_size
        if max(request.prompt) >= vocab or min(request.prompt) < 0:
            raise LabError(f"Request {name!r} has token ids outside the vocabulary [0, {vocab}).")
        seq = ServedSequence(request, len(self.sequences), self.model.device)
        self.sequences.append(seq)
        self.scheduler.add(seq)
        return seq

    def step(self) -> list[tuple[ServedSequence, int]]:
        """Run one scheduled step; returns the (sequence, token) pairs it produced."""
        start = self.clock()
        plan = self.scheduler.schedule(start)
        events: list[tuple[ServedSequence, int]] = []
        for seq in plan.prefill:
            logits = self.runner.prefill(seq)
            events.append((seq, next_token(logits, seq)))
        if plan.decode:
            logits = self.runner.decode(plan.decode, plan.padding_rows)       # (B, vocab)
            greedy = logits.argmax(dim=-1).tolist()                            # one sync for all rows
            for row, seq in enumerate(plan.decode):
                token = greedy[row] if seq.request.sampling.greedy else next_token(logits[row], seq)
                events.append((seq, token))
        synchronize(self.model.device)
        self.clock.tick()
        now = self.clock()
        for seq, token in events:
            if seq.append(token, now):
                self.scheduler.finish(seq, now)
        self.steps.append(StepRecord(start, now, len(plan.prefill), len(plan.decode), plan.padding_rows,
                                     len(plan.preempted), self.blocks.num_used))
        return events

    def run(self, requests: Iterable[Request], clock: str = "wall",
            progress: Callable[[int, int], None] | None = None) -> ServingResult:
        """Serve `requests` as they arrive, until every one has finished.

        clock="wall": seconds of real time, except that while the server is idle the
            clock jumps to the next arrival instead of sleeping;
        clock="steps": every step lasts one time unit (arrivals are then in steps), so a
            run is reproducible exactly; handy for exercises and tests.
        Requests that can never fit are refused (see `add_request`) and listed in
        `ServingResult.rejected`; the others are served as if they were not there.
        """
        pending = list(requests)
        wrong = next((r for r in pending if not isinstance(r, Request)), None)
        if wrong is not None:
            raise LabError(f"The engine serves Request objects, got a {type(wrong).__name__}; "
                           f"wrap each prompt as Request(prompt=ids, max_new_tokens=...).")
        pending.sort(key=lambda r: r.arrival)
        if not pending:
            raise LabError("The request list is empty; give the engine at least one Request.")
        if clock not in ("wall", "steps"):
            raise LabError(f"clock must be 'wall' or 'steps', got {clock!r}.")
        self.clock = _RunClock(clock)
        rejected, total, done = {}, len(pending), 0
        while pending or self.scheduler.has_work:
            now = self.clock()
            while pending and pending[0].arrival <= now:
                request = pending.pop(0)
                try:
                    self.add_request(request, now)
                except LabError as error:
                    name = request.request_id if request.request_id is not None else f"#{total - len(pending) - 1}"
                    rejected[name] = str(error)
            if not self.scheduler.has_work:
                if pending:
                    self.clock.skip_to(pending[0].arrival)     # idle: jump to the next arrival
                continue
            self.step()
            if progress is not None:
                finished = sum(s.is_finished for s in self.sequences) + len(rejected)
                if finished != done:
                    done = finished
                    progress(done, total)
        return ServingResult(list(self.sequences), list(self.steps), rejected,
                             self.scheduler.policy, self.scheduler.max_slots,
                             self.blocks.peak_used, self.cache.bytes_per_block,
                             self.blocks.block_size)


class _RunClock:
    """Seconds since the run started (or steps taken), with idle gaps skipped."""

    def __init__(self, kind: str):
        self.kind, self.offset, self.t0, self.ticks = kind, 0.0, time.perf_counter(), 0

    def __call__(self) -> float:
        if self.kind == "steps":
            return self.ticks + self.offset
        return time.perf_counter() - self.t0 + self.offset

    def tick(self) -> None:
        """A step has ended (the "steps" clock counts them)."""
        self.ticks += 1

    def skip_to(self, t: float) -> None:
        self.offset += max(0.0, t - self())
