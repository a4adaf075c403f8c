"""Disaggregated prefill and decode: one process only prefills, another only decodes, and every
finished prefill hands its KV cache over.

Introduced in notebook 10 (past one device).

Two ranks of one thread each, joined by `torch.distributed` (gloo over 127.0.0.1), share the
clock of the machine (`time.monotonic` is system-wide):

* rank 0, the prefill worker, takes the requests in order of arrival. It waits for each to
  arrive, prefills its prompt alone through a paged cache, and picks the first token (greedy).
  That is the request's first token, so its time to first token ends here. Then it sends the
  prompt's keys and values to rank 1 without waiting for it (`isend`): a header (which request,
  how many positions, the first token) and one tensor of (2, layers, positions, kv_heads,
  head_dim). Rank 1 records each handover's bytes and the seconds its receive took.
* rank 1, the decode worker, runs continuous batching over decodes only. A receiver thread takes
  each handover as it lands. Between two steps the decode loop seats whatever has arrived, so a
  step never waits for a prefill. It writes each cache into its own paged pool through the
  request's block table, and seats the request in a free slot. A step decodes every seated request by one token.

`compare_with_colocated` serves the same requests with one engine on the same two cores, with
chunked prefill, and judges both by goodput: the requests per second that met both service-level
objectives (time to first token and time per output token).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time

import torch

from ..engine.parallel import run_ranks
from ..engine.serving import BlockManager, Engine, PagedKVCache, ServedSequence
from ..engine.serving.block_manager import blocks_needed
from ..engine.serving.model_runner import ModelRunner
from ..errors import LabError
from .serving_metrics import goodput, request_times

END = -1                                   # a header whose request index is END: no more requests


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
        first = int(runner.prefill(seq).argmax())
        first_token_at[index] = time.monotonic() - start
        slots = _slots(cache, blocks, index, T)
        kv = torch.stack([cache.keys[:, slots], cache.values[:, slots]])   # (2, layers, T, kv_heads, D)
        header, kv = torch.tensor([index, T, first]), kv.contiguous()
        # sent without waiting (isend): the next prompt's prefill need not wait for the decode worker to take this one
        in_flight += [(header, torch.distributed.isend(header, dst=1)), (kv, torch.distributed.isend(kv, dst=1))]
        blocks.release(index)
    torch.distributed.send(torch.tensor([END, 0, 0]), dst=1)
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
    header = torch.zeros(3, dtype=torch.long)
    while True:
        torch.distributed.recv(header, src=0)
        index, T, first = header.tolist()
        if index == END:
            arrived.put(None)
            return
        kv = torch.empty(2, config.num_layers, T, config.num_kv_heads, config.head_dim, dtype=dtype)
        began = time.perf_counter()
        torch.distributed.recv(kv, src=0)
        arrived.put({"index": index, "T": T, "first": first, "kv": kv, "bytes": kv.nbytes,
                     "seconds": time.perf_counter() - began, "received_at": time.monotonic() - start})


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
            waiting.append((handover["index"], handover["T"], handover["first"], handover["kv"]))
        while waiting and len(running) < slots:
            index, T, first, kv = waiting.pop(0)
            seq = ServedSequence(requests[index], index, model.device)
            blocks.grow(index, T + 1)
            positions = _slots(cache, blocks, index, T)
            cache.keys[:, positions], cache.values[:, positions] = kv[0], kv[1]
            seq.num_cached, seq.output = T, [first]
            token_times[index] = []
            seated_at[index] = time.monotonic() - start
            running.append(seq)
        finished = [s for s in running if len(s.output) >= s.request.max_new_tokens]
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
        for seq, token in zip(running, logits.argmax(dim=-1).tolist()):
            seq.num_cached += 1                              # this worker is its own scheduler
            seq.output.append(token)
            token_times[seq.index].append(now)
    return {"tokens": done, "token_times": token_times, "handovers": handovers, "received_at": received_at,
            "seated_at": seated_at}


def _rank(rank: int, world: int, model, requests, slots: int, block_size: int) -> dict:
    start = torch.tensor([time.monotonic() + 0.5], dtype=torch.float64)  # both begin half a second from now
    torch.distributed.broadcast(start, src=0)
    with torch.inference_mode():
        if rank == 0:
            return _prefill_worker(model, requests, float(start), block_size)
        return _decode_worker(model, requests, float(start), slots, block_size)


def serve_disaggregated(model, requests: list, slots: int = 4, block_size: int = 16, timeout: float = 600.0) -> dict:
    """Serve `requests` (`Request`s with arrival times, greedy, every answer its full length) on a
    prefill rank and a decode rank, one thread each. Notebook 10 (past one device).

    Returns, per request (in the order given): its tokens, its time to first token, its time per
    output token, and its timeline in seconds from the start (arrival, prefill from, first token,
    cache received, seated, finished); and every handover's bytes and seconds."""
    if not requests:
        raise LabError("serve_disaggregated needs at least one request.")
    if any(r.max_new_tokens < 2 for r in requests):
        raise LabError("Every request needs max_new_tokens of 2 or more: the decode worker makes the tokens after "
                       "the first.")
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
    whether every request got the same tokens both ways."""
    disaggregated = serve_disaggregated(model, requests, slots)
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        colocated = colocated_rows(Engine(model, max_slots=slots, token_budget=token_budget).run(requests))
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
