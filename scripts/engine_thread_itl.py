"""Inter-token latency of one stream (64 tokens, int4 SmolLM2-135M, three times): `python -m labsupport
serve` in a subprocess (the engine steps in the thread that loaded the model) against a `BackgroundServer`
(the engine in a thread of its own), one after the other (issue 49, item 1). Prints one JSON line.

    python scripts/engine_thread_itl.py

Run it alone on a quiet machine: it times a CPU.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import openai  # noqa: E402

from labsupport.serve import BackgroundServer, create_app  # noqa: E402
from labsupport.serve.precision import quantize_for_serving  # noqa: E402
from labsupport.weights.loading import load_model  # noqa: E402

NAME = "smollm2-135m"


async def median_gap(url: str) -> float:
    """The median gap between a stream's tokens (the first two left out), over three streams."""
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    gaps = []
    for _ in range(3):
        stream = await api.completions.create(model=NAME, prompt="The history of the bicycle", max_tokens=64,
                                              temperature=0, stream=True, extra_body={"ignore_eos": True})
        times = [time.perf_counter() async for _ in stream]
        gaps += [b - a for a, b in zip(times[1:], times[2:])]
    return statistics.median(gaps)


def cli_server_gap() -> float:
    """`python -m labsupport serve --quantize int4` on a free port, measured, then stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "labsupport", "serve", "--quantize", "int4", "--port", str(port),
                               "--max-slots", "4", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        return asyncio.run(median_gap(url))
    finally:
        server.terminate()
        server.wait(60)


def background_server_gap() -> float:
    """The same model and settings behind a `BackgroundServer` in this process."""
    model, tokenizer = load_model(NAME)
    quantize_for_serving(model, "int4")
    with BackgroundServer(create_app(model, tokenizer, NAME, max_slots=4)) as server:
        return asyncio.run(median_gap(server.url))


def main() -> int:
    cli = cli_server_gap()
    background = background_server_gap()
    print(json.dumps({"cli_engine_in_loading_thread_itl_ms": cli * 1e3,
                      "background_engine_thread_itl_ms": background * 1e3, "ratio": background / cli}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
