"""How long one long prompt holds the other streams of our HTTP server (issue 49): with the server's
default token budget (chunked prefill) and with prompts served whole.

    python scripts/long_prompt_stall.py [--prompt-tokens 4000] [--budgets 256 64 0] [--out stall.json]

For each setting a server is started on the embedded SmolLM2-135M (fp32); a stream of 64 tokens
starts, and after its 8th token a second client sends one prompt of `--prompt-tokens` tokens (and
asks for one token). The stream's gaps between tokens are recorded: the longest gap is the stall,
beside the stream's decode step before the long prompt came. One JSON object per setting is printed and written.
Run it alone on a quiet machine: it times a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import openai  # noqa: E402

from labsupport.serve import BackgroundServer, create_app  # noqa: E402
from labsupport.serve.app import default_token_budget  # noqa: E402
from labsupport.weights.loading import load_model  # noqa: E402

NAME = "smollm2-135m"


async def _stream_beside_a_long_prompt(url: str, long_prompt: list[int]) -> tuple[list[float], list[float]]:
    """The stream's gaps between tokens before the long prompt comes (its 8 first) and after."""
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    stream = await api.completions.create(model=NAME, prompt="The history of the bicycle", max_tokens=64,
                                          temperature=0, stream=True, extra_body={"ignore_eos": True})
    times, other = [], None
    async with httpx.AsyncClient(timeout=600) as client:
        async for _ in stream:
            times.append(time.perf_counter())
            if len(times) == 8:
                other = asyncio.create_task(client.post(url + "/v1/completions", json={
                    "model": NAME, "prompt": long_prompt, "max_tokens": 1, "temperature": 0}))
        reply = await other
        reply.raise_for_status()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return gaps[:7], gaps[7:]


def measure(model, tokenizer, prompt_tokens: int, token_budget) -> dict:
    """The stream's gaps beside one long prompt, for one token budget (None: whole prompts)."""
    long_prompt = (tokenizer.encode("a long document about many things. ", add_special_tokens=False)
                   * prompt_tokens)[:prompt_tokens]
    app = create_app(model, tokenizer, NAME, max_slots=4, token_budget=token_budget,
                     cache_tokens=4 * (prompt_tokens + 128))
    with BackgroundServer(app) as server:
        asyncio.run(_stream_beside_a_long_prompt(server.url, long_prompt[:64]))        # warm-up
        alone, beside = asyncio.run(_stream_beside_a_long_prompt(server.url, long_prompt))
    step = statistics.median(alone)
    return {"token_budget": token_budget, "prompt_tokens": prompt_tokens, "decode_step_alone_s": step,
            "stall_s": max(beside), "median_gap_beside_s": statistics.median(beside),
            "stall_in_decode_steps": max(beside) / step}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--budgets", type=int, nargs="*", default=None,
                        help="token budgets to try (0: whole prompts; default: the server's default and 0)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    model, tokenizer = load_model(NAME)
    budgets = [default_token_budget(model, 4), 0] if args.budgets is None else args.budgets
    rows = [measure(model, tokenizer, args.prompt_tokens, budget or None) for budget in budgets]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
