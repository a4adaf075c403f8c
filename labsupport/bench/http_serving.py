"""Notebook 09's section (``http_serving``, only when named): what HTTP and streaming cost, and
how our server compares with llama.cpp's and vLLM's, on one workload at a few arrival rates.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport bench --sections http_serving``.
The same seeded chat workload (`lab.loadgen.chat_workload`) is served at each arrival rate
(fractions of the rate the in-process engine saturates at, `load_curve.saturation_rate`) by:

* the in-process engine (`Engine.run`: no sockets, no JSON, no tokenizer on the way out);
* our HTTP server (`labsupport.serve`, same engine settings), through the load generator, in
  fp32 and (on a CPU) with int4 weights (``serve --quantize int4``: notebook 04's W4A8 kernel);
* llama.cpp's C++ server (`llama-server`: continuous batching, the same slots and threads, the
  embedded model's Q4_1 GGUF) where it is built (README: "llama-server, offline"), and
  llama-cpp-python's server (`llama_cpp.server`, one request at a time) where
  ``llama-cpp-python[server]`` is installed, and vLLM's server on a CUDA GPU where vLLM is;
  a peer that cannot run has one row saying why.

Every row says what precision served it (``precision``), so that no ratio mixes them unsaid.

Each server gets the same client and the same requests, one server after the other at each
rate; peers run in their own processes on 127.0.0.1 and are stopped at the end. The sizes
are `workloads.HTTP_SERVING_PRESETS`, this section's options `HttpServingOptions`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
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
from ..lab.loadgen import agentic_workload, as_engine_requests, chat_workload, goodput, load_test
from ..lab.measure import VLLM_GRAPHED, mark_graphed
from ..lab.workloads import HTTP_SERVING_PRESETS, HttpServingSizes
from .core import BenchContext, reported
from .options import SectionOptions, count, counts, switch

KEYS = ("throughput", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50")
LLAMA_SERVER, INT4_SERVER = "llama-server", "our HTTP server (int4)"


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

    def check(self) -> None:
        if self.median_new_tokens > self.max_new_tokens:
            self.refuse(f"median_new_tokens ({self.median_new_tokens}) must be at most max_new_tokens "
                        f"({self.max_new_tokens}).")

    @classmethod
    def gpu_sizes(cls) -> dict:
        return asdict(HTTP_SERVING_PRESETS["gpu"])


def _row(server: str, rate: float, figures: dict | None = None, skipped: str | None = None,
         precision: str | None = None) -> dict:
    nan = float("nan")
    figures = figures or {}
    return {"server": server, "rate": rate, "skipped": skipped, "precision": precision,
            "errors": figures.get("errors", 0),
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


LLAMA_SERVER_ENV = "LABSUPPORT_LLAMA_SERVER"     # the llama-server binary, where it is not on PATH


def llama_server_binary() -> tuple[str | None, str | None]:
    """llama.cpp's C++ server: (path, None), or (None, why not in one sentence): $LABSUPPORT_LLAMA_SERVER,
    else `llama-server` on PATH. Notebook 09 (serving over HTTP)."""
    given = os.environ.get(LLAMA_SERVER_ENV)
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            return None, f"{LLAMA_SERVER_ENV} points to {given}, which is not an executable file; fix or unset it."
        return given, None
    found = shutil.which("llama-server")
    if found is None:
        return None, (f"llama.cpp's llama-server is not built here (README: \"llama-server, offline\" builds it "
                      f"from llama-cpp-python's source; then put it on PATH or set {LLAMA_SERVER_ENV}).")
    return found, None


def llama_server_command(model_name: str, device, port: int, slots: int,
                         context: int) -> tuple[list[str] | None, str | None]:
    """llama.cpp's C++ server (continuous batching) on the embedded model's GGUF with `slots`
    slots of `context` positions each and torch's thread count, or (None, why not). Notebook 09."""
    from ..weights.loading import EMBEDDED
    if model_name != EMBEDDED:
        return None, f"llama.cpp serves the embedded model's GGUF file only; this run's model is {model_name}."
    if torch.device(device).type != "cpu":
        return None, "llama-server is measured on a CPU run only (the GPU's peer is vLLM)."
    binary, reason = llama_server_binary()
    if binary is None:
        return None, reason
    try:
        from ..weights.embedded import find_gguf
        gguf = find_gguf()
    except LabError as error:
        return None, str(error)
    threads = str(torch.get_num_threads())
    # --ctx-size is the whole KV cache, split evenly between the --parallel slots; --no-repack keeps
    # Q4_1 weights out of llama.cpp's AMX buffers, whose matmul segfaulted here on an AMX Xeon
    # (llama.cpp issue 20824; PR 16315: AMX gives wrong results for Q4_0/Q4_1); Q4_1 has no other repack
    return [binary, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--threads", threads,
            "--threads-batch", threads, "--parallel", str(slots), "--cont-batching", "--ctx-size",
            str(slots * context), "--no-repack", "--alias", model_name, "--no-webui", "--seed", "0"], None


LLAMA_SERVER_PRECISION = "Q4_1 GGUF (llama.cpp's int4)"


def llama_server_peer(running: ExitStack, model_name: str, device, slots: int, context: int):
    """llama-server started for the rest of `running` (an ExitStack), as `http_load_curve`'s
    peers take it: (url, extra body fields, precision), or the sentence saying why it is not
    running. Notebook 09 (serving over HTTP)."""
    command, reason = llama_server_command(model_name, device, _free_port(), slots, context)
    if command is None:
        return reason
    try:
        url = running.enter_context(peer_server(command, int(command[command.index("--port") + 1]), timeout=120))
    except LabError as error:
        return f"{LLAMA_SERVER} could not start: {error}"
    return url, {}, LLAMA_SERVER_PRECISION


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
                    peers: dict | None = None, seed: int = 0, progress=None, also_served: dict | None = None) -> list[dict]:
    """Serve one seeded chat workload at each rate with the in-process engine, our HTTP server
    and each peer; one row per (server, rate) with the `load_curve` figures, the errors and the
    precision that served it.

    Introduced in notebook 09 (serving over HTTP). peers: name -> (url, extra body fields,
    precision) of servers already running, or name -> the reason it is not (a row with
    "skipped"); also_served: name -> another model our server serves too (e.g. int4 weights)."""
    from ..serve import BackgroundServer, create_app         # here: importing the bench needs no web server
    from ..serve.precision import describe

    workloads = {rate: chat_workload(sizes.requests, rate, sizes.median_new_tokens, max_new_tokens=sizes.max_new_tokens,
                                     seed=seed) for rate in rates}
    longest = max(r.max_length for r in as_engine_requests(tokenizer, workloads[rates[0]]))
    settings = dict(max_slots=sizes.slots, cache_tokens=sizes.slots * longest)
    app = create_app(model, tokenizer, model_name, max_waiting=sizes.requests, **settings)
    apps = {"our HTTP server": app, **{name: create_app(other, tokenizer, model_name, max_waiting=sizes.requests,
                                                         **settings) for name, other in (also_served or {}).items()}}
    precision = {name: _precision_words(describe(a.state.engine.model)) for name, a in apps.items()}
    rows = []
    in_process = Engine(model, **settings)              # made once: a GPU engine captures its graphs here
    with ExitStack() as running:                        # our servers idle (their engine threads asleep) in turn
        ours = {name: running.enter_context(BackgroundServer(a)) for name, a in apps.items()}
        for rate in rates:
            if progress is not None:
                progress(f"[http_serving] {rate:.2f} requests/s")
            result = in_a_thread(in_process.run, as_engine_requests(tokenizer, workloads[rate]))
            rows.append(_row("in-process engine", rate, {**engine_row(result),
                                                         "tokens": sum(len(s.output) for s in result.sequences)},
                             precision=precision["our HTTP server"]))
            for name, server in ours.items():
                rows.append(_row(name, rate, {**load_test(server.url, workloads[rate], model=model_name),
                                              "decode_path": apps[name].state.engine.decode_path},
                                 precision=precision[name]))
            for name, peer in (peers or {}).items():
                if isinstance(peer, str):
                    rows.append(_row(name, rate, skipped=peer))
                else:
                    url, extra, words = peer
                    rows.append(_row(name, rate, load_test(url, workloads[rate], model=model_name, extra=extra),
                                     precision=words))
    for a in apps.values():
        a.state.engine.blocks.assert_no_leaks()
    return rows


def rows_precision(rows: list[dict], server: str) -> str:
    """The precision `server`'s rows say served them ("" if none did). Notebook 09."""
    return next((r["precision"] for r in rows if r["server"] == server and r["precision"]), "")


def _precision_words(described: dict) -> str:
    """/v1/models' precision ({"dtype", "weights", "kernel"}) in a few words for a row."""
    if described["weights"] == described["dtype"]:
        return f"{described['dtype']} weights"
    return f"{described['weights']} weights, {described['kernel']}"


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


def _prompt_length(tokenizer, request) -> int:
    """Tokens of a request's prompt as a chat endpoint builds it (the template; without one, the
    system text, a blank line and the question)."""
    if getattr(tokenizer, "chat_template", None) is not None:
        text = tokenizer.apply_chat_template(request.messages(), tokenize=False, add_generation_prompt=True)
    else:
        text = f"{request.system}\n\n{request.question}" if request.system else request.question
    return len(tokenizer.encode(text, add_special_tokens=False))


def agentic_serving(model, tokenizer, model_name: str, sizes, rate: float, seed: int = 0) -> list[dict]:
    """An agent's traffic (`loadgen.agentic_workload`: one long shared system prompt, each turn
    extending the last) served by our server without and with prefix caching, one after the
    other: one row each with the load test's figures, the goodput under the sizes' SLOs and the
    prompt positions found in the prefix cache. Notebook 09 (serving over HTTP)."""
    from ..serve import BackgroundServer, create_app
    requests = agentic_workload(sizes.conversations, sizes.turns, rate, system_chars=sizes.system_chars,
                                median_new_tokens=sizes.median_new_tokens, max_new_tokens=sizes.max_new_tokens,
                                seed=seed)
    longest = max(_prompt_length(tokenizer, r) + r.max_tokens for r in requests)
    rows = []
    for caching in (False, True):
        app = create_app(model, tokenizer, model_name, max_waiting=len(requests), max_slots=sizes.slots,
                         cache_tokens=sizes.slots * longest, prefix_caching=caching)
        with BackgroundServer(app) as server:
            figures = load_test(server.url, requests, model=model_name)
        app.state.engine.blocks.assert_no_leaks()
        rows.append({"server": f"our HTTP server, prefix caching {'on' if caching else 'off'}", "rate": rate,
                     "prompt_tokens_longest": longest, "prefix_hit_tokens": app.state.engine.prefix_hit_tokens,
                     "decode_path": app.state.engine.decode_path,
                     **goodput(figures["results"], sizes.ttft_slo_ms / 1e3, sizes.tpot_slo_ms / 1e3),
                     **{k: figures[k] for k in ("requests", "served", "errors", "error_kinds", "tokens", *KEYS)}})
    return rows


def _agentic_figures(rows: list[dict], sizes) -> list[dict]:
    """Prefix caching's gain on the agentic workload: TTFT p50 and p99 (off / on) and goodput
    (on / off), each with the figures in its note. Notebook 09 (serving over HTTP)."""
    off, on = rows
    where = (f"{sizes.conversations} conversations x {sizes.turns} turns at {on['rate']:.2f} conversations/s, "
             f"system prompt {sizes.system_chars} characters, longest prompt + answer {on['prompt_tokens_longest']} "
             f"tokens; {on['prefix_hit_tokens']} prompt positions from the cache; errors {off['errors']} and "
             f"{on['errors']}")
    figures = [reported(f"http serving agentic: prefix caching's time to first token gain, {q} (off / on)",
                        off[f"ttft_{q}"] / on[f"ttft_{q}"], "x",
                        note=f"{off[f'ttft_{q}'] * 1e3:.0f} ms off, {on[f'ttft_{q}'] * 1e3:.0f} ms on; {where}")
               for q in ("p50", "p99")]
    figures.append(reported("http serving agentic: goodput with prefix caching / without",
                            on["goodput"] / off["goodput"] if off["goodput"] else float("nan"), "x",
                            note=f"{on['goodput']:.2f} against {off['goodput']:.2f} requests/s within TTFT "
                                 f"<= {sizes.ttft_slo_ms} ms and TPOT <= {sizes.tpot_slo_ms} ms ({on['met']:.0%} "
                                 f"and {off['met']:.0%} of requests)"))
    return figures


QUALITY_WEIGHTS = ("float", "int8", "int4")


def served_quality(variants, tokenizer, model_name: str, eval_tokens: int = 256) -> list[dict]:
    """Perplexity and the multiple-choice accuracy through our server, for fp32, int8 and int4
    weights, each beside the same scores in process (`served_quality.quality_row`): what an
    evaluation harness would measure through the server. Notebook 09 (serving over HTTP)."""
    from ..lab.quality import eval_tokens as first_tokens
    from ..lab.served_quality import quality_row
    from ..serve import BackgroundServer, create_app
    context = variants.get("float32").config.max_position
    ids = first_tokens(tokenizer, max_tokens=min(eval_tokens, context - 1))    # the server reserves one position
    rows = []
    for weights in QUALITY_WEIGHTS:
        model = variants.get("float32", weights)
        with BackgroundServer(create_app(model, tokenizer, model_name)) as server:
            rows.append({"weights": "float32" if weights == "float" else weights,
                         **quality_row(f"our HTTP server ({weights})", server.url, model_name, model, tokenizer, ids)})
    return rows


def _quality_figures(quality: list[dict]) -> list[dict]:
    """Served = in process (the largest log-probability difference, target 1e-4) per weights,
    and what int8 and int4 cost in perplexity through the server. Notebook 09."""
    by = {q["weights"]: q for q in quality}
    figures = [reported(f"http serving quality: largest served - in-process log-probability difference ({w})",
                        q["largest_log_prob_difference"], "nats", target=1e-4, higher_is_better=False,
                        note=f"perplexity {q['served_perplexity']:.3f} served, {q['in_process_perplexity']:.3f} in "
                             f"process on {q['tokens']} tokens; multiple choice {q['served_choice_accuracy']:.0%} "
                             f"served, {q['in_process_choice_accuracy']:.0%} in process ({q['questions']} questions)")
               for w, q in by.items()]
    for w in ("int8", "int4"):
        if w in by and "float32" in by:
            figures.append(reported(f"http serving quality: served perplexity, {w} / float32",
                                    by[w]["served_perplexity"] / by["float32"]["served_perplexity"], "x",
                                    higher_is_better=False,
                                    note=f"{by[w]['served_perplexity']:.3f} against {by['float32']['served_perplexity']:.3f}"
                                         f"; multiple choice {by[w]['served_choice_accuracy']:.0%} against "
                                         f"{by['float32']['served_choice_accuracy']:.0%}"))
    return figures


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
    commands = {"llama.cpp server": llamacpp_server_command(ctx, _free_port()),
                "vLLM server": vllm_server_command(ctx, _free_port(), sizes.slots)}
    precision = {LLAMA_SERVER: LLAMA_SERVER_PRECISION, "llama.cpp server": LLAMA_SERVER_PRECISION,
                 "vLLM server": "float32 weights"}
    also = {INT4_SERVER: ctx.variants.get("float32", "int4")} if sizes.int4_server else {}
    peers: dict = {}
    eos = {str(tok.eos_token_id): -100} if getattr(tok, "eos_token_id", None) is not None else {}
    with ExitStack() as running:                          # every peer's server stops at the end
        peers[LLAMA_SERVER] = llama_server_peer(running, ctx.model_name, ctx.device, sizes.slots, max(512, 2 * longest))
        for name, (command, reason) in commands.items():
            if command is None:
                peers[name] = reason
                continue
            try:
                url = running.enter_context(peer_server(command, int(command[command.index("--port") + 1]),
                                                        timeout=600 if name.startswith("vLLM") else 120))
                # llama-cpp-python's server has no ignore_eos: a bias that forbids the end token does the same
                peers[name] = (url, {"logit_bias": eos} if name == "llama.cpp server" else {}, precision[name])
            except LabError as error:
                peers[name] = f"{name} could not start: {error}"
        rows = http_load_curve(model, tok, ctx.model_name, rates, sizes, peers, also_served=also)
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
    for name in [LLAMA_SERVER, *commands]:
        reason = peers[name] if isinstance(peers[name], str) else None
        figures.append(reported(f"http serving: our HTTP server / {name} throughput at the highest rate",
                                _ratio(rows, http, name, "throughput", high), "x",
                                note=reason or f"same client, same requests; {rows_precision(rows, http)} against "
                                               f"{precision[name]}; {name} errors: "
                                               f"{sum(r['errors'] for r in rows if r['server'] == name)}"
                                               + ("; llama-cpp-python's server runs one request at a time (no "
                                                  "batching), so its queue grows with the load"
                                                  if name == "llama.cpp server" else "")))
    agentic = agentic_serving(model, tok, ctx.model_name, sizes, rate=low)
    figures += _agentic_figures(agentic, sizes)
    quality = served_quality(ctx.variants, tok, ctx.model_name)       # untimed: scores, not speed
    quality_figures = _quality_figures(quality)
    # on a GPU, a figure from a run that was not replayed CUDA graphs is a failed measurement
    ours = [r["decode_path"] for r in rows if r["server"] in (inproc, http, INT4_SERVER)] + [r["decode_path"] for r in agentic]
    for figure in figures:
        peer = [VLLM_GRAPHED] if "vLLM" in figure["name"] else []
        mark_graphed(figure, ours + peer, ctx.device)
    return {"slots": sizes.slots, "requests": sizes.requests, "saturation_rate": saturation, "rates": rates,
            "loads": list(sizes.loads), "rows": rows,
            "peers": {name: (p if isinstance(p, str) else None) for name, p in peers.items()}, "agentic": agentic, "quality": quality,
            "figures": figures + quality_figures}
