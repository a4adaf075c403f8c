"""The peer servers of notebook 09's ``http_serving`` section: each started in its own process on
127.0.0.1 with the same slots and threads as ours, ready once /v1/models answers, stopped at the end.

Introduced in notebook 09 (serving over HTTP). llama.cpp's C++ server (`llama-server`,
continuous batching; README: "llama-server, offline" builds it), llama-cpp-python's server
(`llama_cpp.server`, one request at a time) and vLLM's (a CUDA GPU). A peer that cannot run
is one sentence saying why, never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager

import torch

from ...errors import LabError
from ..core import BenchContext

LLAMA_SERVER = "llama-server"


def free_port() -> int:
    """A port of 127.0.0.1 free right now, for a peer's server. Notebook 09 (serving over HTTP)."""
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
    from ...weights.loading import EMBEDDED
    from .llamacpp import llamacpp_unavailable
    if ctx.model_name != EMBEDDED:
        return None, f"llama.cpp serves the embedded model's GGUF file only; this run's model is {ctx.model_name}."
    if ctx.device.type != "cpu":
        return None, "the llama.cpp peer is measured on a CPU run only (its wheel here is built for the CPU)."
    try:
        from ...weights.embedded import find_gguf
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
    from ...weights.loading import EMBEDDED
    if model_name != EMBEDDED:
        return None, f"llama.cpp serves the embedded model's GGUF file only; this run's model is {model_name}."
    if torch.device(device).type != "cpu":
        return None, "llama-server is measured on a CPU run only (the GPU's peer is vLLM)."
    binary, reason = llama_server_binary()
    if binary is None:
        return None, reason
    try:
        from ...weights.embedded import find_gguf
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


def start_peer(running: ExitStack, command: list[str], name: str, timeout: float) -> tuple[str | None, str | None]:
    """`peer_server` for `command` (its port read from its --port), running for the rest of `running`
    (an ExitStack): (its url, None), or (None, "<name> could not start: ..."). The one home of a
    peer's start for the bench's HTTP sections. Notebook 09 (serving over HTTP)."""
    try:
        return running.enter_context(peer_server(command, int(command[command.index("--port") + 1]), timeout)), None
    except LabError as error:
        return None, f"{name} could not start: {error}"


def llama_server_peer(running: ExitStack, model_name: str, device, slots: int, context: int):
    """llama-server started for the rest of `running` (an ExitStack), as `http_load_curve`'s
    peers take it: (url, extra body fields, precision), or the sentence saying why it is not
    running. Notebook 09 (serving over HTTP)."""
    command, reason = llama_server_command(model_name, device, free_port(), slots, context)
    if command is None:
        return reason
    url, failed = start_peer(running, command, LLAMA_SERVER, timeout=120)
    return failed if url is None else (url, {}, LLAMA_SERVER_PRECISION)


def vllm_server_command(ctx: BenchContext, port: int, slots: int) -> tuple[list[str] | None, str | None]:
    """vLLM's OpenAI-compatible server on the same weights (a CUDA GPU with vllm installed), or
    (None, why not). Notebook 09 (serving over HTTP)."""
    from ...weights.loading import resolve_hf_source
    from .continuous_batching import vllm_skip_reason
    reason = vllm_skip_reason(ctx.device)
    if reason is not None:
        return None, reason
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_hf_source(ctx.model_name),
            "--served-model-name", ctx.model_name, "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(slots), "--dtype", "float32", "--gpu-memory-utilization", "0.5", "--seed", "0"], None
