"""Who runs in the next step: static against continuous batching.

Introduced in notebook 06 (continuous batching).

Both policies share one interface (`schedule`, `finish`) and two limits: at most
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
from .block_manager import BlockManager
from .request import Sequence, Status

POLICIES = ("static", "continuous")


@dataclass
class ScheduledStep:
    """The plan for one engine step."""

    prefill: list[Sequence] = field(default_factory=list)    # admitted now: run prompt (+ output so far)
    decode: list[Sequence] = field(default_factory=list)     # advance one token each
    padding_rows: int = 0                                     # static: finished members still computed
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode)


class Scheduler:
    """FCFS admission under slot and block limits, with one of two policies."""

    def __init__(self, policy: str, max_slots: int, blocks: BlockManager):
        if policy not in POLICIES:
            raise LabError(f"Unknown scheduling policy {policy!r}; choose 'static' or 'continuous'.")
        if max_slots < 1:
            raise LabError(f"The server needs at least one batch slot, got max_slots={max_slots}.")
        self.policy, self.max_slots, self.blocks = policy, max_slots, blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in order of admission
        self.free_slots = list(range(max_slots - 1, -1, -1))
        self.batch: list[Sequence] = []            # static: every member of the current batch

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step's plan -----------------------------------------------------------

    def schedule(self, now: float) -> ScheduledStep:
        step = ScheduledStep()
        self._make_room_for_decode(step, now)
        step.decode = list(self.running)
        if self.policy == "continuous" or not self.batch:
            self._admit(step, now)
        if self.policy == "static":
            step.padding_rows = len(self.batch) - len(step.decode) if step.decode else 0
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
            if self.policy == "static":
                self.batch.append(seq)
            step.prefill.append(seq)

    # --- leaving ----------------------------------------------------------------------

    def finish(self, seq: Sequence, now: float) -> None:
        """A sequence produced its last token: free its blocks (and, unless static, its slot)."""
        seq.status, seq.finished_at = Status.FINISHED, now
        self._leave(seq, now)

    def _preempt(self, seq: Sequence, now: float) -> None:
        seq.status, seq.num_cached = Status.WAITING, 0
        seq.preemptions += 1
        self._leave(seq, now)
        self.waiting.appendleft(seq)

    def _leave(self, seq: Sequence, now: float) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.index)
        slot, start, _ = seq.slot_spans[-1]
        seq.slot_spans[-1] = (slot, start, now)
        if self.policy == "continuous":
            self.free_slots.append(seq.slot)
        elif not self.running:                             # static: the whole batch has ended
            self.batch = []
            self.free_slots = list(range(self.max_slots - 1, -1, -1))
