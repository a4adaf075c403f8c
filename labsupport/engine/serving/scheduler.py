"""Who runs in the next step: static against continuous batching.

Introduced in notebook 06 (continuous batching).

Both policies (objects: `StaticBatching`, `ContinuousBatching`, or their names)
share one interface (`schedule`, `finish`) and two limits: at most
`max_slots` sequences in a batch, and no more cache blocks than the block manager
has. They differ only in when a waiting sequence may join:

* static: a batch is admitted together, when the previous batch has ended, and
  runs until its longest member ends. Members that finish early keep their slot
  and are still computed as padding rows, as in a padded `generate()` batch
  (notebook 02): the restaurant that seats new parties only when every table is free.
* continuous: between any two steps, finished sequences leave and waiting ones
  take their slots (Yu et al., Orca, 2022): tables are re-seated as soon as they clear.

When a running sequence needs a new block and none is free, the most recently
admitted sequence is preempted: its blocks are released and it goes back to the
front of the queue, keeping its tokens (see request.py).

With a token budget (`token_budget`, the Sarathi / vLLM chunked-prefill policy) a
step is planned in tokens: every decoding sequence costs one, and what is left goes
to prompt chunks, first to sequences still part-way through their prompt, then to
newcomers, in arrival order (`budget_prefill_chunks`); a long prompt is split over
steps. Without one, each newcomer's whole prompt runs in the step it is admitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ...errors import LabError
from ...inputs import whole_number
from .block_manager import BlockManager
from .request import ServedSequence, Status


def budget_prefill_chunks(token_budget: int, num_decodes: int, remaining: list[int]) -> list[int]:
    """How many prompt tokens each sequence computes this step under a token budget: each of
    the `num_decodes` decoding sequences costs one token; the rest goes to the prompts in order
    (remaining[i]: prompt tokens sequence i still has to compute), greedily: the first gets
    min(remaining[0], left), then the next, ... (zeros once the budget is spent).
    Introduced in notebook 06 (continuous batching)."""
    left = token_budget - num_decodes
    if left < 0:
        raise LabError(f"{num_decodes} decoding sequences need {num_decodes} tokens but the budget is "
                       f"{token_budget}; give a token_budget of at least max_slots.")
    chunks = []
    for need in remaining:
        chunks.append(min(need, left))
        left -= chunks[-1]
    return chunks


class Policy:
    """A scheduling policy: the rules by which waiting sequences join the running batch.

    Introduced in notebook 06 (continuous batching). A policy is an object with four
    small decisions, so a new one (say, shortest-prompt-first) is one subclass; the
    `Scheduler` around it keeps the slot and block limits, admission order and
    preemption the same for every policy.
    """

    name = "policy"
    admits_whole_batch = False      # admit every sequence that fits, even beyond this step's token budget

    def may_admit(self, scheduler: "Scheduler") -> bool:
        """May waiting sequences be admitted in this step?"""
        raise NotImplementedError

    def admitted(self, scheduler: "Scheduler", seq: ServedSequence) -> None:
        """`seq` has just been admitted."""

    def padding_rows(self, scheduler: "Scheduler", decoding: list[ServedSequence]) -> int:
        """Rows computed as padding beside the decoding sequences."""
        return 0

    def left(self, scheduler: "Scheduler", seq: ServedSequence) -> None:
        """`seq` finished or was preempted; give back what the policy lets it give back."""

    def __str__(self) -> str:
        return self.name


class StaticBatching(Policy):
    """A batch is admitted together, when the previous batch has ended, and runs until its
    longest member ends; finished members keep their slot as padding rows.
    Notebook 06 (continuous batching)."""

    name = "static"
    admits_whole_batch = True

    def may_admit(self, scheduler):
        return not scheduler.batch

    def admitted(self, scheduler, seq):
        scheduler.batch.append(seq)

    def padding_rows(self, scheduler, decoding):
        return len(scheduler.batch) - len(decoding) if decoding else 0

    def left(self, scheduler, seq):
        if not scheduler.running:                               # the whole batch has ended
            scheduler.batch = []
            scheduler.free_slots = list(range(scheduler.max_slots - 1, -1, -1))


class ContinuousBatching(Policy):
    """Between any two steps, finished sequences leave and waiting ones take their slots.
    Notebook 06 (continuous batching)."""

    name = "continuous"

    def may_admit(self, scheduler):
        return True

    def left(self, scheduler, seq):
        scheduler.free_slots.append(seq.slot)


POLICIES = {"static": StaticBatching, "continuous": ContinuousBatching}


def as_policy(policy) -> Policy:
    """A `Policy` object, or one of the names "static" and "continuous".
    Notebook 06 (continuous batching)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]()
    raise LabError(f"Unknown scheduling policy {policy!r}; choose 'static' or 'continuous' "
                   f"(or pass a Policy object).")


@dataclass
class ScheduledStep:
    """The plan for one engine step. Notebook 06 (continuous batching)."""

    prefill: list[ServedSequence] = field(default_factory=list)    # a prompt chunk this step (admitted or part-way)
    chunks: list[int] = field(default_factory=list)                # tokens each of `prefill` computes
    decode: list[ServedSequence] = field(default_factory=list)     # advance one token each
    padding_rows: int = 0                                     # static: finished members still computed
    preempted: list[ServedSequence] = field(default_factory=list)
    cached_tokens: int = 0                                    # prompt positions found in the prefix cache


class Scheduler:
    """FCFS admission under slot and block limits, with one policy (`Policy`, or its name),
    and optionally a token budget per step (None: whole prompts). Notebook 06 (continuous batching)."""

    def __init__(self, policy, max_slots: int, blocks: BlockManager, token_budget: int | None = None):
        self.rules = as_policy(policy)
        self.policy = self.rules.name               # the name, as results and plots show it
        self.max_slots = whole_number(max_slots, "max_slots (the server's batch slots)")
        self.token_budget = token_budget
        self.blocks = blocks
        self.waiting: deque[ServedSequence] = deque()
        self.running: list[ServedSequence] = []          # in order of admission
        self.free_slots = list(range(self.max_slots - 1, -1, -1))
        self.batch: list[ServedSequence] = []            # static: every member of the current batch

    def add(self, seq: ServedSequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step's plan -----------------------------------------------------------

    def schedule(self, now: float) -> ScheduledStep:
        step = ScheduledStep()
        self._make_room_for_decode(step, now)
        if self.token_budget is None:                    # decode everyone; newcomers prefill whole
            step.decode = list(self.running)
            if self.rules.may_admit(self):
                self._admit(step, now, budget_left=None)
            step.chunks = [len(seq.tokens) - seq.num_cached for seq in step.prefill]
        else:                                            # decodes first, then prompt chunks, in tokens
            step.decode = [seq for seq in self.running if _is_decoding(seq)]
            step.prefill = [seq for seq in self.running if not _is_decoding(seq)]
            if self.rules.may_admit(self):
                self._admit(step, now, budget_left=self.token_budget - len(step.decode))
            remaining = [len(seq.tokens) - seq.num_cached for seq in step.prefill]
            step.chunks = budget_prefill_chunks(self.token_budget, len(step.decode), remaining)
        step.padding_rows = self.rules.padding_rows(self, step.decode)
        return step

    def _make_room_for_decode(self, step: ScheduledStep, now: float) -> None:
        """Each running sequence writes one more position; find blocks for it, preempting if needed."""
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue                                       # preempted a moment ago
            while not self.blocks.can_grow(seq.index, seq.num_cached + 1):
                victim = self.running[-1]
                self._preempt(victim, now)
                step.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.blocks.grow(seq.index, seq.num_cached + 1)

    def _admit(self, step: ScheduledStep, now: float, budget_left: int | None) -> None:
        """Admit waiting sequences (first come, first served) while a slot and their blocks are
        free, and, under a token budget, while the budget has a token left for them."""
        while self.waiting and self.free_slots:
            if budget_left is not None and not self.rules.admits_whole_batch and \
                    sum(len(s.tokens) - s.num_cached for s in step.prefill) >= budget_left:
                break
            seq = self.waiting[0]
            # prefill writes every token so far; the first decode then needs one more position
            if self.blocks.admit_cost(seq.tokens, len(seq.tokens) + 1) > self.blocks.num_free:
                break
            self.waiting.popleft()
            seq.num_cached = self.blocks.admit(seq.index, seq.tokens, len(seq.tokens) + 1)
            step.cached_tokens += seq.num_cached
            seq.status, seq.slot = Status.RUNNING, self.free_slots.pop()
            seq.slot_spans.append((seq.slot, now, None))
            if seq.admitted_at is None:
                seq.admitted_at = now
            self.running.append(seq)
            self.rules.admitted(self, seq)
            step.prefill.append(seq)

    # --- leaving ----------------------------------------------------------------------

    def finish(self, seq: ServedSequence, now: float) -> None:
        """A sequence produced its last token: free its blocks (and, unless static, its slot)."""
        seq.status, seq.finished_at = Status.FINISHED, now
        self._leave(seq, now)

    def abort(self, seq: ServedSequence, now: float) -> None:
        """A sequence leaves before its end (its client went away): out of the queue, or out
        of the batch with its blocks freed as if it had finished."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            seq.status, seq.finished_at = Status.FINISHED, now
        elif seq in self.running:
            self.finish(seq, now)

    def _preempt(self, seq: ServedSequence, now: float) -> None:
        seq.status, seq.num_cached = Status.WAITING, 0
        seq.preemptions += 1
        self._leave(seq, now)
        self.waiting.appendleft(seq)

    def _leave(self, seq: ServedSequence, now: float) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.index)
        slot, start, _ = seq.slot_spans[-1]
        seq.slot_spans[-1] = (slot, start, now)
        self.rules.left(self, seq)


def _is_decoding(seq: ServedSequence) -> bool:
    """Its prompt is done: only its newest token is not in the cache yet."""
    return bool(seq.output) and seq.num_cached == len(seq.tokens) - 1
