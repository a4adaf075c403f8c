"""Every prompt and every CPU / GPU size preset of the course, in one place.

Introduced in notebook 00 (where the time goes); every notebook, its explorer and
the benchmark (`bench.options.BenchOptions`) read their workload sizes here.

What a 2-core laptop CPU finishes in a minute, a data-centre GPU finishes in well
under a second, so each size comes in two presets (`PRESETS`): "cpu", small enough
that every notebook runs top to bottom in a few minutes on two cores, and "gpu",
large enough to be timed above a GPU's launch overhead and to reach the batch sizes
where its decode step stops being memory-bound. `device_class` says which preset a
device gets: a CUDA device is a "gpu"; any other device, the never-tested Apple GPU
included, gets the CPU's sizes. The prompts are plain constants. This module is pure
data at the bottom of lab/: it imports no other module of the package, and every other
one reads its prompts and sizes here (`serving_workload.serving_workload` and
`stack_workload` turn the chat questions into the requests of notebooks 06 and 07).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# --- prompts --------------------------------------------------------------------------------

# notebook 00 (bench baseline) and 04 (bench quantization): a chat question with a long answer
DEFAULT_PROMPT = "Explain in a few paragraphs why the sky is blue and why sunsets are red."
# notebook 01 (bench kv_cache): a story opening, continued for hundreds of tokens
KV_PROMPT = "Once upon a time, in a small village by the sea,"
# notebook 02 (bench batching): one chat prompt repeated down the batch in the throughput sweep
STORY_PROMPT = "Tell me a story about a lighthouse keeper."
BATCHING_PROMPTS = [        # very different lengths in one batch: the padding example (notebook 02 too)
    "Hi!",
    "Name three colours.",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in detail, step by step, how a refrigerator moves heat from its inside to the room around it.",
    "Summarize the plot of a detective story in which a missing painting is found in the museum's own basement.",
    "List five vegetables.",
    "Why is the sky blue? Give the physical reason, mention Rayleigh scattering, and explain sunsets too.",
]
# notebook 02's explorer: prompts of any length are cut from this text (repeated)
BATCHING_SOURCE_TEXT = ("A lighthouse keeper lived alone on a rock far out at sea. Every evening he climbed the "
                        "spiral stairs, trimmed the wick, polished the great lens and watched the beam sweep "
                        "across the water, counting the ships that passed safely in the dark. ")
# notebook 05 and its bench section: a grounded task (the answer repeats the prompt) and a creative one
GROUNDED_TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at six. He trimmed the wick, "
    "polished the great lens with a soft cloth, and wrote the weather in a thick logbook: wind from "
    "the north-west, a grey sea, two fishing boats back before dark. In winter the storms kept him "
    "awake, and he counted the seconds between each flash and the thunder. In summer he painted the "
    "railings white and watched the ferries cross the bay. When the light was finally automated, he "
    "kept the logbook going for another year, out of habit, and then gave it to the village library."
)
GROUNDED_PROMPT = "Repeat the following text word for word, without any comment:\n\n" + GROUNDED_TEXT
CREATIVE_PROMPT = "Write a short original poem about a fox who learns to play the violin."
# notebooks 06 and 07 and their bench sections: everyday chat questions, cycled through (`serving_workload`)
CHAT_QUESTIONS = [
    "Why is the sky blue?",
    "Give me three tips for a good night's sleep.",
    "What is a transformer in machine learning?",
    "Write a haiku about autumn leaves.",
    "Explain what a black hole is to a child.",
    "How do vaccines work?",
    "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet.",
    "Why do cats purr?",
    "How does a refrigerator keep food cold?",
    "List five fruits that are rich in vitamin C.",
    "What causes the seasons on Earth?",
]
# notebook 03 and its bench section: the short prompt that decode continues ...
LIGHTHOUSE_PROMPT = "The history of the lighthouse begins with fires lit on hills by the sea."
# ... and real text for the prefill and the logit agreement (notebook 03)
LIGHTHOUSE_TEXT = ("Long before electric lamps, sailors steered by fires kept burning on headlands and towers. "
                   "The most famous of them stood at Alexandria, where a tall stone tower carried a fire whose "
                   "light, it was said, could be seen far out at sea. Later lighthouses used oil lamps, then "
                   "mirrors and lenses that gathered the light into a beam, and keepers lived beside them to "
                   "trim the wicks and wind the clockwork that turned the lens through the night.")


# --- sizes, one preset per kind of device ---------------------------------------------------

@dataclass(frozen=True)
class PrecisionWorkload:
    """How big each of notebook 03's measurements is (`explorers.precision.PrecisionLab`).

    Introduced in notebook 03 (mixed precision). decode_tokens: new tokens generated at
    batch 1 (memory-bound); prefill_tokens: prompt length of the prefill (compute-bound);
    agreement_tokens: positions whose logits are compared with fp32; repeats: timed rounds
    per side-by-side comparison.
    """

    decode_tokens: int
    prefill_tokens: int
    agreement_tokens: int
    repeats: int

    @classmethod
    def for_device(cls, device) -> PrecisionWorkload:
        """This device's preset (`PRESETS`): small on a CPU, larger on a GPU. Notebook 03."""
        return preset(device).precision


@dataclass(frozen=True)
class StackWorkload:
    """Notebook 07's sizes. Introduced in notebook 07 (putting it together).

    requests: `stack_workload`'s default count, also the bench's ``stack_requests``;
    notebook_requests, slots, repeats: the notebook's ladder (`stack.run_stack`);
    explorer_requests: the requests each Run of its explorer serves.
    """

    requests: int
    notebook_requests: int
    slots: int
    repeats: int
    explorer_requests: int


@dataclass(frozen=True)
class DevicePreset:
    """Every workload size that depends on the kind of device, for one kind (`PRESETS`).

    Introduced in notebook 00 (where the time goes)."""

    roofline_batches: tuple[int, ...]           # notebook 00, its explorer, the bench's roofline
    linear_batches: tuple[int, ...]             # notebook 00: one linear layer swept past its ridge
    batch_sizes: tuple[int, ...]                # notebook 02's sweep, its explorer, the bench's batching
    batching_explorer_max_batch: int | None     # notebook 02's explorer: largest batch offered
    kv_explorer_max_length: int                 # notebook 01's explorer: longest sequence offered
    precision: PrecisionWorkload                # notebook 03 and its explorer
    serving_slots: int                          # notebook 06 and the bench's serving section
    serving_requests: int                       # notebook 06 and the bench's serving section
    stack: StackWorkload                        # notebook 07, its explorer, the bench's stack


PRESETS: dict[str, DevicePreset] = {
    "cpu": DevicePreset(
        roofline_batches=(1, 2, 4, 8, 16, 32, 48),      # past a small CPU's ridge (a few dozen rows)
        linear_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),   # one layer crosses it at about the same batch
        batch_sizes=(1, 2, 4, 8, 16, 32, 64),   # two cores turn compute-bound well before 64
        batching_explorer_max_batch=32,         # each point is measured while the learner waits
        kv_explorer_max_length=1024,            # the uncached loop grows quadratically: keep it to seconds
        precision=PrecisionWorkload(
            decode_tokens=16,                   # a few seconds per precision, emulated bf16 included
            prefill_tokens=256,                 # long enough to be compute-bound on a CPU
            agreement_tokens=64,                # 64 positions x the whole vocabulary: plenty of logits
            repeats=3),                         # a median of three, timed side by side
        serving_slots=8,                        # two cores saturate early (notebook 02)
        serving_requests=24,                    # a long tail of answers: five servers in about two minutes
        stack=StackWorkload(
            requests=8,                         # every stage, the naive loop included, in minutes
            notebook_requests=8,                # as the bench: the naive loop is the slow stage
            slots=4,                            # the batched stages: two cores saturate early
            repeats=1,                          # every stage once: the ladder already takes minutes
            explorer_requests=4),               # each Run answers in seconds
    ),
    "gpu": DevicePreset(
        roofline_batches=(1, 4, 16, 64, 128, 256, 512),   # a GPU stays memory-bound to hundreds of rows
        linear_batches=(1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096),
        # up to 512, as the roofline sweep: a GPU's ridge (100-300 FLOP/byte) is crossed only past a
        # few hundred rows, so a sweep that stops at 256 may never see the curve bend
        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        batching_explorer_max_batch=None,       # every batch size of `batching.batch_sizes`: seconds each
        kv_explorer_max_length=4096,            # long contexts are cheap enough to explore on a GPU
        precision=PrecisionWorkload(
            decode_tokens=64,                   # more steps: a short decode is launch overhead only
            prefill_tokens=2048,                # a GPU needs long prompts to be compute-bound
            agreement_tokens=256,               # cheap on a GPU: a steadier agreement figure
            repeats=10),                        # short runs: more rounds for a stable median
        serving_slots=64,                       # a GPU batches many rows at little cost per step
        serving_requests=256,                   # enough requests to keep 64 slots busy
        stack=StackWorkload(
            requests=64,                        # enough requests to fill the batched stages' slots
            notebook_requests=32 * 4,           # four batches of the notebook's 32 slots
            slots=32,                           # a GPU batches many rows at little cost per step
            repeats=2,                          # twice, interleaved: short runs are noisier
            explorer_requests=16),              # each Run still answers in seconds
    ),
}


@dataclass(frozen=True)
class ServingSizes:
    """Notebook 06's sizes beyond the slots and the requests of `DevicePreset`, per kind of
    device (`SERVING_PRESETS`). Introduced in notebook 06 (continuous batching).

    token_budget: tokens per engine step of the chunked-prefill servers; curve_requests,
    curve_slots: requests served at each rate of the load curve, and the servers' batch slots
    there (fewer slots than requests, so that a queue can form); curve_median_new_tokens,
    curve_max_new_tokens: its answer lengths; curve_loads: its rates, in percent of the
    saturation rate measured in the run.
    """

    token_budget: int
    curve_requests: int
    curve_slots: int
    curve_median_new_tokens: int
    curve_max_new_tokens: int
    curve_loads: tuple[int, ...]


SERVING_PRESETS: dict[str, ServingSizes] = {
    "cpu": ServingSizes(token_budget=32,           # a prompt chunk or two beside the decodes of a few slots
                        curve_requests=12,         # four configurations x three rates in about a minute
                        curve_slots=4,             # three requests per slot: a queue forms past capacity
                        curve_median_new_tokens=8, curve_max_new_tokens=32,
                        curve_loads=(50, 90, 200)),   # light, near saturation, overloaded
    "gpu": ServingSizes(token_budget=512,          # chunked prefill's usual order of magnitude on a GPU
                        curve_requests=256,        # four batches of 64 slots at each rate
                        curve_slots=64,
                        curve_median_new_tokens=16, curve_max_new_tokens=128,
                        curve_loads=(25, 50, 75, 90, 110, 150, 200)),   # a curve with a visible knee
}


def device_class(device) -> str:
    """ "gpu" for a CUDA device, "cpu" for any other: which of `PRESETS` a device gets.

    Introduced in notebook 00 (where the time goes)."""
    return "gpu" if torch.device(device).type == "cuda" else "cpu"


# Random weights at SmolLM2-1.7B's shape: the model speed sweeps time on a GPU whose memory holds it.
TIMING_MODEL = "smollm2-1.7b-shape"
TIMING_MODEL_PARAMETERS = 1_711_376_384   # that shape's num_parameters (checked in tests/test_gpu_simulated.py)
TIMING_MODEL_WEIGHT_SHARE = 4      # its weights may take a quarter of the GPU; caches and activations, the rest


def timing_model_name(device, dtype=torch.float32) -> str | None:
    """The model a timed sweep in `dtype` uses instead of the course's on `device`, or None (the course's).

    Introduced in notebook 00 (where the time goes). On a GPU the 135M model's batch-1 step is
    launch-bound: a few percent of the memory bandwidth, int4 and int8 no faster than 16-bit,
    a batch sweep that never bends. `TIMING_MODEL` (random weights at SmolLM2-1.7B's shape,
    built on the device: no download) reads 13x the bytes per step. It is used where its weights
    in `dtype` take at most a quarter of the GPU's memory (`TIMING_MODEL_WEIGHT_SHARE`), so that
    the sweeps' caches fit beside it: in 16-bit (3.4 GB) a GPU of 13 GiB or more (a T4) holds
    it, in fp32 (6.8 GB) only a GPU of 26 GiB or more. Every CPU keeps the course's model. Only speed is measured on
    it: its tokens mean nothing.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    weights = TIMING_MODEL_PARAMETERS * torch.empty((), dtype=dtype).element_size()
    return TIMING_MODEL if weights * TIMING_MODEL_WEIGHT_SHARE <= total else None


def preset(device) -> DevicePreset:
    """The workload sizes for `device` (`PRESETS`). Introduced in notebook 00 (where the time goes)."""
    return PRESETS[device_class(device)]


# --- notebook 08's sizes (long context) ---------------------------------------------------------

@dataclass(frozen=True)
class LongContextWorkload:
    """How big each of notebook 08's measurements is, per kind of device (`LONG_CONTEXT_PRESETS`).

    Introduced in notebook 08 (long context). prefill_lengths: prompt lengths T of naive vs
    fused prefill attention (one layer); naive_budget_bytes: the memory naive attention's
    score matrices may take before it is no longer run; decode_contexts, decode_batches: the
    decode-step sweep (attention's share); long_context: the context of the MHA/GQA/MQA and
    int8-vs-float timings (at the largest decode batch); eval_tokens: tokens of the evaluation
    text behind the perplexities; windows: sliding windows tried (None: full attention);
    repeats: timed rounds, interleaved; explorer_max_context: the explorer's longest context;
    cache_budget_bytes: the most that caches timed side by side may take together (None: half
    the GPU's free memory, read when the notebook runs), which sets their batch
    (`long_context.batch_that_fits`).
    """

    prefill_lengths: tuple[int, ...]
    naive_budget_bytes: int
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    long_context: int
    eval_tokens: int
    windows: tuple[int | None, ...]
    repeats: int
    explorer_max_context: int
    cache_budget_bytes: int | None = None


LONG_CONTEXT_PRESETS: dict[str, LongContextWorkload] = {
    "cpu": LongContextWorkload(
        prefill_lengths=(256, 512, 1024, 2048, 4096),   # naive's scores: 18 MiB at 512 ... 1.1 GiB at 4096
        naive_budget_bytes=512 * 2**20,                 # so naive stops after 2048 (288 MiB) on two cores
        decode_contexts=(256, 1024, 2048),              # batch 16 x 2048 x 45 KiB = 1.4 GiB of fp32 cache
        decode_batches=(1, 16),                         # the two batch sizes
        long_context=2048,                              # the longest context the CPU run times
        eval_tokens=512,                                # one forward pass of 512 tokens per window: seconds
        windows=(32, 64, 128, 256, None),
        repeats=3,                                      # a median of three, interleaved
        explorer_max_context=8191,                      # the explorer computes; it measures at most one step
        cache_budget_bytes=768 * 2**20),                # Binder's 2 GiB holds the model and this beside it
    "gpu": LongContextWorkload(
        prefill_lengths=(1024, 2048, 4096, 8192, 16384, 32768),
        naive_budget_bytes=16 * 2**30,                  # 16 GiB of scores: naive stops after 8192 (4.5 GiB)
        decode_contexts=(512, 2048, 8000),              # up to the model's 8192 positions
        decode_batches=(1, 16),
        long_context=8000,
        eval_tokens=1024,                               # the whole evaluation text
        windows=(32, 64, 128, 256, 512, None),
        repeats=10,                                     # short runs: more rounds for a stable median
        explorer_max_context=8191),
}


def long_context_workload(device) -> LongContextWorkload:
    """Notebook 08's sizes for `device` (`LONG_CONTEXT_PRESETS`). Introduced in notebook 08 (long context)."""
    return LONG_CONTEXT_PRESETS[device_class(device)]


@dataclass(frozen=True)
class HttpServingSizes:
    """Notebook 09's workload per kind of device (serving over HTTP): requests per rate, batch
    slots, answer lengths, the rates in percent of the in-process saturation rate, and whether
    our server is also served with int4 weights (the CPU's W4A8 kernel, against llama.cpp's)."""

    requests: int
    slots: int
    median_new_tokens: int
    max_new_tokens: int
    loads: tuple[int, ...]
    int4_server: bool
    # the agentic workload (`loadgen.agentic_workload`), served with and without prefix caching
    conversations: int
    turns: int
    system_chars: int
    ttft_slo_ms: int
    tpot_slo_ms: int


HTTP_SERVING_PRESETS = {
    "cpu": HttpServingSizes(requests=8, slots=4, median_new_tokens=8, max_new_tokens=24, loads=(25, 60, 120),
                            int4_server=True, conversations=4, turns=3, system_chars=4000, ttft_slo_ms=2000,
                            tpot_slo_ms=200),
    # on a GPU the peer is vLLM in fp32; the int4 server's CUDA graphs have never run on one
    "gpu": HttpServingSizes(requests=128, slots=32, median_new_tokens=16, max_new_tokens=128,
                            loads=(25, 50, 75, 100, 150), int4_server=False, conversations=32, turns=4,
                            system_chars=12000, ttft_slo_ms=500, tpot_slo_ms=50),
}
