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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..errors import LabError
from ..inputs import whole_number
from .block_manager import BlockManager
from .request import ServedSequence, Status

class Policy:
    """A scheduling policy: the rules by which waiting sequences join the running batch.

    Introduced in notebook 06 (continuous batching). A policy is an object with four
    small decisions, so a new one (say, shortest-prompt-first) is one subclass; the
    `Scheduler` around it keeps the slot and block limits, admission order and
    preemption the same for every policy.
    """

    name = "policy"

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

    prefill: list[ServedSequence] = field(default_factory=list)    # admitted now: run prompt (+ output so far)
    decode: list[ServedSequence] = field(default_factory=list)     # advance one token each
    padding_rows: int = 0                                     # static: finished members still computed
    preempted: list[ServedSequence] = field(default_factory=list)


class Scheduler:
    """FCFS admission under slot and block limits, with one policy (`Policy`, or its name).
    Notebook 06 (continuous batching)."""

    def __init__(self, policy, max_slots: int, blocks: BlockManager):
        self.rules = as_policy(policy)
        self.policy = self.rules.name               # the name, as results and plots show it
        self.max_slots = whole_number(max_slots, "max_slots (the server's batch slots)")
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
        step.decode = list(self.running)
        if self.rules.may_admit(self):
            self._admit(step, now)
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

    def _admit(self, step: ScheduledStep, now: float) -> None:
        """Admit waiting sequences (first come, first served) while a slot and their blocks are free."""
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            # prefill writes every token so far; the first decode then needs one more position
            if not self.blocks.can_grow(seq.index, len(seq.tokens) + 1):
                break
            self.waiting.popleft()
            self.blocks.grow(seq.index, len(seq.tokens) + 1)
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
