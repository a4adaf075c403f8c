"""Notebook 09's section (``http_serving``, only when named): what HTTP and streaming cost, and
how our server compares with llama.cpp's and vLLM's, on one workload at a few arrival rates.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport bench --sections http_serving``.
The same seeded chat workload (`lab.loadgen.chat_workload`) is served at each arrival rate
(fractions of the rate the in-process engine saturates at, `load_curve.saturation_rate`) by:

* the in-process engine (`Engine.run`: no sockets, no JSON, no tokenizer on the way out);
* our HTTP server (`labsupport.serve`, same engine settings), through the load generator;
* llama.cpp's own OpenAI-compatible server (`llama_cpp.server`, same GGUF) where
  ``llama-cpp-python[server]`` is installed, and vLLM's server on a CUDA GPU where vLLM is;
  a peer that cannot run has one row saying why.

Each server gets the same client and the same requests, one server after the other at each
rate; peers run in their own processes on 127.0.0.1 and are stopped at the end. The sizes
are `workloads.HTTP_SERVING_PRESETS`, this section's options `HttpServingOptions`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

import torch

from ..engine.serving.engine import Engine
from ..errors import LabError
from ..lab.load_curve import engine_row, saturation_rate
from ..lab.loadgen import as_engine_requests, chat_workload, load_test
from ..lab.measure import VLLM_GRAPHED, mark_graphed
from ..lab.workloads import HTTP_SERVING_PRESETS, HttpServingSizes
from .core import BenchContext, reported
from .options import SectionOptions, count, counts

KEYS = ("throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50")


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

    def check(self) -> None:
        if self.median_new_tokens > self.max_new_tokens:
            self.refuse(f"median_new_tokens ({self.median_new_tokens}) must be at most max_new_tokens "
                        f"({self.max_new_tokens}).")

    @classmethod
    def gpu_sizes(cls) -> dict:
        return asdict(HTTP_SERVING_PRESETS["gpu"])


def _row(server: str, rate: float, figures: dict | None = None, skipped: str | None = None) -> dict:
    nan = float("nan")
    figures = figures or {}
    return {"server": server, "rate": rate, "skipped": skipped, "errors": figures.get("errors", 0),
            "tokens": figures.get("tokens", 0), "decode_path": figures.get("decode_path"),
            **{k: figures.get(k, nan) for k in KEYS}}


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


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def peer_server(command: list[str], port: int, timeout: float):
    """A peer's server as a subprocess on 127.0.0.1:`port`, ready once /v1/models answers; stopped
    at the end. Raises LabError (one sentence, with the tail of its log) if it does not come up.
    Notebook 09 (serving over HTTP)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                    why = "exited" if process.poll() is not None else f"did not answer within {timeout:.0f} s"
                    raise LabError(f"The server {why} ({tail[0][:160]}).")
                try:
                    if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def llamacpp_server_command(ctx: BenchContext, port: int) -> tuple[list[str] | None, str | None]:
    """The llama.cpp server's command line on the embedded model's GGUF, or (None, why not).
    Notebook 09 (serving over HTTP)."""
    from ..weights.loading import EMBEDDED
    from .llamacpp import llamacpp_unavailable
    if ctx.model_name != EMBEDDED:
        return None, f"llama.cpp serves the embedded model's GGUF file only; this run's model is {ctx.model_name}."
    if ctx.device.type != "cpu":
        return None, "the llama.cpp peer is measured on a CPU run only (its wheel here is built for the CPU)."
    try:
        from ..weights.embedded import find_gguf
        gguf = find_gguf()
    except LabError as error:
        return None, str(error)
    reason = llamacpp_unavailable(gguf)
    if reason is None and importlib.util.find_spec("sse_starlette") is None:
        reason = "llama-cpp-python's server extra is not installed (pip install \"llama-cpp-python[server]\")."
    if reason is not None:
        return None, reason
    threads = str(torch.get_num_threads())
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
            str(port), "--n_ctx", "2048", "--n_threads", threads, "--n_threads_batch", threads,
            "--model_alias", ctx.model_name,
            "--interrupt_requests", "false"], None      # its default drops a stream when the next request comes


def vllm_server_command(ctx: BenchContext, port: int, slots: int) -> tuple[list[str] | None, str | None]:
    """vLLM's OpenAI-compatible server on the same weights (a CUDA GPU with vllm installed), or
    (None, why not). Notebook 09 (serving over HTTP)."""
    from ..weights.loading import resolve_hf_source
    from .serving_peers import vllm_skip_reason
    reason = vllm_skip_reason(ctx.device)
    if reason is not None:
        return None, reason
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_hf_source(ctx.model_name),
            "--served-model-name", ctx.model_name, "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(slots), "--dtype", "float32", "--gpu-memory-utilization", "0.5", "--seed", "0"], None


def http_load_curve(model, tokenizer, model_name: str, rates: list[float], sizes: "HttpServingSizes | HttpServingOptions",
                    peers: dict | None = None, seed: int = 0, progress=None) -> list[dict]:
    """Serve one seeded chat workload at each rate with the in-process engine, our HTTP server
    and each peer; one row per (server, rate) with the `load_curve` figures and the errors.

    Introduced in notebook 09 (serving over HTTP). peers: name -> (url, extra body fields)
    of servers already running, or name -> the reason it is not (a row with "skipped")."""
    from ..serve import BackgroundServer, create_app         # here: importing the bench needs no web server

    workloads = {rate: chat_workload(sizes.requests, rate, sizes.median_new_tokens, max_new_tokens=sizes.max_new_tokens,
                                     seed=seed) for rate in rates}
    longest = max(r.max_length for r in as_engine_requests(tokenizer, workloads[rates[0]]))
    settings = dict(max_slots=sizes.slots, cache_tokens=sizes.slots * longest)
    app = create_app(model, tokenizer, model_name, max_waiting=sizes.requests, **settings)
    rows = []
    in_process = Engine(model, **settings)              # made once: a GPU engine captures its graphs here
    served_path = app.state.engine.decode_path
    with BackgroundServer(app) as ours:
        for rate in rates:
            if progress is not None:
                progress(f"[http_serving] {rate:.2f} requests/s")
            result = in_a_thread(in_process.run, as_engine_requests(tokenizer, workloads[rate]))
            rows.append(_row("in-process engine", rate, {**engine_row(result),
                                                         "tokens": sum(len(s.output) for s in result.sequences)}))
            rows.append(_row("our HTTP server", rate, {**load_test(ours.url, workloads[rate], model=model_name),
                                                       "decode_path": served_path}))
            for name, peer in (peers or {}).items():
                if isinstance(peer, str):
                    rows.append(_row(name, rate, skipped=peer))
                else:
                    url, extra = peer
                    rows.append(_row(name, rate, load_test(url, workloads[rate], model=model_name, extra=extra)))
    app.state.engine.blocks.assert_no_leaks()
    return rows


def _ratio(rows, a: str, b: str, key: str, rate: float) -> float:
    pick = {r["server"]: r for r in rows if r["rate"] == rate}
    if a not in pick or b not in pick or pick[b]["skipped"] or pick[a]["skipped"]:
        return float("nan")
    return pick[a][key] / pick[b][key]


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
    commands = {"llama.cpp server": llamacpp_server_command(ctx, _free_port()),
                "vLLM server": vllm_server_command(ctx, _free_port(), sizes.slots)}
    peers: dict = {}
    eos = {str(tok.eos_token_id): -100} if getattr(tok, "eos_token_id", None) is not None else {}
    with ExitStack() as running:                          # every peer's server stops at the end
        for name, (command, reason) in commands.items():
            if command is None:
                peers[name] = reason
                continue
            try:
                url = running.enter_context(peer_server(command, int(command[command.index("--port") + 1]),
                                                        timeout=600 if name.startswith("vLLM") else 120))
                # llama.cpp's server has no ignore_eos: a bias that forbids the end token does the same
                peers[name] = (url, {"logit_bias": eos} if name.startswith("llama") else {})
            except LabError as error:
                peers[name] = f"{name} could not start: {error}"
        rows = http_load_curve(model, tok, ctx.model_name, rates, sizes, peers)
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
    for name in commands:
        reason = peers[name] if isinstance(peers[name], str) else None
        figures.append(reported(f"http serving: our HTTP server / {name} throughput at the highest rate",
                                _ratio(rows, http, name, "throughput", high), "x",
                                note=reason or f"same client, same requests; {name} errors: "
                                               f"{sum(r['errors'] for r in rows if r['server'] == name)}"
                                               + ("; llama-cpp-python's server runs one request at a time (no "
                                                  "batching), so its queue grows with the load"
                                                  if name.startswith("llama") else "")))
    # on a GPU, a figure from a run that was not replayed CUDA graphs is a failed measurement
    ours = [r["decode_path"] for r in rows if r["server"] in (inproc, http)]
    for figure in figures:
        peer = [VLLM_GRAPHED] if "vLLM" in figure["name"] else []
        mark_graphed(figure, ours + peer, ctx.device)
    return {"slots": sizes.slots, "requests": sizes.requests, "saturation_rate": saturation, "rates": rates,
            "loads": list(sizes.loads), "rows": rows,
            "peers": {name: (p if isinstance(p, str) else None) for name, p in peers.items()}, "figures": figures}
