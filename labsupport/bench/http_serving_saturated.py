"""Notebook 09's server process, and the saturated comparison: many requests at once, our server
as a process against llama-server.

Introduced in notebook 09 (serving over HTTP); part of ``python -m labsupport bench --sections
http_serving``. A notebook serves our server from a thread of its own process (`BackgroundServer`),
whose engine thread starts PyTorch's CPU thread pool cold (README, "engines"). The bench runs it as
``python -m labsupport serve`` runs it (`our_server_peer`): a process of its own, whose engine steps
in the thread that loaded the model. llama-server is a process too, so the two are compared like for
like: the same slots, threads and client, one server at a time. The load curve's int4 rows and the
saturated run use that process. In the saturated run every request arrives at once, so the queue is
full from the start: throughput says which server saturates higher, and the time to first token how
long the queue waits.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack

import torch

from ..lab.http_serving_loadgen import chat_workload, load_test
from .core import reported
from .http_serving_agentic import serving_row
from .peers.http_servers import LLAMA_SERVER, free_port, start_peer

OUR_PROCESS = "our server process"


def our_server_command(model_name: str, device, port: int, slots: int, requests: int, int4: bool,
                       cache_tokens: int | None = None) -> list[str]:
    """`python -m labsupport serve` for the embedded model: `slots` slots, room for `requests` to
    wait, a KV cache of `cache_tokens` (the server's default where None), int4 weights (notebook 04's
    W4A8 kernel) where `int4`. Notebook 09."""
    return [sys.executable, "-m", "labsupport", "serve", "--model", model_name, "--device", torch.device(device).type,
            "--port", str(port), "--max-slots", str(slots), "--max-waiting", str(requests), "--log-level", "warning",
            *(["--cache-tokens", str(cache_tokens)] if cache_tokens else []), *(["--quantize", "int4"] if int4 else [])]


def our_server_peer(running: ExitStack, model_name: str, device, slots: int, requests: int, int4: bool,
                    cache_tokens: int | None = None):
    """Our server as a process (`our_server_command`), running for the rest of `running` (an
    ExitStack): (url, extra body fields, precision) as the load curve's peers take it, or the
    sentence saying why it could not start. Notebook 09."""
    import httpx
    from ..serve.precision import precision_words
    command = our_server_command(model_name, device, free_port(), slots, requests, int4, cache_tokens)
    url, failed = start_peer(running, command, "our server", timeout=300)
    if url is None:
        return failed
    # the precision the server says it serves (on a CPU without the W4A8 kernel, int4 runs aten's)
    served = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["precision"]
    return url, {}, precision_words(served)


def saturated_rows(model_name: str, sizes, ours, llama_server) -> list[dict]:
    """`sizes.saturated_requests` chat requests at once (median `sizes.saturated_median_tokens` new
    tokens), served by our server's process (`ours`, as `our_server_peer` gives it), then by
    llama-server where it runs (`llama_server`, as `http_servers.llama_server_peer` gives it). One row
    each, rate None; a server that cannot run has a row saying why. Notebook 09."""
    median = sizes.saturated_median_tokens
    workload = chat_workload(sizes.saturated_requests, None, median, max_new_tokens=4 * median, seed=0)
    rows = []
    for name, peer in ((OUR_PROCESS, ours), (LLAMA_SERVER, llama_server)):
        if isinstance(peer, str):
            rows.append(serving_row(name, None, skipped=peer))
        else:
            url, extra, words = peer
            rows.append(serving_row(name, None, load_test(url, workload, model=model_name, extra=extra),
                                    precision=words))
    return rows


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
