"""Who runs in the next step: static against continuous batching.

Introduced in notebook 06 (continuous batching).

The `Scheduler` keeps the state: who waits, who runs, which slots and blocks are free.
A policy (objects: `StaticBatching`, `ContinuousBatching`, or their names) keeps none:
before each step it is shown a read-only `SchedulerView` (the waiting and running
sequences, the finished ones still holding a slot, free slots and blocks, the budget)
and returns a `Decision` (whom to admit, which finished sequences give their slot back,
how many padding rows to compute), which the scheduler applies within its limits: at
most `max_slots` sequences in a batch, no more cache blocks than the block manager has,
and no more tokens in a step than the budget. The two policies differ only in when a
waiting sequence may join:

* static: a batch is admitted together, when the previous batch has ended, and
  runs until its longest member ends. Members that finish early keep their slot
  and are still computed as padding rows, as in a padded `generate()` batch
  (notebook 02): the restaurant that seats new parties only when every table is free.
* continuous: between any two steps, finished sequences leave and waiting ones
  take their slots (Yu et al., Orca, 2022): tables are re-seated as soon as they clear.

When a running sequence needs a new block and none is free, the policy's victim (by
default the most recently admitted sequence) is preempted: its blocks and its slot are
released and it goes back to the front of the queue, keeping its tokens (see request.py).

With a token budget (`token_budget`, the Sarathi / vLLM chunked-prefill policy) a
step is planned in tokens: every decoding sequence costs one, and what is left goes
to prompt chunks, first to sequences still part-way through their prompt, then to
newcomers in the policy's order (arrival order for both policies here; see
`budget_prefill_chunks`); a long prompt is split over steps. Padding rows cost a token
each too, so no step computes more than its budget.
Without one, each newcomer's whole prompt runs in the step it is admitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from ...errors import LabError
from ...inputs import finite_number, whole_number
from .block_manager import BlockManager
from .request import ServedSequence, Status


def budget_prefill_chunks(token_budget: int, num_decodes: int, remaining: list[int]) -> list[int]:
    """How many prompt tokens each sequence computes this step under a token budget: each of
    the `num_decodes` decoding sequences costs one token; the rest goes to the prompts in order
    (remaining[i]: prompt tokens sequence i still has to compute), greedily: the first gets
    min(remaining[0], left), then the next, ... (zeros once the budget is spent).
    Introduced in notebook 06b (chunked prefill and prefix caching)."""
    left = token_budget - num_decodes
    if left < 0:
        raise LabError(f"{num_decodes} decoding sequences need {num_decodes} tokens but the budget is "
                       f"{token_budget}; give a token_budget of at least max_slots.")
    chunks = []
    for need in remaining:
        chunks.append(min(need, left))
        left -= chunks[-1]
    return chunks


@dataclass(frozen=True)
class SchedulerView:
    """What a policy decides on, read-only (tuples; read the sequences, never change them).
    Notebook 06 (continuous batching)."""

    waiting: tuple[ServedSequence, ...]     # in queue order (a preempted sequence at the front)
    running: tuple[ServedSequence, ...]     # in order of admission
    decoding: tuple[ServedSequence, ...]    # the running ones that compute one token each this step
    finished: tuple[ServedSequence, ...]    # finished, still holding their slot (until a Decision vacates it)
    free_slots: int
    free_blocks: int
    token_budget: int | None                # tokens per step, or None (whole prompts)


@dataclass(frozen=True)
class Decision:
    """A policy's answer for one step, which the scheduler applies. Notebook 06 (continuous batching).

    vacate: sequences of `view.finished` whose slots come free now.
    admit: sequences of `view.waiting`, in the order to try; each is admitted while a slot,
        its cache blocks and (under a token budget) a token of this step are free; the first
        that does not fit stops the admissions (so no one overtakes it).
    padding_rows: rows computed beside the decodes as padding, one token each (at most the
        slots the decodes leave).
    admit_beyond_budget: admit whoever fits in slots and blocks even when this step's tokens
        are spent (their prompts then run in the next steps).
    """

    vacate: tuple[ServedSequence, ...] = ()
    admit: tuple[ServedSequence, ...] = ()
    padding_rows: int = 0
    admit_beyond_budget: bool = False


class Policy:
    """A scheduling policy: the rules by which waiting sequences join the running batch.

    Introduced in notebook 06 (continuous batching). A policy holds no state: `decide`
    is shown a `SchedulerView` before every step and returns a `Decision`; `victim` names
    the sequence to preempt when the cache is full. A new policy (say, shortest prompt
    first) is one small subclass; the `Scheduler` keeps the slot, block and token limits
    and applies every policy's decisions the same way.
    """

    name = "policy"

    def decide(self, view: SchedulerView) -> Decision:
        """Whom to admit in this step, whose slots to vacate, how many padding rows."""
        raise NotImplementedError

    def victim(self, view: SchedulerView) -> ServedSequence:
        """The running sequence to preempt when one needs a cache block and none is free:
        the most recently admitted (it has done the least work)."""
        return view.running[-1]

    def __str__(self) -> str:
        return self.name


class StaticBatching(Policy):
    """A batch is admitted together, when the previous batch has ended, and runs until its
    longest member ends; finished members keep their slot as padding rows.
    Notebook 06 (continuous batching)."""

    name = "static"

    def decide(self, view):
        if view.running:                                    # the batch runs on, finished members as padding
            return Decision(padding_rows=len(view.finished) if view.decoding else 0)
        return Decision(vacate=view.finished, admit=view.waiting, admit_beyond_budget=True)


class ContinuousBatching(Policy):
    """Between any two steps, finished sequences leave and waiting ones take their slots.
    Notebook 06 (continuous batching)."""

    name = "continuous"

    def decide(self, view):
        return Decision(vacate=view.finished, admit=view.waiting)


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

    @property
    def prompt_chunks(self) -> list[tuple[ServedSequence, int]]:
        """(sequence, tokens) for each prompt chunk the step computes (a chunk of 0 computes nothing)."""
        return [(seq, n) for seq, n in zip(self.prefill, self.chunks) if n > 0]

    @property
    def computed(self) -> list[tuple[ServedSequence, int]]:
        """(sequence, tokens) for every row the step computes: each decode's one, then the chunks."""
        return [(seq, 1) for seq in self.decode] + self.prompt_chunks


def require_batch_limits(max_slots, token_budget) -> tuple[int, int | None]:
    """(max_slots, token_budget) as ints, if max_slots is a whole number >= 1 and token_budget
    None or a whole number >= max_slots (so that every decode fits); else one sentence. The one
    check of them, at both entrances that take them: `Engine` and `Scheduler`. Notebook 06."""
    max_slots = whole_number(max_slots, "max_slots (the server's batch slots)")
    if token_budget is not None:
        token_budget = whole_number(token_budget, f"token_budget (tokens per step; at least max_slots = "
                                    f"{max_slots}, so that every decode fits, or None)", minimum=max_slots)
    return max_slots, token_budget


class Scheduler:
    """Admission in the policy's order under slot and block limits, with one policy (`Policy`,
    or its name), and optionally a token budget per step (None: whole prompts).
    Notebook 06 (continuous batching)."""

    def __init__(self, policy, max_slots: int, blocks: BlockManager, token_budget: int | None = None):
        self.rules = as_policy(policy)
        self.policy = self.rules.name               # the name, as results and plots show it
        self.max_slots, token_budget = require_batch_limits(max_slots, token_budget)
        if not isinstance(blocks, BlockManager):
            raise LabError(f"blocks must be a BlockManager, got {type(blocks).__name__}.")
        self.token_budget = token_budget
        self.blocks = blocks
        self.waiting: deque[ServedSequence] = deque()
        self.running: list[ServedSequence] = []          # in order of admission
        self.finished: list[ServedSequence] = []         # finished, still holding a slot
        self.free_slots = list(range(self.max_slots))    # the lowest free slot is taken first

    def add(self, seq: ServedSequence) -> None:
        """Queue a sequence (at the back)."""
        if not isinstance(seq, ServedSequence):
            raise LabError(f"The scheduler queues ServedSequence objects, got a {type(seq).__name__}.")
        if seq.status is not Status.WAITING or seq in self.waiting:
            raise LabError(f"Sequence {seq.id!r} is {seq.status.value} or already queued; queue each sequence once.")
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def view(self) -> SchedulerView:
        """The state a policy decides on, as it is now."""
        decoding = self.running if self.token_budget is None else [s for s in self.running if _is_decoding(s)]
        return SchedulerView(tuple(self.waiting), tuple(self.running), tuple(decoding), tuple(self.finished),
                             len(self.free_slots), self.blocks.num_free, self.token_budget)

    # --- one step's plan -----------------------------------------------------------

    def schedule(self, now: float) -> ScheduledStep:
        """Plan the next step at time `now`: preempt if the cache is full, then apply the policy's decision."""
        now = finite_number(now, "now (the run's clock)", minimum=0)
        step = ScheduledStep()
        self._make_room_for_decode(step, now)
        view = self.view()
        decision = self._checked(self.rules.decide(view), view)
        for seq in decision.vacate:
            self.finished.remove(seq)
            self._free_slot(seq.slot)
        step.padding_rows = decision.padding_rows
        step.decode = list(view.decoding)
        if self.token_budget is None:                    # decode everyone; newcomers prefill whole
            self._admit(step, now, decision.admit, tokens_left=None)
            step.chunks = [len(seq.tokens) - seq.num_cached for seq in step.prefill]
        else:                                            # decodes and padding first, then prompt chunks
            step.prefill = [seq for seq in self.running if not _is_decoding(seq)]
            tokens_left = self.token_budget - len(step.decode) - step.padding_rows
            self._admit(step, now, decision.admit, None if decision.admit_beyond_budget else tokens_left)
            remaining = [len(seq.tokens) - seq.num_cached for seq in step.prefill]
            step.chunks = budget_prefill_chunks(self.token_budget - step.padding_rows, len(step.decode), remaining)
        return step

    def _checked(self, decision, view: SchedulerView) -> Decision:
        """The policy's decision, if it is one the scheduler can apply; else one sentence."""
        name = f"Policy {self.rules.name!r}"
        if not isinstance(decision, Decision):
            raise LabError(f"{name}.decide must return a Decision, got {type(decision).__name__}.")
        try:
            decision = replace(decision, admit=tuple(decision.admit), vacate=tuple(decision.vacate))
        except TypeError:
            raise LabError(f"The decision of {name} must list sequences in admit and vacate (tuples or lists).") from None
        for what, chosen, among in (("admit", decision.admit, view.waiting), ("vacate", decision.vacate,
                                                                              view.finished)):
            if any(seq not in among for seq in chosen) or len(set(map(id, chosen))) != len(chosen):
                kind = "waiting" if what == "admit" else "finished and holding a slot"
                raise LabError(f"{name} decided to {what} a sequence that is not {kind} (or one twice); "
                               f"choose them from view.{'waiting' if what == 'admit' else 'finished'}.")
        room = self.max_slots - len(view.decoding)
        whole_number(decision.padding_rows, f"padding_rows in the decision of {name} (at most the {room} slots "
                     f"the decodes leave)", minimum=0, maximum=room)
        return decision

    def _make_room_for_decode(self, step: ScheduledStep, now: float) -> None:
        """Each running sequence writes one more position; find blocks for it, preempting if needed."""
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue                                       # preempted a moment ago
            while not self.blocks.can_grow(seq.index, seq.num_cached + 1):
                victim = self.rules.victim(self.view())
                if victim not in self.running:
                    raise LabError(f"Policy {self.rules.name!r} chose a victim that is not running; "
                                   "choose it from view.running.")
                self._preempt(victim, now)
                step.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.blocks.grow(seq.index, seq.num_cached + 1)

    def _admit(self, step: ScheduledStep, now: float, candidates, tokens_left: int | None) -> None:
        """Admit the candidates in order while a slot and their blocks are free, and, with
        `tokens_left`, while this step's budget has a token left for them."""
        for seq in candidates:
            if not self.free_slots:
                break
            if tokens_left is not None and sum(len(s.tokens) - s.num_cached for s in step.prefill) >= tokens_left:
                break
            # prefill writes every token so far; the first decode then needs one more position
            if self.blocks.admit_cost(seq.tokens, len(seq.tokens) + 1) > self.blocks.num_free:
                break
            self.waiting.remove(seq)
            seq.num_cached = self.blocks.admit(seq.index, seq.tokens, len(seq.tokens) + 1)
            step.cached_tokens += seq.num_cached
            seq.status, seq.slot = Status.RUNNING, self.free_slots.pop(0)
            seq.slot_spans.append((seq.slot, now, None))
            if seq.admitted_at is None:
                seq.admitted_at = now
            self.running.append(seq)
            step.prefill.append(seq)

    # --- after a step: every counter, in one place ---------------------------------------

    def postprocess(self, step: ScheduledStep, tokens: list[tuple[ServedSequence, int]],
                    now: float) -> tuple[list[ServedSequence], list[tuple[ServedSequence, Exception]]]:
        """The step's bookkeeping, after the model ran it: each computed sequence's `num_cached`
        moves past what it computed, a prompt's full blocks become shareable (prefix caching),
        each sampled token is appended (running the request's callback), and a sequence at its
        end finishes. tokens: the (sequence, token) pairs the step sampled. Returns the
        sequences that finished and the (sequence, error) pairs whose callback raised, which
        the caller ends alone."""
        for seq, n in step.computed:
            seq.num_cached += n
        for seq, _ in step.prompt_chunks:
            self.blocks.cache_full_blocks(seq.index, seq.request.prompt, seq.num_cached)
        finished, failed = [], []
        for seq, token in tokens:
            try:
                ended = seq.append(token, now)          # runs the request's on_token callback
            except Exception as error:                  # noqa: BLE001 - that request alone fails
                failed.append((seq, error))
                continue
            if ended:
                self.finish(seq, now)
                finished.append(seq)
        return finished, failed

    # --- leaving ----------------------------------------------------------------------

    def finish(self, seq: ServedSequence, now: float) -> None:
        """A sequence produced its last token: free its blocks; its slot stays held until the
        policy vacates it (at once, unless static)."""
        if seq not in self.running:
            raise LabError(f"Sequence {getattr(seq, 'id', seq)!r} is not running, so it cannot finish.")
        seq.status, seq.finished_at = Status.FINISHED, now
        self._leave(seq, now)
        self.finished.append(seq)

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
        self._free_slot(seq.slot)
        self.waiting.appendleft(seq)

    def _leave(self, seq: ServedSequence, now: float) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.index)
        slot, start, _ = seq.slot_spans[-1]
        seq.slot_spans[-1] = (slot, start, now)

    def _free_slot(self, slot: int) -> None:
        self.free_slots.append(slot)
        self.free_slots.sort()


def _is_decoding(seq: ServedSequence) -> bool:
    """Its prompt is done: only its newest token is not in the cache yet."""
    return bool(seq.output) and seq.num_cached == len(seq.tokens) - 1
