"""Requests and the state of each sequence a server is working on.

Introduced in notebook 06 (continuous batching).

A `Request` is what a user sends: a prompt, how to sample, when to stop, and
when it arrived. A `ServedSequence` is the server's record of one request while it is
served. It moves through three states::

    WAITING --admitted (prefill)--> RUNNING --last token--> FINISHED
       ^                               |
       +--------- preempted -----------+   (its cache blocks were needed elsewhere)

A preempted sequence keeps the tokens it has generated; when it is admitted
again, one prefill over prompt + generated tokens rebuilds its cache
("recompute" preemption, as in vLLM), and it carries on where it stopped.
`num_cached` counts the positions whose keys and values are in the cache: the
tokens from there on are still to compute (a whole prompt, a chunk of one, or
just the newest token when decoding).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...errors import LabError
from ...inputs import finite_number, token_id_set, token_rows, whole_number
from ..sampling import GREEDY, SamplingConfig, require_sampling, sample


@dataclass
class Request:
    """One user's request. `arrival` is in seconds from the start of a run.
    Notebook 06 (continuous batching)."""

    prompt: Sequence[int]
    max_new_tokens: int = 32
    sampling: SamplingConfig = GREEDY
    eos_token_ids: Sequence[int] = ()
    arrival: float = 0.0
    request_id: str | int | None = None
    on_token: Callable[[int], None] | None = field(default=None, repr=False, compare=False)
    logprobs: int | None = None     # None: none; k: each token's log-probability and the k best (notebook 09)

    def __post_init__(self):
        # every field through labsupport.inputs: whole numbers, finite times (NaN fails), ids
        name = f"request {self.request_id!r}"
        rows = token_rows(self.prompt, what=f"prompt of {name}")
        if len(rows) != 1:
            raise LabError(f"The prompt of {name} holds {len(rows)} prompts; give each prompt its own Request.")
        self.prompt = rows[0]
        self.max_new_tokens = whole_number(self.max_new_tokens, f"max_new_tokens of {name}")
        self.arrival = finite_number(self.arrival, f"arrival of {name} (seconds from the start)", minimum=0)
        require_sampling(self.sampling, f"The sampling of {name}")
        self.eos_token_ids = token_id_set(self.eos_token_ids, f"eos_token_ids of {name}")
        if self.logprobs is not None:
            self.logprobs = whole_number(self.logprobs, f"logprobs of {name} (alternatives per token, "
                                         "at most 20, or None)", minimum=0, maximum=20)
        if self.on_token is not None and not callable(self.on_token):
            raise LabError(f"on_token of {name} must be a function of one token id, or None.")

    @property
    def max_length(self) -> int:
        """The most positions this request can ever occupy in the cache."""
        return len(self.prompt) + self.max_new_tokens


class Status(enum.Enum):
    """Where a sequence stands: waiting for a slot, running, or finished.
    Notebook 06 (continuous batching)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def require_request(request) -> None:
    """One sentence (a LabError) unless `request` is a `Request`: the one check of it, wherever
    the engine takes requests in (`Engine.run`, `add_request`, `ServedSequence`). Notebook 06."""
    if not isinstance(request, Request):
        raise LabError(f"The engine serves Request objects, got a {type(request).__name__}; "
                       f"wrap each prompt as Request(prompt=ids, max_new_tokens=...).")


class ServedSequence:
    """The server's record of one request: its tokens, its state, its cache blocks, its timings.
    Notebook 06 (continuous batching)."""

    def __init__(self, request: Request, index: int, device):
        require_request(request)
        self.request = request
        self.index = whole_number(index, "index (the sequence's order of arrival)", minimum=0)
        self.id = request.request_id if request.request_id is not None else index
        self.status = Status.WAITING
        self.output: list[int] = []         # generated tokens so far
        self.num_cached = 0                 # positions whose keys/values are in the cache
        self.slot: int | None = None        # batch slot while admitted (for the timeline)
        self.generator = request.sampling.generator(device)
        self.preemptions = 0
        self.logprobs: list = []            # one `TokenLogprobs` per output token, if the request asks
        # timings, in seconds of the run's clock
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.token_times: list[float] = []  # when each output token was emitted
        self.slot_spans: list[tuple[int, float, float | None]] = []   # (slot, start, end)

    @property
    def tokens(self) -> list[int]:
        """Prompt followed by every generated token."""
        return self.request.prompt + self.output

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int, now: float) -> bool:
        """Record a new token; returns True when this token ends the sequence."""
        self.output.append(token)
        self.token_times.append(now)
        if self.first_token_at is None:
            self.first_token_at = now
        if self.request.on_token is not None:
            self.request.on_token(token)
        return (token in self.request.eos_token_ids
                or len(self.output) >= self.request.max_new_tokens)

    def __repr__(self):
        return (f"ServedSequence(id={self.id!r}, {self.status.value}, prompt={len(self.request.prompt)}, "
                f"output={len(self.output)}/{self.request.max_new_tokens}, slot={self.slot})")


def next_token(logits: torch.Tensor, sequence: ServedSequence) -> int:
    """Pick a sequence's next token from its logits (vocab,), with its own sampling and seed,
    so that what runs beside it never changes its random stream. Notebook 06 (continuous batching)."""
    return int(sample(logits[None], sequence.request.sampling, sequence.generator)[0])
