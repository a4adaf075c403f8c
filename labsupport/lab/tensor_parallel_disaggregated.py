"""Disaggregated prefill and decode: one process only prefills, another only decodes, and every
finished prefill hands its KV cache over.

Introduced in notebook 10 (past one device).

Two ranks of one thread each, joined by `torch.distributed` (gloo over 127.0.0.1), share the
clock of the machine (`time.monotonic` is system-wide):

* rank 0, the prefill worker, takes the requests in order of arrival. It waits for each to
  arrive, prefills its prompt alone through a paged cache, and picks the first token (as the
  engine does: greedy, or sampled with the request's own seeded generator). That is the
  request's first token, so its time to first token ends here. Then it sends the prompt's keys
  and values to rank 1 without waiting for it (`isend`): a header (which request, how many
  positions, the first token, the size of the generator's state), one tensor of (2, layers,
  positions, kv_heads, head_dim), and the generator's state, so that rank 1 samples on from
  where rank 0 stopped. Rank 1 records each handover's bytes and the seconds its receive took.
* rank 1, the decode worker, runs continuous batching over decodes only. A receiver thread takes
  each handover as it lands. Between two steps the decode loop seats whatever has arrived, so a
  step never waits for a prefill. It writes each cache into its own paged pool through the
  request's block table, and seats the request in a free slot. A step decodes every seated request by one token.
  A request ends as it would on the engine: at max_new_tokens, or at one of its end tokens
  (`eos_token_ids`), the first token included.

Every request is checked before any process starts (`require_workload`): a prompt past the
context or outside the vocabulary, and bad counts (slots, block_size, timeout), are one sentence.

`compare_with_colocated` serves the same requests with one engine on the same two cores, with
chunked prefill, and judges both by goodput: the requests per second that met both service-level
objectives (time to first token and time per output token).
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time

import torch

from ..engine.models.transformer import Transformer
from ..engine.parallel import run_ranks
from ..engine.parallel.launch import require_launch
from ..engine.serving import BlockManager, Engine, PagedKVCache, ServedSequence
from ..engine.serving.block_manager import blocks_needed
from ..engine.serving.model_runner import ModelRunner
from ..engine.serving.request import next_token, require_request
from ..engine.serving.scheduler import require_batch_limits
from ..errors import LabError
from ..inputs import finite_number, whole_number
from .serving_metrics import goodput, request_times

END = -1                                   # a header whose request index is END: no more requests
HEADER = 4                                 # request index, positions, first token, bytes of generator state


def _pool(model, positions: int, block_size: int):
    blocks = BlockManager(blocks_needed(positions, block_size), block_size)
    cache = PagedKVCache(model.config, blocks.num_free, block_size, device=model.device, dtype=model.dtype)
    return blocks, cache, ModelRunner(model, cache, blocks)


def _slots(cache, blocks, index: int, length: int) -> torch.Tensor:
    table = torch.tensor([blocks.table(index)], device=cache.device)                  # (1, blocks)
    return cache.slots(table, torch.arange(length, device=cache.device)[None])[0]     # (length,)


def _prefill_worker(model, requests, start: float, block_size: int) -> dict:
    """Rank 0: prefill each request as it arrives, send its cache to rank 1."""
    longest = max(len(r.prompt) for r in requests)
    blocks, cache, runner = _pool(model, longest, block_size)
    prefill_from, first_token_at, in_flight = {}, {}, []
    for index, request in sorted(enumerate(requests), key=lambda pair: pair[1].arrival):
        time.sleep(max(0.0, start + request.arrival - time.monotonic()))
        prefill_from[index] = time.monotonic() - start
        seq = ServedSequence(request, index, model.device)
        T = len(request.prompt)
        blocks.grow(index, T)
        first = next_token(runner.prefill(seq), seq)         # the engine's pick: greedy, or its own generator
        first_token_at[index] = time.monotonic() - start
        slots = _slots(cache, blocks, index, T)
        kv = torch.stack([cache.keys[:, slots], cache.values[:, slots]])   # (2, layers, T, kv_heads, D)
        state = seq.generator.get_state() if seq.generator is not None else torch.empty(0, dtype=torch.uint8)
        header, kv = torch.tensor([index, T, first, state.numel()]), kv.contiguous()
        # sent without waiting (isend): the next prompt's prefill need not wait for the decode worker to take this one
        for tensor in (header, kv, state)[:3 if state.numel() else 2]:
            in_flight.append((tensor, torch.distributed.isend(tensor, dst=1)))
        blocks.release(index)
    torch.distributed.send(torch.tensor([END, 0, 0, 0]), dst=1)
    for _, work in in_flight:
        work.wait()
    return {"prefill_from": prefill_from, "first_token_at": first_token_at}


def _receive_handovers(config, dtype, start: float, arrived: queue.Queue) -> None:
    """Rank 1's receiver thread: take each handover as soon as it lands, whatever the decode loop
    is doing, and post it to `arrived`; None once rank 0 has sent them all. (A thread, because
    gloo's `irecv(...).is_completed()` stays False until `wait()` is called, even after the data
    has arrived, so a decode loop that polled it would take handovers only when it ran dry.)"""
    try:
        _receive_each(config, dtype, start, arrived)
    except BaseException as error:                      # the decode loop re-raises it: never a silent hang
        arrived.put(error)


def _receive_each(config, dtype, start: float, arrived: queue.Queue) -> None:
    header = torch.zeros(HEADER, dtype=torch.long)
    while True:
        torch.distributed.recv(header, src=0)
        index, T, first, state_bytes = header.tolist()
        if index == END:
            arrived.put(None)
            return
        kv = torch.empty(2, config.num_layers, T, config.num_kv_heads, config.head_dim, dtype=dtype)
        began = time.perf_counter()
        torch.distributed.recv(kv, src=0)
        seconds = time.perf_counter() - began
        state = None
        if state_bytes:                                   # a sampled request: where its generator stands
            state = torch.empty(state_bytes, dtype=torch.uint8)
            torch.distributed.recv(state, src=0)
        arrived.put({"index": index, "T": T, "first": first, "kv": kv, "state": state, "bytes": kv.nbytes,
                     "seconds": seconds, "received_at": time.monotonic() - start})


def _decode_worker(model, requests, start: float, slots: int, block_size: int) -> dict:
    """Rank 1: seat each handed-over request, decode every seated one by a token per step."""
    room = sum(len(r.prompt) + r.max_new_tokens + block_size for r in requests)
    blocks, cache, runner = _pool(model, room, block_size)
    waiting, running, done, handovers = [], [], {}, []
    token_times: dict[int, list[float]] = {}
    received_at, seated_at = {}, {}
    arrived: queue.Queue = queue.Queue()
    receiver = threading.Thread(target=_receive_handovers, args=(model.config, model.dtype, start, arrived),
                                daemon=True)
    receiver.start()
    finished_sending = False
    while not finished_sending or waiting or running:
        while not finished_sending and (not arrived.empty() or not (waiting or running)):
            handover = arrived.get()                         # blocks only when there is nothing to decode
            if handover is None:
                finished_sending = True
                break
            if isinstance(handover, BaseException):
                raise LabError(f"The decode worker's receiver failed: {handover}") from handover
            handovers.append({"bytes": handover["bytes"], "seconds": handover["seconds"]})
            received_at[handover["index"]] = handover["received_at"]
            waiting.append(handover)
        while waiting and len(running) < slots:
            handover = waiting.pop(0)
            seq = _seat(model, requests[handover["index"]], handover, blocks, cache)
            token_times[seq.index] = []
            seated_at[seq.index] = time.monotonic() - start
            running.append(seq)
        finished = [s for s in running if _ended(s)]
        for seq in finished:
            running.remove(seq)
            blocks.release(seq.index)
            done[seq.index] = seq.output
        if not running:
            continue
        for seq in running:
            blocks.grow(seq.index, len(seq.tokens))         # room for the position this step writes
        logits = runner.decode(running)                      # (rows, vocab)
        now = time.monotonic() - start
        greedy = logits.argmax(dim=-1).tolist()              # the engine's rule: greedy rows by argmax, ...
        for row, seq in enumerate(running):
            token = greedy[row] if seq.request.sampling.greedy else next_token(logits[row], seq)   # ... others sampled
            seq.num_cached += 1                              # this worker is its own scheduler
            seq.output.append(token)
            token_times[seq.index].append(now)
    return {"tokens": done, "token_times": token_times, "handovers": handovers, "received_at": received_at,
            "seated_at": seated_at}


def _seat(model, request, handover: dict, blocks, cache) -> ServedSequence:
    """A handed-over request, seated: its cache written into this worker's pool, its first token
    and its generator (where rank 0 left it) taken over."""
    index, T = handover["index"], handover["T"]
    seq = ServedSequence(request, index, model.device)
    blocks.grow(index, T + 1)
    positions = _slots(cache, blocks, index, T)
    cache.keys[:, positions], cache.values[:, positions] = handover["kv"][0], handover["kv"][1]
    seq.num_cached, seq.output = T, [handover["first"]]
    if handover["state"] is not None:
        seq.generator.set_state(handover["state"])
    return seq


def _ended(seq: ServedSequence) -> bool:
    """Whether a request is over, as the engine judges it (`ServedSequence.append`): its last
    token is one of its end tokens, or it has all max_new_tokens."""
    return seq.output[-1] in seq.request.eos_token_ids or len(seq.output) >= seq.request.max_new_tokens


def _rank(rank: int, world: int, model, requests, slots: int, block_size: int) -> dict:
    start = torch.tensor([time.monotonic() + 0.5], dtype=torch.float64)  # both begin half a second from now
    torch.distributed.broadcast(start, src=0)
    with torch.inference_mode():
        if rank == 0:
            return _prefill_worker(model, requests, float(start), block_size)
        return _decode_worker(model, requests, float(start), slots, block_size)


def require_workload(model, requests, slots=4, block_size=16, timeout=600.0) -> tuple[list, int, int, float]:
    """`serve_disaggregated`'s arguments checked before any process starts: (requests as a list,
    slots, block_size, timeout), or one sentence. Notebook 10 (past one device). Refuses: no
    requests, anything but `Request`s, max_new_tokens below 2, a request past the model's
    context or with ids outside its vocabulary, a streaming callback or logprobs (the ranks
    return tokens only), slots or block_size not whole numbers >= 1, a timeout not > 0."""
    if not isinstance(model, Transformer):
        raise LabError(f"serve_disaggregated serves a labsupport Transformer (load_model, random_model), "
                       f"got {type(model).__name__}.")
    if not isinstance(requests, (list, tuple)):
        raise LabError(f"requests must be a list of Request objects, got {type(requests).__name__}.")
    if not requests:
        raise LabError("serve_disaggregated needs at least one request.")
    for position, request in enumerate(requests):
        _require_request_servable(model.config, request, position)
    slots = whole_number(slots, "slots (requests the decode worker decodes together)")
    block_size = whole_number(block_size, "block_size (positions per cache block)", maximum=model.config.max_position)
    _, _, timeout = require_launch(2, _rank, (), 1, timeout, "cpu")     # also: two cores for the two ranks
    return list(requests), slots, block_size, timeout


def _require_request_servable(config, request, position: int) -> None:
    require_request(request)
    name = request.request_id if request.request_id is not None else position
    if request.max_new_tokens < 2:
        raise LabError("Every request needs max_new_tokens of 2 or more: the decode worker makes the tokens after "
                       f"the first (request {name!r} asks for {request.max_new_tokens}).")
    if request.max_length > config.max_position:
        raise LabError(f"Request {name!r} needs {request.max_length} positions (prompt {len(request.prompt)} + "
                       f"max_new_tokens {request.max_new_tokens}) but the model's context holds "
                       f"{config.max_position}; shorten the prompt or ask for fewer tokens.")
    if max(request.prompt) >= config.vocab_size or min(request.prompt) < 0:
        raise LabError(f"Request {name!r} has token ids outside the vocabulary [0, {config.vocab_size}); "
                       "encode text with this model's tokenizer.")
    if request.on_token is not None or request.logprobs is not None:
        raise LabError(f"Request {name!r} asks for {'on_token' if request.on_token is not None else 'logprobs'}, "
                       "which serve_disaggregated does not give (its ranks return tokens only); leave it None, "
                       "or serve the request with Engine.")


def serve_disaggregated(model, requests: list, slots: int = 4, block_size: int = 16, timeout: float = 600.0) -> dict:
    """Serve `requests` (`Request`s with arrival times) on a prefill rank and a decode rank, one
    thread each. Notebook 10 (past one device). Each request gets the tokens the engine gives it
    alone: greedy or sampled with its own seed, ended at max_new_tokens or at an end token.

    Returns, per request (in the order given): its tokens, its time to first token, its time per
    output token, and its timeline in seconds from the start (arrival, prefill from, first token,
    cache received, seated, finished); and every handover's bytes and seconds. Bad arguments are
    refused before any process starts (`require_workload`)."""
    requests, slots, block_size, timeout = require_workload(model, requests, slots, block_size, timeout)
    prefill, decode = run_ranks(2, _rank, (model, requests, slots, block_size), threads=1, timeout=timeout)
    out = []
    for index, request in enumerate(requests):
        first, times = prefill["first_token_at"][index], decode["token_times"][index]    # times: after the first
        out.append({"tokens": decode["tokens"][index],
                    **request_times(request.arrival, first, times[-1] if times else first, len(times) + 1),
                    "arrival": request.arrival,
                    "prefill_from": prefill["prefill_from"][index], "first_token": first,
                    "received": decode["received_at"][index], "seated": decode["seated_at"][index]})
    return {"requests": out, "handovers": decode["handovers"]}


def colocated_rows(result) -> list[dict]:
    """The same per-request figures from one engine's `ServingResult` (wall clock).
    Notebook 10 (past one device)."""
    rows = []
    for seq in sorted(result.sequences, key=lambda s: s.index):
        rows.append({"tokens": list(seq.output), **request_times(seq.request.arrival, seq.first_token_at,
                                                                 seq.token_times[-1], len(seq.token_times))})
    return rows


def compare_with_colocated(model, requests: list, slots: int = 4, token_budget: int = 32,
                           ttft_slo: float = 1.0, tpot_slo: float = 0.2, cores: int = 2) -> dict:
    """The same requests served two ways on the same `cores`: disaggregated (a prefill rank and a
    decode rank, one thread each) and colocated (one engine, `cores` threads, chunked prefill
    under `token_budget`). Notebook 10 (past one device). Returns each design's per-request
    rows, their TTFT and TPOT medians, goodput under the objectives, the handovers, and
    whether every request got the same tokens both ways. Every argument is checked before
    anything is served (`require_workload`, the objectives > 0, `cores` at most this machine's)."""
    requests, slots, _, _ = require_workload(model, requests, slots)
    require_batch_limits(slots, token_budget)
    for value, name in ((ttft_slo, "ttft_slo (seconds)"), (tpot_slo, "tpot_slo (seconds per token)")):
        finite_number(value, name, minimum=0, above_minimum=True)
    cores = whole_number(cores, "cores (threads of the colocated engine)", maximum=os.cpu_count() or 1)
    ids = [r.request_id for r in requests if r.request_id is not None]
    if any(ids.count(i) > 1 for i in ids):
        raise LabError("Two requests share a request_id; give every request its own (the engine keys results by it).")
    # the engine's default cache (1,024 positions a slot) grown to the longest request, so that it refuses none
    cache_tokens = max(slots * min(model.config.max_position, 1024), max(r.max_length for r in requests))
    disaggregated = serve_disaggregated(model, requests, slots)
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        engine = Engine(model, max_slots=slots, token_budget=token_budget, cache_tokens=cache_tokens)
        colocated = colocated_rows(engine.run(requests))
    finally:
        torch.set_num_threads(threads)
    out = {"requests": len(requests), "slots": slots, "token_budget": token_budget}
    for name, rows in (("disaggregated", disaggregated["requests"]), ("colocated", colocated)):
        out[name] = {"ttft_p50": statistics.median(r["ttft"] for r in rows),
                     "tpot_p50": statistics.median(r["tpot"] for r in rows),
                     **goodput(rows, ttft_slo, tpot_slo), "rows": rows}
    handovers = disaggregated["handovers"]
    out["handover"] = {"count": len(handovers), "bytes_per_request": statistics.mean(h["bytes"] for h in handovers),
                       "seconds_per_request": statistics.median(h["seconds"] for h in handovers)}
    out["same_tokens"] = all(a["tokens"] == b["tokens"] for a, b in zip(disaggregated["requests"], colocated))
    return out
