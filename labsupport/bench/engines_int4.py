"""The int4 engine beyond one row at a time, against llama.cpp on the same GGUF file and threads.

Introduced in notebook 00 (where the time goes); part of the engines section (engines.py), run
where llama.cpp runs. Issue 40: at batch 1 a decode step reads each weight once; with many rows
(a long prompt's prefill, several sequences decoding at once) every weight meets every row, and
the W4A8 kernel's tiles that unpack each weight block once for all the rows (w4a8.cpp) are what
is measured:

* the prefill of a LONG_PROMPT-token prompt (the course's prompt repeated), ours against
  llama.cpp's, side by side;
* BATCH_ROWS copies of the prompt decoding at once: ours as one batch through `generate`,
  llama.cpp as one `llama_decode` of a token per sequence each step (`LlamaCppBatchedGreedy`);
* the batching knee (issue 54): the same at each of KNEE_ROWS, where the aggregate decode speed
  stops growing with the rows (`knee_rows`). On a CPU it is expected at 4-8 rows.
"""

from __future__ import annotations

import torch

from ..engine.generation import generate
from ..lab.busy import busy_reason
from ..lab.measure import time_side_by_side
from ..weights.embedded import find_gguf
from .core import BenchContext, reported
from .peers.llamacpp import LlamaCppBatchedGreedy, LlamaCppGreedy

OURS_INT4, LLAMACPP = "labsupport int4 g32", "llama.cpp Q4_1 (same GGUF)"    # the engines section's row names
LONG_PROMPT = 512           # tokens of the prefill timed against llama.cpp's
BATCH_ROWS = 8              # sequences of the batched int4 decode timed against llama.cpp's
KNEE_ROWS = (1, 2, 4, 8, 16)   # the rows of the knee; BATCH_ROWS is one of them
KNEE_GAIN = 1.2             # doubling the rows must add at least 20% aggregate speed to count as growth


def long_prefill(ctx: BenchContext, ids: list[int], repeats: int) -> dict:
    """The int4 prefill of a LONG_PROMPT-token prompt (the course's prompt repeated), ours and
    llama.cpp's on the same file and threads, side by side: name -> Timing. Issue 40: a prefill
    multiplies many rows by each weight, where a kernel that reuses each unpacked block gains.
    Notebook 00 (where the time goes)."""
    long_ids = (ids * (LONG_PROMPT // len(ids) + 1))[:LONG_PROMPT]
    int4 = ctx.variants.get("float32", "int4", group_size=32)
    peer = LlamaCppGreedy(find_gguf(), threads=torch.get_num_threads(), context=LONG_PROMPT + 8)
    return time_side_by_side({OURS_INT4: lambda: generate(int4, long_ids, 1, eos_token_ids=()),
                              LLAMACPP: lambda: peer.prefill(long_ids)}, ctx.device, warmup=1, repeats=repeats)


def batched_decode(ctx: BenchContext, ids: list[int], new_tokens: int, repeats: int, rows: int = BATCH_ROWS) -> dict:
    """int4 decode of `rows` copies of the prompt at once, ours and llama.cpp's on the same file
    and threads, side by side (whole runs and first tokens, interleaved): name -> its decode tokens/s
    over all rows, its timings, and whether its rows all got the same tokens. Notebook 00 (where the
    time goes); issue 40."""
    int4 = ctx.variants.get("float32", "int4", group_size=32)
    peer = LlamaCppBatchedGreedy(find_gguf(), rows, threads=torch.get_num_threads(), context=len(ids) + new_tokens + 8)
    batch = torch.tensor([ids] * rows)                                         # (rows, T)
    outputs = {}

    def ours(n):
        outputs[OURS_INT4] = generate(int4, batch, n, eos_token_ids=()).tokens.tolist()

    def theirs(n):
        outputs[LLAMACPP] = peer.generate(ids, n)

    try:
        runs = {OURS_INT4: ours, LLAMACPP: theirs}
        whole = time_side_by_side({k: (lambda f=f: f(new_tokens)) for k, f in runs.items()}, ctx.device,
                                  warmup=1, repeats=repeats)
        first = time_side_by_side({k: (lambda f=f: f(1)) for k, f in runs.items()}, ctx.device,
                                  warmup=1, repeats=repeats)
        for name, f in runs.items():
            f(new_tokens)                                                        # the tokens, for the agreement
        busy = busy_reason(whole) or busy_reason(first)
    finally:
        peer.close()
    return {name: {"decode_tokens_per_s": rows * (new_tokens - 1) / max(whole[name].median - first[name].median, 1e-9),
                   "rows": rows, "new_tokens": new_tokens, "busy": busy,
                   "rows_alike": all(row == outputs[name][0] for row in outputs[name]),
                   "timings_s": whole[name].to_dict(), "first_token_s": first[name].to_dict()} for name in runs}


def decode_knee(ctx: BenchContext, ids: list[int], new_tokens: int, repeats: int) -> dict:
    """`batched_decode` at each of KNEE_ROWS: {rows: its result}. Notebook 00 (where the time goes);
    issue 54's batching knee."""
    return {rows: batched_decode(ctx, ids, new_tokens, repeats, rows) for rows in KNEE_ROWS}


def knee_rows(speeds: dict[int, float]) -> int | None:
    """The rows where aggregate decode stops growing: the first row count whose doubling adds less
    than KNEE_GAIN (None if it grows to the last). speeds: {rows: aggregate tokens/s}, rows doubling.
    Notebook 00 (where the time goes)."""
    rows = sorted(speeds)
    return next((r for r, more in zip(rows, rows[1:]) if speeds[more] < KNEE_GAIN * speeds[r]), None)


def knee_figures(knee: dict) -> list[dict]:
    """Per engine, its aggregate decode at the most rows over one row, and where it stopped growing
    (none where llama.cpp is absent). Notebook 00 (where the time goes)."""
    if not knee:
        return []
    rows = sorted(knee, key=int)
    figures = []
    for name in (OURS_INT4, LLAMACPP):
        speeds = {int(r): knee[r][name]["decode_tokens_per_s"] for r in rows}
        stop = knee_rows(speeds)
        figures.append(reported(
            f"{name}: aggregate decode at {rows[-1]} rows / 1 row (tokens/s)", speeds[int(rows[-1])] / speeds[1], "x",
            busy=next((knee[r][name]["busy"] for r in rows if knee[r][name]["busy"]), None),
            note=", ".join(f"{r} row{'s' if r > 1 else ''} {s:.0f}" for r, s in speeds.items()) + " tokens/s; "
                 + (f"stops growing (under {KNEE_GAIN}x a doubling) from {stop} rows" if stop else "grows to the last")))
    return figures


def batched_figures(batched: dict) -> list[dict]:
    """Ours / llama.cpp's decode speed at BATCH_ROWS rows (none where llama.cpp is absent).
    Notebook 00 (where the time goes)."""
    if not batched:
        return []
    ours, theirs = batched[OURS_INT4], batched[LLAMACPP]
    return [reported(f"{OURS_INT4} / {LLAMACPP} (decode of {BATCH_ROWS} rows at once, tokens/s)",
                     ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"], "x", busy=ours["busy"],
                     note=f"{ours['decode_tokens_per_s']:.0f} vs {theirs['decode_tokens_per_s']:.0f} tokens/s over "
                          f"{BATCH_ROWS} rows, {ours['new_tokens']} tokens each")]


def long_prefill_figures(timings: dict) -> list[dict]:
    """Ours / llama.cpp's prefill speed on LONG_PROMPT tokens (none where llama.cpp is absent).
    Notebook 00 (where the time goes)."""
    if not timings:
        return []
    ours, theirs = timings[OURS_INT4].median, timings[LLAMACPP].median
    return [reported(f"{OURS_INT4} / {LLAMACPP} (prefill of {LONG_PROMPT} tokens, tokens/s)", theirs / ours, "x",
                     busy=busy_reason(timings),
                     note=f"{LONG_PROMPT / ours:.0f} vs {LONG_PROMPT / theirs:.0f} prompt tokens/s")]
