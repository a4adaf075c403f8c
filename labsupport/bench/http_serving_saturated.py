"""Notebook 09's saturated comparison: many requests at once, our server as a process against llama-server.

Introduced in notebook 09 (serving over HTTP); part of ``python -m labsupport bench --sections
http_serving``. The load curve (`http_serving.http_load_curve`) serves our server from a thread of
the bench's own process, as a notebook must. Here our server runs as ``python -m labsupport serve``
runs it: a process of its own, whose engine steps in the thread that loaded the model. llama-server
is a process too, so the two are compared like for like: the same slots, threads and client, one
server at a time. Every request arrives at once, so the queue is full from the start: throughput
says which server saturates higher, and the time to first token how long the queue waits.
"""

from __future__ import annotations

import sys

import torch

from ..errors import LabError
from ..lab.http_serving_loadgen import chat_workload, load_test
from .core import reported
from .http_serving_agentic import serving_row
from .peers.http_servers import LLAMA_SERVER, free_port, peer_server

OUR_PROCESS = "our server process"


def our_server_command(model_name: str, device, port: int, slots: int, requests: int, int4: bool) -> list[str]:
    """`python -m labsupport serve` for the embedded model: `slots` slots, room for every request
    to wait, int4 weights (notebook 04's W4A8 kernel) where `int4`. Notebook 09."""
    return [sys.executable, "-m", "labsupport", "serve", "--model", model_name, "--device", torch.device(device).type,
            "--port", str(port), "--max-slots", str(slots), "--max-waiting", str(requests), "--log-level", "warning",
            *(["--quantize", "int4"] if int4 else [])]


def saturated_rows(model_name: str, device, sizes, llama_server) -> list[dict]:
    """`sizes.saturated_requests` chat requests at once (median `sizes.saturated_median_tokens` new
    tokens), served by our server's process, then by llama-server where it runs (`llama_server`:
    (url, extra body fields, precision) as `http_servers.llama_server_peer` gives it, or why not).
    One row each, rate None; a server that cannot run has a row saying why. Notebook 09."""
    median = sizes.saturated_median_tokens
    workload = chat_workload(sizes.saturated_requests, None, median, max_new_tokens=4 * median, seed=0)
    precision = "int4 weights, W4A8 kernel" if sizes.int4_server else "float32 weights"
    command = our_server_command(model_name, device, free_port(), sizes.slots, sizes.saturated_requests,
                                 sizes.int4_server)
    try:
        with peer_server(command, int(command[command.index("--port") + 1]), timeout=300) as url:
            rows = [serving_row(OUR_PROCESS, None, load_test(url, workload, model=model_name), precision=precision)]
    except LabError as error:
        rows = [serving_row(OUR_PROCESS, None, skipped=f"our server could not start: {error}")]
    if isinstance(llama_server, str):
        return rows + [serving_row(LLAMA_SERVER, None, skipped=llama_server)]
    url, extra, words = llama_server
    return rows + [serving_row(LLAMA_SERVER, None, load_test(url, workload, model=model_name, extra=extra),
                               precision=words)]


def saturated_figures(rows: list[dict], sizes) -> list[dict]:
    """Our server's process / llama-server, all requests at once: throughput, TTFT p50 and ITL p50,
    each a ratio (nan with the reason where either did not run). Notebook 09."""
    by = {r["server"]: r for r in rows}
    ours, theirs = by[OUR_PROCESS], by[LLAMA_SERVER]
    reason = ours["skipped"] or theirs["skipped"]
    figures = []
    for key, unit, scale, better in (("throughput", "tokens/s", 1, True), ("ttft_p50", "ms", 1e3, False),
                                     ("itl_p50", "ms", 1e3, False)):
        ratio = float("nan") if reason else ours[key] / theirs[key]
        note = reason or (f"{ours[key] * scale:.1f} against {theirs[key] * scale:.1f} {unit}; "
                          f"{sizes.saturated_requests} requests at once, {sizes.slots} slots; "
                          f"errors {ours['errors']} and {theirs['errors']}")
        figures.append(reported(f"http serving, saturated: our server process ({ours['precision'] or 'not run'}) / "
                                f"llama-server, {key.replace('_', ' ')}", ratio, "x", higher_is_better=better,
                                note=note))
    return figures
