"""Tensor parallelism measured side by side: TP=1 on all the cores against TP=world, the cores shared out.

Introduced in notebook 10 (past one device).

Each degree runs in its own processes (`engine.parallel.run_tensor_parallel`), on the same
cores: one rank with every thread, or `world` ranks with a share each. Inside, rank 0 times:

* decode at batch 1: `generate` after a prefill, tokens per second of the decode steps;
* one long prefill: a single forward pass over `prefill_tokens` positions;
* the collectives each phase made: how many all-reduces and all-gathers, their bytes and
  their seconds, so the communication's share of a step is measured, not assumed;
* the all-reduce alone, at a decode step's size (one row of the hidden state) and at the
  prefill's, its median latency over many calls.

The degrees run in rounds, their order rotated, and each figure is the median over rounds, as
in every side-by-side comparison of the course. `link_arithmetic` sets the measured compute
beside data-sheet links: what the same all-reduces would cost over NVLink and over PCIe.
"""

from __future__ import annotations

import os
import statistics

import torch

from ..engine.generation import generate
from ..engine.parallel import plan_split, run_tensor_parallel
from ..engine.parallel.tensor import device_clock, require_float_model
from ..errors import LabError
from ..inputs import token_rows, whole_number

# Data-sheet figures for the arithmetic (per direction, per GPU): NVLink 4 on an H100 SXM moves
# 450 GB/s each way; PCIe 4.0 x16 about 32 GB/s (25 GB/s achieved). Latency per all-reduce: a
# few microseconds on NVLink (NCCL's small-message latency), ~10-20 us through PCIe and the host.
LINKS = {"NVLink 4 (H100 SXM)": {"gb_per_s": 450.0, "latency_us": 5.0},
         "PCIe 4.0 x16": {"gb_per_s": 25.0, "latency_us": 15.0}}


def _timed_collective_stats(collectives) -> dict:
    return {kind: {"calls": collectives.calls[kind], "bytes": collectives.bytes[kind],
                   "seconds": collectives.seconds[kind]} for kind in collectives.calls}


def measure_rank(model, rank: int, world: int, prompt: list[int], new_tokens: int, prefill_tokens: int,
                 probe_calls: int = 200) -> dict:
    """What one rank measures (run on every rank, in step: the collectives keep them together).
    Notebook 10 (past one device). Returns the decode and prefill times, the collectives each
    phase made, and the all-reduce's latency alone at a decode row's and the prefill's size. Every
    clock read waits for the GPU first (`device_clock`): NCCL calls return once queued."""
    collectives = model.collectives
    hidden = model.config.hidden_size
    with torch.inference_mode():
        generate(model, prompt, 4, eos_token_ids=())                       # warm-up: first calls allocate
        collectives.reset()
        result = generate(model, prompt, new_tokens, eos_token_ids=())
        decode_comm = _timed_collective_stats(collectives)
        long = torch.arange(prefill_tokens, device=model.device)[None] % model.config.vocab_size   # (1, T)
        model.logits(model(long[:, :16]), at=-1)                               # warm-up at another shape
        collectives.reset()
        started = device_clock(long)
        model.logits(model(long), at=-1)
        prefill_s = device_clock(long) - started
        prefill_comm = _timed_collective_stats(collectives)
        latency = {}
        for name, rows in (("decode_row", 1), ("prefill", prefill_tokens)):
            tensor = torch.ones(1, rows, hidden, device=model.device, dtype=model.dtype)
            times = []
            for _ in range(probe_calls if rows == 1 else max(probe_calls // 10, 5)):
                started = device_clock(tensor)
                if world > 1:
                    torch.distributed.all_reduce(tensor)
                times.append(device_clock(tensor) - started)
            latency[name] = {"bytes": tensor.nbytes, "median_s": statistics.median(times)}
    steps = result.tokens.shape[1] - 1
    return {"rank": rank, "tokens": result.tokens[0].tolist(), "decode_tokens_per_s": result.decode_tokens_per_s,
            "decode_step_s": result.decode_seconds / max(steps, 1), "decode_steps": steps,
            "generate_s": result.prefill_seconds + result.decode_seconds,     # the span decode_collectives cover
            "decode_collectives": decode_comm, "prefill_s": prefill_s, "prefill_tokens": prefill_tokens,
            "prefill_collectives": prefill_comm, "all_reduce_latency": latency,
            "threads": torch.get_num_threads(), "layers": model.config.num_layers,
            "kv_heads": model.config.num_kv_heads, "mlp_units": model.config.intermediate_size}


def measure_tensor_parallel(model, prompt: list[int], degrees=(1, 2), cores: int | None = None,
                            new_tokens: int = 32, prefill_tokens: int = 512, rounds: int = 3,
                            timeout: float = 600.0) -> dict:
    """TP at each degree on the same `cores`, side by side in `rounds` rotated rounds.

    Notebook 10 (past one device). Returns, per degree: the median decode tokens/s and prefill
    seconds, rank 0's collectives per decode step and for the prefill, the all-reduce latency
    alone, every rank's share of the heads and MLP units, and whether every degree produced
    the same greedy tokens. Bad arguments are one sentence before any rank starts (`require_measurement`).
    """
    prompt, degrees, cores, new_tokens, prefill_tokens, rounds = require_measurement(
        model, prompt, degrees, cores, new_tokens, prefill_tokens, rounds)
    runs: dict[int, list] = {w: [] for w in degrees}
    order = list(degrees)
    for r in range(rounds):
        for world in order[r % len(order):] + order[:r % len(order)]:          # rotated: none always first
            ranks = run_tensor_parallel(model, world, measure_rank, (prompt, new_tokens, prefill_tokens),
                                        threads=cores // world, timeout=timeout)
            runs[world].append(ranks)
    out = {"cores": cores, "rounds": rounds, "new_tokens": new_tokens, "prefill_tokens": prefill_tokens,
           "degrees": {}}
    reference = runs[degrees[0]][0][0]["tokens"]
    for world, per_round in runs.items():
        first = [ranks[0] for ranks in per_round]
        last = per_round[-1]
        decode_comm = first[-1]["decode_collectives"].get("all_reduce", {"calls": 0, "seconds": 0.0, "bytes": 0})
        prefill_comm = first[-1]["prefill_collectives"].get("all_reduce", {"calls": 0, "seconds": 0.0, "bytes": 0})
        steps = first[-1]["decode_steps"] + 1          # forward passes of `generate`: its prefill's counted too
        out["degrees"][world] = {
            "threads_per_rank": cores // world,
            "decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in first),
            "decode_tokens_per_s_rounds": [r["decode_tokens_per_s"] for r in first],
            "prefill_s": statistics.median(r["prefill_s"] for r in first),
            "prefill_s_rounds": [r["prefill_s"] for r in first],
            "all_reduces_per_step": decode_comm["calls"] / steps,
            "all_reduce_share_of_decode": decode_comm["seconds"] / first[-1]["generate_s"] if world > 1 else 0.0,
            "prefill_all_reduces": prefill_comm["calls"],
            "all_reduce_share_of_prefill": prefill_comm["seconds"] / first[-1]["prefill_s"] if world > 1 else 0.0,
            "all_reduce_latency": first[-1]["all_reduce_latency"] if world > 1 else None,
            "shares": [{"rank": r["rank"], "kv_heads": r["kv_heads"], "mlp_units": r["mlp_units"]} for r in last],
            "same_tokens": all(ranks[0]["tokens"] == reference for ranks in per_round),
        }
    return out


def require_measurement(model, prompt, degrees=(1, 2), cores=None, new_tokens=32, prefill_tokens=512,
                        rounds=3) -> tuple:
    """`measure_tensor_parallel`'s arguments checked before any rank starts: (prompt as ids,
    degrees as a tuple, cores, new_tokens, prefill_tokens, rounds), or one sentence.
    Notebook 10 (past one device). The degrees themselves are checked by `plan_split`."""
    require_float_model(model)
    context = model.config.max_position
    if not isinstance(prompt, (list, tuple)) and not hasattr(prompt, "tolist"):      # a tensor or array passes
        raise LabError(f"The prompt must be a list of token ids (tokenizer.encode(text)), got {type(prompt).__name__}.")
    prompt = token_rows(prompt, model.config.vocab_size)
    if len(prompt) != 1:
        raise LabError(f"measure_tensor_parallel times one prompt, got a batch of {len(prompt)}.")
    if not isinstance(degrees, (list, tuple)) or not degrees:
        raise LabError(f"degrees must be a non-empty tuple of tensor-parallel degrees, e.g. (1, 2); got {degrees!r}.")
    degrees = tuple(whole_number(w, "each degree (ranks)") for w in degrees)
    for world in degrees:
        plan_split(model.config, world)
    if len(set(degrees)) < len(degrees):
        raise LabError(f"degrees holds a degree twice ({degrees}); give each once.")
    cores = (os.cpu_count() or 1) if cores is None else whole_number(cores, "cores (shared out among the ranks)")
    for world in degrees:
        if cores % world:
            raise LabError(f"{cores} cores cannot be shared evenly by {world} ranks; choose degrees that divide "
                           f"the cores ({cores}).")
    new_tokens = whole_number(new_tokens, "new_tokens (decode steps timed)")
    if len(prompt[0]) + max(new_tokens, 4) > context:
        raise LabError(f"The prompt ({len(prompt[0])} tokens) and new_tokens ({new_tokens}, at least 4 for the "
                       f"warm-up) need more than the model's context of {context}; shorten either.")
    prefill_tokens = whole_number(prefill_tokens, "prefill_tokens (positions of the long prefill)", maximum=context)
    rounds = whole_number(rounds, "rounds (side-by-side repetitions)")
    return prompt[0], degrees, cores, new_tokens, prefill_tokens, rounds


def link_arithmetic(result: dict, model_config, links: dict = LINKS) -> list[dict]:
    """What each degree's decode-step all-reduces would cost over data-sheet links, beside the
    decode step measured here. Notebook 10 (past one device). A ring all-reduce moves
    2 (world - 1) / world of the message per rank; its time is latency + bytes moved / bandwidth."""
    rows = []
    for world, d in result["degrees"].items():
        if world == 1:
            continue
        message = model_config.hidden_size * 4                                  # one row of fp32 activations
        per_step = d["all_reduces_per_step"]
        step_s = 1 / d["decode_tokens_per_s"]
        for name, link in links.items():
            call_s = link["latency_us"] * 1e-6 + 2 * (world - 1) / world * message / (link["gb_per_s"] * 1e9)
            rows.append({"degree": world, "link": name, "all_reduces_per_step": per_step,
                         "seconds_per_step": per_step * call_s, "share_of_measured_step": per_step * call_s / step_s})
    return rows


def rank_logits_and_tokens(model, rank: int, world: int, prompt: list[int], new_tokens: int) -> dict:
    """One rank's logits of `prompt` (every position) and its greedy tokens: what notebook 10 compares
    with the whole model's. Notebook 10 (past one device)."""
    with torch.inference_mode():
        logits = model.logits(model(torch.tensor([prompt], device=model.device)))
    tokens = generate(model, prompt, new_tokens, eos_token_ids=()).tokens[0].tolist()
    return {"rank": rank, "logits": logits.cpu(), "tokens": tokens, "kv_heads": model.config.num_kv_heads,
            "mlp_units": model.config.intermediate_size}
