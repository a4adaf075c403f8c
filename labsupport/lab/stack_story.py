"""Notebook 07's sentences that depend on the model and the device, computed from them.

Introduced in notebook 07 (putting it together). Where the prose of a notebook would
hold on one machine only (a CPU's few cores, a GPU's 16-bit tensor cores, the embedded
model's GGUF origin), it is computed here from the run and printed instead:

* `model_origin_note`: where this model's weights came from, and what that means for int4;
* `regime_sentence`: at how many rows this device's roofline makes a decode step
  compute-bound, per dtype (notebook 00's `roofline.ridge_batch`);
* `why_not`: why a stage did not pay, from its measured row (bytes and passes it removed,
  how long each of its passes took against its base's, how close the base ran to the roof);
* `losses_ledger`: where the techniques did not pay on this run, and why.
"""

from __future__ import annotations

from .roofline import ridge_batch
from .stack import HF_PEER, removed_work
from .stack_cost import cost_misses
from .prose import weights_origin

NOTEBOOK = {"+ KV cache": "01", "+ static batching": "02", "+ bf16": "03", "+ fp16": "03", "+ int4 weights": "04",
            "+ int4, batch 1": "04", "+ speculative decoding": "05", "+ continuous batching": "06"}


def model_origin_note(config) -> str:
    """Where this model's weights came from, for notebook 07's llama.cpp paragraph.

    Introduced in notebook 07 (putting it together). The embedded model (`weights.embedded`)
    was read from a GGUF file in Q4_1 (4 bits in blocks of 32, a scale and a minimum per block),
    so the course's int4 in groups of 32 meets those very blocks; any other model came as
    float weights (safetensors from the hub or a directory), so its int4 is a first quantization.
    """
    origin = weights_origin(config.name)
    if origin.was_4bit:
        return (f"This run's model ({config.name}, embedded) came as a llama.cpp GGUF file in {origin.stored}. That is "
                "4 bits in blocks of 32, with a scale and a minimum each. It is the very layout of the course's int4 in "
                "groups of 32, so int4 finds those layers' values already on its grid. The file kept the output layer "
                "at a finer precision, and the stack's int4 quantizes that layer too (notebook 04).")
    if origin.from_gguf:
        return (f"This run's model ({config.name}) came as a llama.cpp GGUF file in {origin.stored} ({origin.where}), "
                "not on a 4-bit grid. The stack's int4 is a new, coarser quantization of it.")
    return (f"This run's model ({config.name}) came as float weights (safetensors, from the Hugging Face hub or a "
            "directory), not from a GGUF file. The stack's int4 is its first quantization. llama.cpp would convert "
            "it (convert_hf_to_gguf.py) and quantize it (llama-quantize, e.g. to Q4_1 or Q4_K) before running it.")


def regime_sentence(profile, config, slots: int) -> str:
    """At how many rows a decode step of `config` reaches this device's ridge, for each dtype
    the profile measured, and what that means for the batched stages' `slots` rows.

    Introduced in notebook 07 (putting it together). profile: `roofs.probe`'s
    `HardwareProfile`; the batch comes from `roofline.ridge_batch` at context 0 (the
    weights' bytes against the matmuls' FLOPs; a long context moves it further out).
    """
    parts, bound = [], []
    for name in profile.flops:
        rows = ridge_batch(profile, config, name)
        parts.append(f"In {name}: ridge {profile.ridge(name):.1f} FLOP/byte, reached at about {rows:.0f} rows.")
        bound.append(f"{'compute' if slots >= rows else 'memory'}-bound in {name}")
    return (f"Here is where the roofline puts a decode step of {config.name} on this device ({profile.name}). "
            + " ".join(parts) + f" The batched stages run {slots} rows. By this count they are "
            + ", ".join(bound) + ". The measured ladder says how far the count holds.")


def why_not(row: dict, result: dict) -> str:
    """Why stage `row` did not pay over the stage it builds on, from this run's measurements:
    the bytes per pass and passes per token it removed (`stack.removed_work`), how long each
    of its passes took against its base's, and how close the base ran to the memory roof. Short
    sentences, the first lower-case and the last without its full stop: notebook 07 prints
    "Why: {why_not}.".

    Introduced in notebook 07 (putting it together).
    """
    work = next((w for w in removed_work(result) if w["stage"] == row["stage"]), None)
    base = next(r for r in result["stages"] if r["stage"] == row["builds_on"])
    where = f"notebook {NOTEBOOK[row['stage']]} measures it alone" if row["stage"] in NOTEBOOK else "no pass counts"
    if work is None:
        return f"{row['gain']:.2f}x the speed of {base['stage']} ({where})"
    b, p = work["bytes_per_pass"], work["passes_per_token"]
    longer = 1 / (row["gain"] * p)                 # this stage's seconds per pass over its base's
    removed = [f"{b:.2f}x the weight bytes per pass" if b < 0.95 else "",
               f"{p:.2f}x the passes per token" if abs(p - 1) >= 0.05 else ""]
    said = " and ".join(x for x in removed if x)
    text = (f"it read {said} of {base['stage']}" if said else
            f"it read the same bytes per pass and took the same passes per token as {base['stage']}")
    text += f", but each of its passes took {longer:.2f}x as long"
    fraction = base.get("bandwidth_fraction")
    if b < 0.95 and fraction is not None and fraction < 0.5:
        text += (f". Its base ({base['stage']}) ran at {fraction:.0%} of the copy bandwidth, so bytes were not what "
                 "set its pace")
    if row["stage"] == "+ speculative decoding" and p > 0.8:
        text += ". Few drafted tokens were accepted, so few passes were saved"
    return f"{text} ({where})"


def losses_ledger(result: dict, predictions: list[dict] | None = None) -> list[str]:
    """Where the techniques did not pay on this run, one line each, from its measurements.

    Introduced in notebook 07 (putting it together): stages slower than their base (`why_not`),
    stages that paid less than the bytes per token they removed, speculation against
    batching, the best stage against Hugging Face, and the stages the cost model misses
    (`stack_cost.cost_misses`, given its `predictions`). An empty ledger means nothing lost.
    """
    rows = {r["stage"]: r for r in result["stages"]}
    lines = [f"{r['stage']}: {r['gain']:.2f}x over {r['builds_on']}, slower. Why: {why_not(r, result)}"
             for r in result["stages"] if r["builds_on"] and not r["kept"]]
    for w in removed_work(result):
        ideal = 1 / (w["bytes_per_pass"] * w["passes_per_token"])
        if rows[w["stage"]]["kept"] and ideal > 1.05 and w["gain"] < 0.8 * ideal:
            lines.append(f"{w['stage']}: read {1 / ideal:.2f}x the bytes per token of {w['builds_on']} but gained "
                         f"{w['gain']:.2f}x, not {ideal:.1f}x: bytes were not all that set its pace")
    spec, batched = rows.get("+ speculative decoding"), rows.get("+ int4 weights")
    if spec and batched and spec["tokens_per_s"] < batched["tokens_per_s"]:
        lines.append(f"speculative decoding at batch 1: {spec['tokens_per_s']:.1f} tokens/s against "
                     f"{batched['tokens_per_s']:.1f} for batching {result['slots']} rows on the same int4 model")
    if result.get("stack_vs_hf") is not None and result["stack_vs_hf"] < 1:
        lines.append(f"the best stage ran at {result['stack_vs_hf']:.2f}x {HF_PEER}")
    if predictions:
        lines += [f"cost model, {line}" for line in cost_misses(predictions)]
    return lines
