"""One thread owns the engine; the web server's event loop only talks to it.

Introduced in notebook 09 (serving over HTTP).

The serving engine (`engine.serving.Engine`) is stepped in ONE thread, and no other thread
ever touches it: a thread of its own (`start`: a notebook, the tests), or, for ``python -m
labsupport serve``, the thread that loaded the model (`run_here`: the web server then runs in
another). Requests cross over through two one-way channels:

    event loop --inbox (queue.SimpleQueue: add / abort)--> engine thread
    engine thread --loop.call_soon_threadsafe(token)-----> each request's asyncio.Queue

Between two steps the engine thread takes every waiting command (a new request joins the
running batch at the next step: continuous batching), then runs one step and hands each
new token to its request's queue on the event loop, thread-safely. When there is no work
it sleeps on the inbox. A step is mostly PyTorch kernels, which release the GIL, so the
event loop keeps accepting connections and writing tokens while the model computes.

Why a thread and not `run_in_executor(engine.step)`: with an executor the engine would move
between threads from step to step, and every add and abort would need a lock against a step
in progress. With one owner thread the engine needs no lock at all: the only shared objects
are the two queues, which are made for it. (vLLM goes one further and runs its engine core
in another process, to take the scheduler's Python off the web server's GIL.)
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass

from ..engine.serving.engine import Engine
from ..engine.serving.logprobs import prompt_logprobs
from ..engine.serving.request import Request
from ..errors import LabError


@dataclass
class Token:
    """One new token of a request, and whether it was the last. Notebook 09 (serving over HTTP)."""

    token: int
    finished: bool
    logprobs: object = None        # its `TokenLogprobs`, when the request asked for them


@dataclass
class Failure:
    """The engine could not serve a request; `message` is one sentence. status: 400 when the
    engine refused the request, 500 when its processing raised (that request alone ends; the
    engine serves on). Notebook 09 (serving over HTTP)."""

    message: str
    status: int = 400


class TokenQueue:
    """Where the engine thread puts a request's tokens: an asyncio.Queue on the event loop,
    filled thread-safely. Made on the event loop. Notebook 09 (serving over HTTP)."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        """From the engine thread: hand `item` to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:                   # the event loop has closed: no one is listening
            pass

    async def get(self, timeout: float):
        """On the event loop: the next item, or asyncio.TimeoutError after `timeout` seconds."""
        return await asyncio.wait_for(self.queue.get(), timeout)


class EngineThread:
    """The thread that owns `engine`: `submit` and `abort` from any thread, `start`/`stop`.
    `error` holds what stopped it, if anything did. Notebook 09 (serving over HTTP)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.queues: dict = {}                  # request id -> TokenQueue (engine thread only)
        self.error: BaseException | None = None
        self.steps = 0
        self.in_caller = False                  # run_here: the loop runs in the thread that called it
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labsupport-engine", daemon=True)

    @property
    def alive(self) -> bool:
        return self._running.is_set() and self.error is None

    def start(self) -> "EngineThread":
        """Step the engine in a thread of its own (a notebook, the tests); nothing when `run_here` owns it."""
        if not self.in_caller:
            self._running.set()
            self._thread.start()
        return self

    def leave_to_caller(self) -> None:
        """From now on `start` starts nothing: the caller will step the engine with `run_here`."""
        self.in_caller = True

    def run_here(self) -> None:
        """Step the engine in the calling thread until `stop` (what ``python -m labsupport serve`` does,
        in the thread that loaded the model). Why: PyTorch's CPU kernels run their OpenMP team from the
        thread that calls them, and a second thread's team starts cold at every step on a small CPU (one
        int4 layer of SmolLM2: about 20 us from the loading thread, 65 us from another, 2 cores). Call
        `leave_to_caller` before the app starts."""
        self._running.set()
        self._run()

    def submit(self, request: Request, tokens: TokenQueue) -> None:
        """Queue a request; it joins the batch at the engine's next step."""
        self.inbox.put(("add", request, tokens))

    def score(self, prompt: list[int], top: int, tokens: TokenQueue) -> None:
        """Queue one forward pass over `prompt` for its tokens' log-probabilities (`echo`): it runs
        on this thread between two steps, never beside one; the list (or a Failure) comes on `tokens`."""
        self.inbox.put(("score", (prompt, top), tokens))

    def abort(self, request_id) -> None:
        """Drop a request (its client went away); its blocks are free before the next step."""
        self.inbox.put(("abort", request_id, None))

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the step in progress, drop every request, and end the thread (or `run_here`)."""
        self.inbox.put(("stop", None, None))
        if self.in_caller:                       # run_here returns in its own thread
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise LabError(f"The engine thread did not stop within {timeout:.0f} s.")

    # --- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._take_commands(wait=not self.engine.has_work):
                if self.engine.has_work:
                    self._step()
        except BaseException as error:          # noqa: BLE001 - every waiting client is told, then it stops
            self.error = error
            for tokens in self.queues.values():
                tokens.put(Failure(f"The engine stopped: {type(error).__name__}: {error}"))
            if isinstance(error, KeyboardInterrupt) and self.in_caller:
                raise                            # Ctrl+C in run_here: the server shuts down
        finally:
            self._running.clear()
            for request_id in list(self.queues):     # stopping: nothing is left holding blocks
                self.engine.abort(request_id)
            self.queues.clear()

    def _take_commands(self, wait: bool) -> bool:
        """Apply every command in the inbox (waiting for one when idle); False on stop."""
        while True:
            try:
                command, payload, tokens = self.inbox.get(block=wait)
            except queue.Empty:
                return True
            wait = False
            if command == "stop":
                return False
            if command == "score":
                self._score(*payload, tokens)
                continue
            if command == "abort":
                self.engine.abort(payload)
                self.queues.pop(payload, None)
                continue
            try:
                self.engine.add_request(payload, self.engine.clock())
            except LabError as error:
                tokens.put(Failure(str(error)))
                continue
            except Exception as error:             # noqa: BLE001 - a bug with this request: it alone fails
                reason = " ".join(str(error).split()).rstrip(".") or "no message"
                tokens.put(Failure(f"The server failed to queue this request ({type(error).__name__}: "
                                   f"{reason}).", status=500))
                continue
            self.queues[payload.request_id] = tokens

    def _score(self, prompt: list[int], top: int, tokens: TokenQueue) -> None:
        try:
            tokens.put(prompt_logprobs(self.engine.model, prompt, top))
        except Exception as error:                 # noqa: BLE001 - this request alone fails
            reason = " ".join(str(error).split()).rstrip(".") or "no message"
            tokens.put(Failure(f"The server failed to score this prompt ({type(error).__name__}: {reason}).",
                               status=500))

    def _step(self) -> None:
        for seq, token in self.engine.step():
            tokens = self.queues.get(seq.id)
            if tokens is None:
                continue
            asked = seq.request.logprobs is not None and seq.logprobs
            tokens.put(Token(token, seq.is_finished, seq.logprobs[-1] if asked else None))
            if seq.is_finished:
                del self.queues[seq.id]
        self._tell_failures()
        self.steps += 1

    def _tell_failures(self) -> None:
        """Each request the engine ended for an error gets a 500 in one sentence; the others,
        and the engine, carry on. Notebook 09 (serving over HTTP)."""
        while self.engine.failures:
            request_id, message = self.engine.failures.pop(0)
            tokens = self.queues.pop(request_id, None)
            if tokens is not None:
                tokens.put(Failure(message, status=500))
