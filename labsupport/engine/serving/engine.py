"""The serving engine: requests in, tokens out, one step at a time.

Introduced in notebook 06 (continuous batching).

An engine step reads like the pseudocode of every continuous-batching server::

    plan = scheduler.schedule(now)         # who leaves, who joins, who is preempted,
                                           # how many prompt tokens each computes
    if no token budget:                    # newcomers: their whole prompt, alone
        for seq in plan.prefill:
            tokens += sample(runner.forward([seq], [its whole prompt]))
        rows = plan.decode                 # everyone else: one token each, one batch
    else:                                  # chunked prefill: decodes and prompt chunks
        rows = plan.decode + plan.prefill  #   together, in ONE forward pass
    logits = runner.forward(rows, chunks)  # pure: computes, writes keys/values, moves no counter
    for seq, row in zip(rows, logits):
        if seq's prompt is done:           # a chunk that ends mid-prompt samples nothing
            tokens += sample(row)
    scheduler.postprocess(plan, tokens)    # every counter after the step, in one place: cached
                                           # positions, shareable blocks, tokens, who finished

With prefix caching, admission points a newcomer's block table at the cached blocks
of its longest cached full-block prefix (those tokens are not computed), and every
full prompt block a step completes is named in the cache for later requests.

`Engine.run(requests)` feeds requests in as they arrive and steps until all are
done; its `ServingResult` holds every sequence and a log of every step of that run
alone (each run starts from an empty cache: a reused engine gives what a new one gives),
from which `lab/serving_metrics.py` computes throughput, latency percentiles and slot use.

A server (`labsupport.serve`, notebook 09) drives the same engine without `run`: it calls
`add_request` as requests come in, `step` while there is work, and `abort` when a client
goes away; made with `record=False`, the engine then keeps no log, so that its memory
stays bounded however long it serves. One request's error (its sampling, its `on_token`
callback) ends that request alone: it is aborted and listed in `failures` as
(request id, one sentence) for the server to tell its client, and the others carry on
(notebook 09: no request stops the engine). A forward pass that raises (a kernel's error,
memory run out) ends the requests in that pass the same way, and keeps none of their blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ...errors import LabError
from ...inputs import whole_number
from ..hardware import synchronize
from .block_manager import BlockManager, blocks_needed, require_block_size
from .logprobs import record_logprobs
from .decode_graphs import EAGER, DecodeGraphs
from .model_runner import ModelRunner
from .paged_cache import PagedKVCache
from .request import Request, ServedSequence, next_token, require_request
from .scheduler import Scheduler, require_batch_limits


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
    prefill_tokens: int = 0        # prompt tokens computed this step (a recomputed preempted
                                   # sequence's output tokens count too)
    prefill_chunks: int = 0        # prompt chunks in this step
    cached_tokens: int = 0         # prompt tokens taken from the prefix cache at admissions


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
    token_budget: int | None = None
    prefix_caching: bool = False
    decode_path: str = "eager"     # or decode_graphs.GRAPHED: every decode step replayed a CUDA graph
    decode_note: str | None = None           # why not, when a GPU engine decodes eagerly

    def tokens(self) -> dict:
        """Request id -> generated tokens."""
        return {seq.id: list(seq.output) for seq in self.sequences}


class Engine:
    """A model, a paged cache, a block manager and a scheduler, stepped together.

    max_slots: the most sequences decoded together (the batch size).
    cache_tokens: positions the paged cache holds over all sequences (default: one
        full-context request per slot, capped at 1,024 positions each);
        the pool has ceil(cache_tokens / block_size) blocks.
    policy: "continuous" or "static" (see scheduler.py).
    token_budget: None (each newcomer's prompt runs whole, alone, before the decode
        batch) or the tokens one step computes: decodes first, then prompt chunks
        (chunked prefill); at least max_slots.
    prefix_caching: share the cache blocks of prompts' common full-block prefixes.
    record: keep every sequence and step for `run`'s result (True); a long-lived server
        passes False: finished sequences are then forgotten and no step is logged.
    cuda_graphs: replay every decode step as a CUDA graph (decode_graphs.py; all captured
        here, `graphs.capture_seconds`); None: on a CUDA GPU, where an eager step times its
        kernel launches. `decode_path` and `decode_note` say what runs.

    Notebook 06 (continuous batching).
    """

    def __init__(self, model, max_slots: int = 8, policy: str = "continuous",
                 block_size: int = 16, cache_tokens: int | None = None,
                 token_budget: int | None = None, prefix_caching: bool = False, record: bool = True,
                 cuda_graphs: bool | None = None):
        max_slots, token_budget = require_batch_limits(max_slots, token_budget)
        block_size = require_block_size(block_size)
        if cache_tokens is None:
            cache_tokens = max_slots * min(model.config.max_position, 1024)
        cache_tokens = whole_number(cache_tokens, "cache_tokens (positions the paged cache holds)")
        if cuda_graphs is None:
            cuda_graphs = model.device.type == "cuda"
        for flag, name in ((prefix_caching, "prefix_caching"), (record, "record"), (cuda_graphs, "cuda_graphs")):
            if not isinstance(flag, bool):
                raise LabError(f"{name} must be True or False, got {flag!r}.")
        if cuda_graphs and model.device.type != "cuda":
            raise LabError(f"CUDA graphs replay GPU work, and this model is on {model.device.type}; "
                           f"pass cuda_graphs=False or None, or move the model to a CUDA GPU.")
        self.model, self.policy, self.max_slots = model, policy, max_slots
        self.token_budget, self.prefix_caching, self.record = token_budget, prefix_caching, record
        self.num_blocks, self.block_size = blocks_needed(cache_tokens, block_size), block_size
        self.cache = PagedKVCache(model.config, self.num_blocks, block_size, model.device, model.dtype)
        self.graphs = DecodeGraphs(ModelRunner(model, self.cache, None), max_slots) if cuda_graphs else None
        self._start_afresh("wall")

    @property
    def decode_path(self) -> str:
        """`decode_graphs.GRAPHED` when every decode step replays a CUDA graph, else "eager"
        (`decode_note` says why on a GPU). Notebook 06 (continuous batching)."""
        return EAGER if self.graphs is None else self.graphs.path

    @property
    def decode_note(self) -> str | None:
        """Why a GPU engine decodes eagerly (a graph that could not be captured), or None."""
        return None if self.graphs is None else self.graphs.note

    def _start_afresh(self, clock: str) -> None:
        """Empty bookkeeping over the same cache memory: a new block manager (no block held or
        cached), scheduler and runner, no sequence, no step, the clock at 0."""
        self.blocks = BlockManager(self.num_blocks, self.block_size, self.prefix_caching, self.model.device)
        self.scheduler = Scheduler(self.policy, self.max_slots, self.blocks, self.token_budget)
        self.runner = ModelRunner(self.model, self.cache, self.blocks)
        self.runner.graphs = self.graphs
        self.sequences: list[ServedSequence] = []       # this run's, in order of arrival (record=True)
        self.steps: list[StepRecord] = []               # this run's (record=True)
        self.live: dict = {}                            # request id -> sequence, until it finishes
        self.prefix_hit_tokens = 0                      # prompt positions found in the prefix cache, in all
        self.arrivals = 0                               # sequences added so far: the next one's index
        self.failures: list[tuple[object, str]] = []    # (request id, one sentence): ended by an error
        self._failed: list[tuple[ServedSequence, BaseException]] = []   # this step's, aborted at its end
        self.clock = _RunClock(clock)

    @property
    def capacity(self) -> int:
        """Positions the whole cache holds: a request longer than this can never run."""
        return self.blocks.num_blocks * self.blocks.block_size

    @property
    def has_work(self) -> bool:
        """Whether a sequence is waiting or running: `step` has something to do."""
        return self.scheduler.has_work

    def require_servable(self, request: Request) -> None:
        """One sentence (a LabError) if `request` can never run on this engine: longer than
        the model's context or the whole cache, or token ids outside the vocabulary. It reads
        only the engine's fixed sizes, so a server may ask from any thread."""
        require_request(request)
        context = self.model.config.max_position
        name = request.request_id if request.request_id is not None else self.arrivals
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

    def add_request(self, request: Request, now: float = 0.0) -> ServedSequence:
        """Queue a request; a request that can never fit (`require_servable`) or whose id is
        already in use in this run (or, without a record, by a live request) is refused here,
        in one sentence, and nothing else changes."""
        self.require_servable(request)
        seq = ServedSequence(request, self.arrivals, self.model.device)
        taken = seq.id in self.live or (self.record and any(s.id == seq.id for s in self.sequences))
        if taken:
            raise LabError(f"Request id {seq.id!r} is already in use on this engine; give every request "
                           "its own request_id (results are keyed by it).")
        self.arrivals += 1
        if self.record:
            self.sequences.append(seq)
        self.live[seq.id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id) -> bool:
        """Stop serving a request (its client went away, or a stop string matched): it leaves
        the queue or the batch now and its blocks are free for the next step. Returns False
        when no live request has this id (it had finished already)."""
        seq = self.live.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq, self.clock())
        return True

    def step(self) -> list[tuple[ServedSequence, int]]:
        """Run one scheduled step; returns the (sequence, token) pairs it produced."""
        start = self.clock()
        plan = self.scheduler.schedule(start)
        self.prefix_hit_tokens += plan.cached_tokens
        chunked = plan.prompt_chunks
        events: list[tuple[ServedSequence, int]] = []
        if self.token_budget is None:
            for seq, n in chunked:                                     # each newcomer alone
                events += self._forward_and_sample([seq], [n])
            rows, chunks = plan.decode, [1] * len(plan.decode)
        else:                                                          # decodes + chunks, one pass
            rows = plan.decode + [seq for seq, _ in chunked]
            chunks = [1] * len(plan.decode) + [n for _, n in chunked]
        if rows:
            events += self._forward_and_sample(rows, chunks, plan.padding_rows)
        elif not chunked and not self.scheduler.running:
            # nothing computed and nothing in flight: the next step would be the same, forever
            raise LabError(f"The scheduling policy {self.scheduler.policy!r} admitted none of the "
                           f"{len(self.scheduler.waiting)} waiting request(s) into an idle server; a policy "
                           "must admit a request when nothing runs (see Policy.decide).")
        synchronize(self.model.device)
        prompts_done = sum(seq.num_cached + n == len(seq.tokens) for seq, n in chunked)
        self.clock.tick()
        now = self.clock()
        if self._failed:                                               # a failed pass: nothing of it is kept
            _drop_rows(plan, {id(seq) for seq, _ in self._failed})
        finished, failed = self.scheduler.postprocess(plan, events, now)
        for seq in finished:
            self.live.pop(seq.id, None)
        self._failed += failed
        if self._failed:
            failed_ids = {id(seq) for seq, _ in self._failed}
            events = [(seq, token) for seq, token in events if id(seq) not in failed_ids]
            self._end_failed()
        if self.record:
            self.steps.append(StepRecord(
                start, now, prompts_done, len(plan.decode),
                plan.padding_rows, len(plan.preempted), self.blocks.num_used,
                prefill_tokens=sum(n for _, n in chunked), prefill_chunks=len(chunked),
                cached_tokens=plan.cached_tokens))
        return events

    def _forward_and_sample(self, seqs: list[ServedSequence], chunks: list[int],
                            padding_rows: int = 0) -> list[tuple[ServedSequence, int]]:
        """One forward pass and its tokens. A pass that raises (a kernel's error, memory run out)
        fails every request in it, each alone with a sentence in `failures`; the engine serves on.
        Notebook 09 (serving over HTTP): no forward pass stops the server."""
        try:
            logits = self.runner.forward(seqs, chunks, padding_rows)
        except Exception as error:                      # noqa: BLE001 - this pass's requests alone fail
            self._failed += [(seq, error) for seq in seqs]
            return []
        return self._sample(seqs, chunks, logits)

    def _sample(self, seqs: list[ServedSequence], chunks: list[int], logits) -> list[tuple[ServedSequence, int]]:
        """The next token of every sequence whose tokens are all computed once its chunk is (a
        chunk that ends part-way through a prompt gives none). logits: (len(seqs), vocab)."""
        greedy = logits.argmax(dim=-1).tolist()                        # one sync for all rows
        events, rows = [], []
        for row, (seq, n) in enumerate(zip(seqs, chunks)):
            if seq.num_cached + n != len(seq.tokens):
                continue
            try:
                events.append((seq, greedy[row] if seq.request.sampling.greedy else next_token(logits[row], seq)))
                rows.append(row)
            except Exception as error:                  # noqa: BLE001 - that request alone fails
                self._failed.append((seq, error))
        try:                                            # the model's own, for the requests that ask
            record_logprobs(logits, rows, events)
        except Exception as error:                      # noqa: BLE001 - those requests alone fail
            self._failed += [(seq, error) for seq, _ in events if seq.request.logprobs is not None]
        return events

    def _end_failed(self) -> None:
        """Abort every request whose own processing raised in this step and list it in
        `failures` with one sentence; the other requests are untouched. Notebook 09."""
        for seq, error in self._failed:
            self.abort(seq.id)
            reason = " ".join(str(error).split()).rstrip(".") or "no message"
            self.failures.append((seq.id, f"Request {seq.id!r} failed while being served "
                                          f"({type(error).__name__}: {reason})."))
        self._failed.clear()

    def run(self, requests: Iterable[Request], clock: str = "wall",
            progress: Callable[[int, int], None] | None = None) -> ServingResult:
        """Serve `requests` as they arrive, until every one has finished.

        clock="wall": seconds of real time, except that while the server is idle the
            clock jumps to the next arrival instead of sleeping;
        clock="steps": every step lasts one time unit (arrivals are then in steps), so a
            run is reproducible exactly; handy for exercises and tests.
        Requests that can never fit are refused (see `add_request`) and listed in
        `ServingResult.rejected`; the others are served as if they were not there.
        Each run starts afresh (an empty cache, the clock at 0): its result holds that run alone.
        """
        pending = list(requests)
        for request in pending:
            require_request(request)
        pending.sort(key=lambda r: r.arrival)
        if not pending:
            raise LabError("The request list is empty; give the engine at least one Request.")
        if clock not in ("wall", "steps"):
            raise LabError(f"clock must be 'wall' or 'steps', got {clock!r}.")
        ids = [r.request_id for r in pending if r.request_id is not None]
        twice = next((i for i in ids if ids.count(i) > 1), None)
        if twice is not None:
            raise LabError(f"Request id {twice!r} appears more than once in the request list; give every "
                           "request its own request_id (results are keyed by it).")
        if not self.record:
            raise LabError("This engine was made with record=False (a server's) and keeps no log for "
                           "run(); make one with record=True to run a workload.")
        if self.has_work:
            raise LabError(f"This engine is still serving {len(self.live)} request(s) added with "
                           "add_request; step() until they finish, or abort() them, before run().")
        self._start_afresh(clock)
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
            if self.failures:
                raise LabError(self.failures[0][1])
            if progress is not None:
                finished = sum(s.is_finished for s in self.sequences) + len(rejected)
                if finished != done:
                    done = finished
                    progress(done, total)
        return ServingResult(list(self.sequences), list(self.steps), rejected,
                             self.scheduler.policy, self.scheduler.max_slots,
                             self.blocks.peak_used, self.cache.bytes_per_block,
                             self.blocks.block_size, self.token_budget, self.prefix_caching,
                             self.decode_path, self.decode_note)


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


def _drop_rows(plan, failed: set[int]) -> None:
    """Take the sequences whose pass failed out of the step's plan, so that its bookkeeping keeps
    nothing of them (no position counted as computed, no block offered to the prefix cache: the
    pass may have left those blocks half-written). Notebook 09 (serving over HTTP)."""
    plan.decode = [seq for seq in plan.decode if id(seq) not in failed]
    kept = [(seq, n) for seq, n in zip(plan.prefill, plan.chunks) if id(seq) not in failed]
    plan.prefill, plan.chunks = [seq for seq, _ in kept], [n for _, n in kept]
