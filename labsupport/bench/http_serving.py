"""Notebook 09's section (``http_serving``, only when named): what HTTP and streaming cost, and
how our server compares with llama.cpp's and vLLM's, on one workload at a few arrival rates.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport bench --sections http_serving``.
The same seeded chat workload (`lab.http_serving_loadgen.chat_workload`) is served at each arrival rate
(fractions of the rate the in-process engine saturates at, `load_curve.saturation_rate`) by:

* the in-process engine (`Engine.run`: no sockets, no JSON, no tokenizer on the way out);
* our HTTP server (`labsupport.serve`, same engine settings), through the load generator: in
  fp32 from a thread of this process (`BackgroundServer`, as a notebook serves it), and (on a CPU)
  with int4 weights (notebook 04's W4A8 kernel) as ``python -m labsupport serve --quantize int4``
  runs it, a process of its own (`http_serving_saturated.our_server_peer`) like llama-server's;
* llama.cpp's C++ server (`llama-server`: continuous batching, the same slots and threads, the
  embedded model's Q4_1 GGUF) where it is built (README: "llama-server, offline"), and
  llama-cpp-python's server (`llama_cpp.server`, one request at a time) where
  ``llama-cpp-python[server]`` is installed, and vLLM's server on a CUDA GPU where vLLM is;
  a peer that cannot run has one row saying why.

Every row says what precision served it (``precision``), so that no ratio mixes them unsaid.

Then the saturated comparison (`http_serving_saturated`): many requests at once, the same server
process against llama-server.

Each server gets the same client and the same requests, one server after the other at each
rate; peers run in their own processes on 127.0.0.1 and are stopped at the end. The sizes
are `workloads.HTTP_SERVING_PRESETS`, this section's options `HttpServingOptions`.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import torch

from ..engine.serving.engine import Engine
from ..lab.load_curve import engine_row, saturation_rate
from ..lab.http_serving_loadgen import as_engine_requests, chat_workload, load_test
from ..lab.measure import VLLM_GRAPHED, mark_graphed
from ..lab.workloads import HTTP_SERVING_PRESETS, HttpServingSizes
from .core import BenchContext, reported
from .http_serving_agentic import agentic_figures, quality_figures, agentic_serving, served_quality, serving_row
from .peers.http_servers import (LLAMA_SERVER, LLAMA_SERVER_PRECISION, free_port, llama_server_peer, start_peer,
                         llamacpp_server_command, vllm_server_command)
from .http_serving_saturated import our_server_peer, saturated_figures, saturated_rows
from .options import SectionOptions, count, counts, switch

INT4_SERVER = "our HTTP server (int4)"


@dataclass(frozen=True)
class HttpServingOptions(SectionOptions):
    """The section's options (`workloads.HTTP_SERVING_PRESETS` for the CPU and GPU sizes):
    requests per rate, batch slots, the answers' median and largest lengths, and the rates in
    percent of the in-process saturation rate. Notebook 09 (serving over HTTP)."""

    SECTION = "http_serving"
    requests: int = count(HTTP_SERVING_PRESETS["cpu"].requests)
    slots: int = count(HTTP_SERVING_PRESETS["cpu"].slots)
    median_new_tokens: int = count(HTTP_SERVING_PRESETS["cpu"].median_new_tokens)
    max_new_tokens: int = count(HTTP_SERVING_PRESETS["cpu"].max_new_tokens)
    loads: tuple[int, ...] = counts(HTTP_SERVING_PRESETS["cpu"].loads)
    int4_server: bool = switch(HTTP_SERVING_PRESETS["cpu"].int4_server)
    conversations: int = count(HTTP_SERVING_PRESETS["cpu"].conversations)
    turns: int = count(HTTP_SERVING_PRESETS["cpu"].turns)
    system_chars: int = count(HTTP_SERVING_PRESETS["cpu"].system_chars)
    ttft_slo_ms: int = count(HTTP_SERVING_PRESETS["cpu"].ttft_slo_ms)
    tpot_slo_ms: int = count(HTTP_SERVING_PRESETS["cpu"].tpot_slo_ms)
    # the saturated comparison (`http_serving_saturated`): requests at once, their median answer
    saturated_requests: int = count(32)
    saturated_median_tokens: int = count(32)

    def check(self) -> None:
        if self.median_new_tokens > self.max_new_tokens:
            self.refuse(f"median_new_tokens ({self.median_new_tokens}) must be at most max_new_tokens "
                        f"({self.max_new_tokens}).")

    @classmethod
    def gpu_sizes(cls) -> dict:
        gpu = HTTP_SERVING_PRESETS["gpu"]
        return {**asdict(gpu), "saturated_requests": 8 * gpu.slots}       # 8 requests per slot, as on a CPU


def in_a_thread(fn, *args):
    """fn(*args) run in a new thread, its result returned (its exception raised here).

    Introduced in notebook 09 (serving over HTTP). The server's engine steps in a thread of
    its own, so the in-process engine it is compared with runs in one too: PyTorch's CPU
    thread pools do not behave alike on the main thread and on others (on a busy 2-core
    machine here the same engine run took several times longer on the main thread), and a
    comparison must not measure that difference."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn(*args)
        except BaseException as error:        # noqa: BLE001 - handed back to the caller
            out["error"] = error
    thread = threading.Thread(target=target, name="labsupport-in-process")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def http_load_curve(model, tokenizer, model_name: str, rates: list[float], sizes: "HttpServingSizes | HttpServingOptions",
                    peers: dict | None = None, seed: int = 0, progress=None) -> list[dict]:
    """Serve one seeded chat workload at each rate with the in-process engine, our HTTP server
    and each peer; one row per (server, rate) with the `load_curve` figures, the errors and the
    precision that served it.

    Introduced in notebook 09 (serving over HTTP). peers: name -> (url, extra body fields,
    precision) of servers already running, or name -> the reason it is not (a row with
    "skipped"). Our int4 server is such a peer: a process of its own (`our_server_peer`)."""
    from ..serve import BackgroundServer, create_app         # here: importing the bench needs no web server
    from ..serve.app import default_token_budget
    from ..serve.precision import describe, precision_words

    workloads = {rate: chat_workload(sizes.requests, rate, sizes.median_new_tokens, max_new_tokens=sizes.max_new_tokens,
                                     seed=seed) for rate in rates}
    longest = max(r.max_length for r in as_engine_requests(tokenizer, workloads[rates[0]]))
    settings = dict(max_slots=sizes.slots, cache_tokens=sizes.slots * longest,        # the server's default budget
                    token_budget=default_token_budget(model, sizes.slots))            # in process too: like for like
    app = create_app(model, tokenizer, model_name, max_waiting=sizes.requests, **settings)
    precision = precision_words(describe(app.state.engine.model))
    rows = []
    in_process = Engine(model, **settings)              # made once: a GPU engine captures its graphs here
    with ExitStack() as running:                        # our server idles (its engine thread asleep) in turn
        ours = running.enter_context(BackgroundServer(app))
        for rate in rates:
            if progress is not None:
                progress(f"[http_serving] {rate:.2f} requests/s")
            result = in_a_thread(in_process.run, as_engine_requests(tokenizer, workloads[rate]))
            rows.append(serving_row("in-process engine", rate, {**engine_row(result),
                                                         "tokens": sum(len(s.output) for s in result.sequences)},
                             precision=precision))
            rows.append(serving_row("our HTTP server", rate, {**load_test(ours.url, workloads[rate], model=model_name),
                                                       "decode_path": app.state.engine.decode_path},
                             precision=precision))
            for name, peer in (peers or {}).items():
                if isinstance(peer, str):
                    rows.append(serving_row(name, rate, skipped=peer))
                else:
                    url, extra, words = peer
                    rows.append(serving_row(name, rate, load_test(url, workloads[rate], model=model_name, extra=extra),
                                     precision=words))
    app.state.engine.blocks.assert_no_leaks()
    return rows


def rows_precision(rows: list[dict], server: str) -> str:
    """The precision `server`'s rows say served them ("" if none did). Notebook 09."""
    return next((r["precision"] for r in rows if r["server"] == server and r["precision"]), "")


def _ratio(rows, a: str, b: str, key: str, rate: float) -> float:
    pick = {r["server"]: r for r in rows if r["rate"] == rate}
    if a not in pick or b not in pick or pick[b]["skipped"] or pick[a]["skipped"]:
        return float("nan")
    return pick[a][key] / pick[b][key]


def _int4_against_llama_server(rows: list[dict], peer, low: float, high: float) -> list[dict]:
    """Our int4 server against llama-server (4-bit weights both): throughput at the highest
    rate, time to first token and inter-token latency (p50 and p99) at the lowest; each a ratio
    ours / theirs (nan with the reason where llama-server did not run). Notebook 09."""
    reason = peer if isinstance(peer, str) else None
    figures = []
    for key, rate, better in (("throughput", high, True), ("ttft_p50", low, False), ("ttft_p99", low, False),
                              ("itl_p50", low, False), ("itl_p99", low, False)):
        pick = {r["server"]: r for r in rows if r["rate"] == rate}
        words = (f"{pick[INT4_SERVER][key] * (1 if key == 'throughput' else 1e3):.1f} against "
                 f"{pick[LLAMA_SERVER][key] * (1 if key == 'throughput' else 1e3):.1f} "
                 f"{'tokens/s' if key == 'throughput' else 'ms'} at {rate:.2f} requests/s; errors "
                 f"{pick[INT4_SERVER]['errors']} and {pick[LLAMA_SERVER]['errors']}"
                 if reason is None and LLAMA_SERVER in pick and INT4_SERVER in pick else reason)
        figures.append(reported(f"http serving: our int4 HTTP server / llama-server, {key.replace('_', ' ')} at "
                                f"the {'highest' if rate == high else 'lowest'} rate",
                                _ratio(rows, INT4_SERVER, LLAMA_SERVER, key, rate), "x", higher_is_better=better,
                                note=words))
    return figures


PEERS = {LLAMA_SERVER: LLAMA_SERVER_PRECISION, "llama.cpp server": LLAMA_SERVER_PRECISION,   # name -> precision
         "vLLM server": "float32 weights"}


def _start_peers(running: ExitStack, ctx: BenchContext, slots: int, context: int, tok) -> dict:
    """Each of `PEERS` started for the rest of `running` (an ExitStack): name -> (url, extra body
    fields, precision), or the sentence saying why it is not running. Notebook 09."""
    peers = {LLAMA_SERVER: llama_server_peer(running, ctx.model_name, ctx.device, slots, context)}
    commands = {"llama.cpp server": llamacpp_server_command(ctx, free_port()),
                "vLLM server": vllm_server_command(ctx, free_port(), slots)}
    eos = {str(tok.eos_token_id): -100} if getattr(tok, "eos_token_id", None) is not None else {}
    for name, (command, reason) in commands.items():
        if command is None:
            peers[name] = reason
            continue
        url, failed = start_peer(running, command, name, timeout=600 if name.startswith("vLLM") else 120)
        # llama-cpp-python's server has no ignore_eos: a bias that forbids the end token does the same
        peers[name] = failed if url is None else (url, {"logit_bias": eos} if name == "llama.cpp server" else {},
                                                  PEERS[name])
    return peers


def section_http_serving(ctx: BenchContext, options: HttpServingOptions) -> dict:
    """Our HTTP server beside the in-process engine, llama.cpp's server and vLLM's, at a few
    arrival rates; the figures: what HTTP costs (TTFT, ITL, throughput) and the peers' ratios.
    Introduced in notebook 09 (serving over HTTP). Its options: `HttpServingOptions`."""
    model, tok = ctx.model(torch.float32)
    sizes = options
    base = as_engine_requests(tok, chat_workload(sizes.requests, None, sizes.median_new_tokens,
                                                 max_new_tokens=sizes.max_new_tokens))
    saturation = in_a_thread(saturation_rate, model, base, sizes.slots)
    rates = [saturation * p / 100 for p in sizes.loads]
    longest = max(r.max_length for r in base)
    with ExitStack() as running:                          # every peer's server stops at the end
        peers = _start_peers(running, ctx, sizes.slots, max(512, 2 * longest), tok)
        # our server as a process (int4 on a CPU, beside llama-server's Q4_1), for the saturated run and
        # the int4 rows; the fp32 rows serve from this process's thread, beside the in-process engine
        # (its KV cache as large as llama-server's)
        our_process = our_server_peer(running, ctx.model_name, ctx.device, sizes.slots,
                                      max(sizes.requests, sizes.saturated_requests), sizes.int4_server,
                                      cache_tokens=sizes.slots * max(512, 2 * longest))
        curve_peers = {**({INT4_SERVER: our_process} if sizes.int4_server else {}), **peers}
        rows = http_load_curve(model, tok, ctx.model_name, rates, sizes, curve_peers)
        saturated = saturated_rows(ctx.model_name, sizes, our_process, peers[LLAMA_SERVER])
    low, high = rates[0], rates[-1]
    inproc, http = "in-process engine", "our HTTP server"
    at = {r["server"]: r for r in rows if r["rate"] == low}
    figures = [
        reported("http serving: time to first token p50, HTTP server / in-process", _ratio(rows, http, inproc,
                 "ttft_p50", low), "x", higher_is_better=False,
                 note=f"{at[http]['ttft_p50'] * 1e3:.0f} ms over HTTP vs {at[inproc]['ttft_p50'] * 1e3:.0f} ms in "
                      f"process at {low:.2f} requests/s ({sizes.loads[0]}% of saturation)"),
        reported("http serving: inter-token latency p50, HTTP server / in-process", _ratio(rows, http, inproc,
                 "itl_p50", low), "x", higher_is_better=False,
                 note=f"{at[http]['itl_p50'] * 1e3:.1f} ms vs {at[inproc]['itl_p50'] * 1e3:.1f} ms"),
        reported("http serving: throughput at the highest rate, HTTP server / in-process",
                 _ratio(rows, http, inproc, "throughput", high), "x", target=0.9,
                 note=f"at {high:.2f} requests/s ({sizes.loads[-1]}% of the in-process saturation rate, "
                      f"{saturation:.2f} requests/s; {sizes.slots} slots, {sizes.requests} requests per rate); "
                      f"errors over HTTP: {sum(r['errors'] for r in rows if r['server'] == http)}"),
    ]
    if sizes.int4_server:                                 # the like-for-like pair: 4-bit weights both
        figures += _int4_against_llama_server(rows, peers[LLAMA_SERVER], low, high)
    for name in PEERS:
        reason = peers[name] if isinstance(peers[name], str) else None
        figures.append(reported(f"http serving: our HTTP server / {name} throughput at the highest rate",
                                _ratio(rows, http, name, "throughput", high), "x",
                                note=reason or f"same client, same requests; {rows_precision(rows, http)} against "
                                               f"{PEERS[name]}; {name} errors: "
                                               f"{sum(r['errors'] for r in rows if r['server'] == name)}"
                                               + ("; llama-cpp-python's server runs one request at a time (no "
                                                  "batching), so its queue grows with the load"
                                                  if name == "llama.cpp server" else "")))
    figures += saturated_figures(saturated, sizes)
    agentic = agentic_serving(model, tok, ctx.model_name, sizes, rate=low)
    figures += agentic_figures(agentic, sizes)
    quality = served_quality(ctx.variants, tok, ctx.model_name)       # untimed: scores, not speed
    scores = quality_figures(quality)
    # on a GPU, a figure from a run that was not replayed CUDA graphs is a failed measurement
    ours = [r["decode_path"] for r in rows + agentic if r["server"] in (inproc, http) or r in agentic]
    for figure in figures:
        peer = [VLLM_GRAPHED] if "vLLM" in figure["name"] else []
        mark_graphed(figure, ours + peer, ctx.device)
    return {"slots": sizes.slots, "requests": sizes.requests, "saturation_rate": saturation, "rates": rates,
            "loads": list(sizes.loads), "rows": rows, "saturated": saturated,
            "peers": {name: (p if isinstance(p, str) else None) for name, p in peers.items()}, "agentic": agentic, "quality": quality,
            "figures": figures + scores}
