"""The benchmark's options: one validated dataclass, with a preset per kind of device.

Introduced in notebook 00 (where the time goes); each notebook's section reads its
own fields (named after the section: ``kv_*`` for notebook 01, ``batch_*`` for 02, ...).

`BenchOptions()` is the CPU preset (small: a 2-core machine runs every section in
about a quarter of an hour); `BenchOptions.gpu()` sizes the sweeps and workloads for
a GPU; `BenchOptions.for_device` picks one. The fields that differ between the two
(`device_sizes`) come from `workloads.PRESETS`, the course's one home for sizes.
`from_cli` applies the command line's ``--new-tokens``, ``--repeats`` and
``--kv-lengths`` to every field they stand for.
Every field is checked when an instance is made (also by `dataclasses.replace`): a
wrong value is one sentence (`LabError`), never a traceback from deep inside a section.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..errors import LabError
from ..inputs import finite_number, whole_number
from ..lab.workloads import PRESETS, SERVING_PRESETS, DevicePreset, device_class


def device_sizes(preset: DevicePreset) -> dict:
    """The fields of `BenchOptions` that a device preset (`workloads.PRESETS`) decides.

    Introduced in notebook 00 (where the time goes)."""
    return dict(roofline_batches=preset.roofline_batches, batch_sizes=preset.batch_sizes,
                serving_slots=preset.serving_slots, serving_requests=preset.serving_requests,
                **_serving_sizes(preset),
                stack_requests=preset.stack.requests)


def _serving_sizes(preset: DevicePreset) -> dict:
    """serving_token_budget, serving_curve_requests, serving_curve_slots, serving_curve_loads of the preset's kind
    (`workloads.SERVING_PRESETS`)."""
    sizes = SERVING_PRESETS[next(kind for kind, p in PRESETS.items() if p == preset)]
    return dict(serving_token_budget=sizes.token_budget, serving_curve_requests=sizes.curve_requests,
                serving_curve_slots=sizes.curve_slots, serving_curve_loads=sizes.curve_loads)


CPU_SIZES = device_sizes(PRESETS["cpu"])         # the defaults below

# The fields the command line's --new-tokens and --repeats stand for (see `from_cli`).
NEW_TOKENS_FIELDS = ("new_tokens", "batch_new_tokens", "precision_new_tokens", "quant_new_tokens")
REPEATS_FIELDS = ("repeats", "roofline_repeats", "kv_repeats", "kv_step_repeats", "quant_repeats",
                  "serving_repeats", "stack_repeats", "long_repeats")
# Smallest allowed value of each whole-number field (1 unless listed).
MINIMUM = {"engines_draft_layers": 0, "quant_new_tokens": 2, "quant_slow_new_tokens": 2, "quant_eval_tokens": 2}


@dataclass(frozen=True)
class BenchOptions:
    """Every knob of `python -m labsupport bench`, with its default (the CPU preset).

    Introduced in notebook 00 (where the time goes). Each field says which sections
    read it. Lists are kept as tuples; the whole object goes into the report's JSON
    (`to_dict`).
    """

    # -- shared by several sections --------------------------------------------------------
    new_tokens: int = 128
    """New tokens per generate() call at batch 1: baseline (00) and speculative (05).
    ``--new-tokens`` also sets batch_new_tokens, precision_new_tokens and quant_new_tokens."""
    repeats: int = 5
    """Timed repeats per candidate: baseline (00), batching's batch-16/batch-1 pair and its
    Hugging Face peer (02), precision (03), speculative (05). ``--repeats`` also sets every
    other ``*_repeats`` field."""

    # -- engines (notebook 00) ------------------------------------------------------------
    engines_compile: bool = True
    """Time the compiled rows of engines (labsupport's compiled decode, Hugging Face's static
    cache + torch.compile); each compiles on its first call (minutes on a 2-core CPU)."""
    engines_llamacpp: bool = True
    """Time llama.cpp in engines, where llama-cpp-python is installed (the `peers` extra)."""
    engines_lookup: int = 10
    """Tokens Hugging Face's prompt-lookup row drafts per step: engines."""
    engines_draft_layers: int = 10
    """First layers of the model kept as the draft of Hugging Face's assisted-generation row
    (0: no such row): engines."""

    # -- roofline (notebook 00) -----------------------------------------------------------
    roofline_batches: tuple[int, ...] = CPU_SIZES["roofline_batches"]
    """Batch sizes of roofline's decode-step sweep (past the ridge: dozens on a CPU, hundreds on a GPU)."""
    roofline_context: int = 64
    """Cached positions behind each timed decode step: roofline."""
    roofline_repeats: int = 3
    """Timed repeats of each decode step: roofline."""

    # -- KV cache (notebook 01) -----------------------------------------------------------
    kv_lengths: tuple[int, ...] = (64, 256, 1024)
    """New-token counts at which kv_cache compares the uncached loop with the cache (``--kv-lengths``)."""
    kv_repeats: int = 1
    """Timed repeats of each full cached-vs-uncached pair: kv_cache."""
    kv_step_repeats: int = 3
    """Timed repeats of each single step behind kv_cache's per-position estimate."""
    kv_naive_budget_s: float = 90.0
    """Seconds an uncached run may take before kv_cache estimates it from single steps instead
    (the shortest length always runs in full)."""

    # -- batching (notebook 02) -----------------------------------------------------------
    batch_new_tokens: int = 32
    """New tokens per row in batching's sweep, pair and Hugging Face peer."""
    batch_sizes: tuple[int, ...] = CPU_SIZES["batch_sizes"]
    """Batch sizes of batching's throughput sweep."""

    # -- mixed precision (notebook 03) ----------------------------------------------------
    precision_new_tokens: int = 32
    """New tokens of precision's decode timing (batch 1)."""
    prefill_tokens: int = 512
    """Prompt length of precision's prefill timing."""

    # -- quantization (notebook 04) -------------------------------------------------------
    quant_new_tokens: int = 32
    """New tokens per decode timing of quantization's rows (at least 2: speed is per decode step)."""
    quant_slow_new_tokens: int = 8
    """New tokens for the rows quantization times in a pair with fp32 because they are very slow."""
    quant_repeats: int = 3
    """Timed repeats of quantization's rows, interleaved."""
    quant_eval_tokens: int = 512
    """Tokens of the evaluation text behind quantization's perplexity and top-1 agreement."""

    # -- speculative decoding (notebook 05) -----------------------------------------------
    spec_k: int = 4
    """Tokens drafted per target pass: speculative (ours and Hugging Face's prompt lookup)."""

    # -- continuous batching (notebook 06) ------------------------------------------------
    serving_slots: int = CPU_SIZES["serving_slots"]
    """Batch slots of every server in serving (two cores saturate early: notebook 02)."""
    serving_requests: int = CPU_SIZES["serving_requests"]
    """Requests in serving's long-tailed workload (`workloads.serving_workload`)."""
    serving_repeats: int = 1
    """Timed repeats of serving's whole workload per server."""
    serving_token_budget: int = CPU_SIZES["serving_token_budget"]
    """Tokens per engine step of serving's chunked-prefill servers (at least serving_slots)."""
    serving_curve_requests: int = CPU_SIZES["serving_curve_requests"]
    """Requests served at each rate of serving's load curve."""
    serving_curve_slots: int = CPU_SIZES["serving_curve_slots"]
    """Batch slots of every configuration of serving's load curve (fewer than its requests)."""
    serving_curve_loads: tuple[int, ...] = CPU_SIZES["serving_curve_loads"]
    """Rates of serving's load curve, in percent of the saturation rate measured in the run."""

    # -- putting it together (notebook 07) ------------------------------------------------
    stack_slots: int = 8
    """Batch slots of stack's batched stages."""
    stack_requests: int = CPU_SIZES["stack_requests"]
    """Requests in stack's workload (`workloads.stack_workload`)."""
    stack_repeats: int = 1
    """Timed repeats of every stage of stack."""

    # -- compile (notebook 07; not in the default run) ---------------------------------------
    compile_rows: tuple[str, ...] = ("fp32", "int4")
    """Precisions compile times eager against compiled: any of "fp32", "bf16", "int8", "int4"
    (the GPU preset: all four)."""
    compile_batches: tuple[int, ...] = (1, 8)
    """Batch sizes compile times."""
    compile_new_tokens: int = 64
    """New tokens per timed generate() in compile."""
    compile_inductor_variants: bool = True
    """On a CPU, also time inductor's option variants (freezing, C++ wrapper, max-autotune): compile."""

    # -- long context (notebook 08) ------------------------------------------------------
    long_context: int = 2048
    """Cached positions behind long_context's int8-vs-float decode step (the longest the CPU run times)."""
    long_batch: int = 16
    """Rows of long_context's int8-vs-float decode step."""
    long_prefill_lengths: tuple[int, ...] = (512, 1024, 2048)
    """Prompt lengths of long_context's naive vs fused prefill attention (2048 is its reported figure)."""
    long_naive_budget_mib: int = 512
    """MiB naive attention's score matrices may take before long_context stops running it."""
    long_repeats: int = 3
    """Timed repeats of long_context's pairs, interleaved."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kv_naive_budget_s":
                value = finite_number(value, f.name, minimum=0.0)
            elif f.name == "compile_rows":
                value = _compile_rows(value)
            elif isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise LabError(f"{f.name} must be True or False, got {value!r}.")
            elif isinstance(f.default, tuple):
                value = _whole_numbers(value, f.name)
            else:
                value = whole_number(value, f.name, minimum=MINIMUM.get(f.name, 1))
            object.__setattr__(self, f.name, value)

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def cpu(cls, **changes) -> BenchOptions:
        """The CPU preset (the defaults: `workloads.PRESETS["cpu"]`), with `changes`.
        Introduced in notebook 00."""
        return cls(**{**CPU_SIZES, **changes})

    @classmethod
    def gpu(cls, **changes) -> BenchOptions:
        """The GPU preset (`workloads.PRESETS["gpu"]`): longer sweeps, a larger serving
        workload, with `changes`. Introduced in notebook 00."""
        return cls(**{**device_sizes(PRESETS["gpu"]), "compile_rows": COMPILE_ROWS, **changes})

    @classmethod
    def for_device(cls, device, **changes) -> BenchOptions:
        """`gpu()` on a CUDA device, `cpu()` anywhere else. Introduced in notebook 00."""
        return cls.gpu(**changes) if device_class(device) == "gpu" else cls.cpu(**changes)

    @classmethod
    def from_cli(cls, device, new_tokens: int | None = None, repeats: int | None = None,
                 kv_lengths=None) -> BenchOptions:
        """The preset for `device` with the command line's flags spread over their fields.

        Introduced in notebook 00. ``--new-tokens`` sets every field of `NEW_TOKENS_FIELDS`
        (quantization's two at least 2, its slow rows never above it); ``--repeats`` every
        field of `REPEATS_FIELDS`; ``--kv-lengths`` kv_lengths. None leaves the preset.
        """
        options = cls.for_device(device)
        changes = {}
        if new_tokens is not None:
            whole_number(new_tokens, "new_tokens")
            changes.update(dict.fromkeys(NEW_TOKENS_FIELDS, new_tokens))
            changes["quant_new_tokens"] = max(2, new_tokens)
            changes["quant_slow_new_tokens"] = max(2, min(options.quant_slow_new_tokens, new_tokens))
        if repeats is not None:
            whole_number(repeats, "repeats")
            changes.update(dict.fromkeys(REPEATS_FIELDS, repeats))
        if kv_lengths is not None:
            changes["kv_lengths"] = kv_lengths
        return replace(options, **changes)

    def to_dict(self) -> dict:
        """Every field, lists as lists: what a report's ``"options"`` holds."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


COMPILE_ROWS = ("fp32", "bf16", "int8", "int4")


def _compile_rows(values) -> tuple[str, ...]:
    """`values` as a non-empty tuple of names from COMPILE_ROWS; else one sentence."""
    if isinstance(values, str) or not hasattr(values, "__iter__") or not values \
            or any(v not in COMPILE_ROWS for v in values):
        raise LabError(f"compile_rows must be a non-empty list of {list(COMPILE_ROWS)}, got {values!r}.")
    return tuple(values)


def _whole_numbers(values, name: str) -> tuple[int, ...]:
    """`values` as a non-empty tuple of whole numbers of at least 1; else one sentence."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise LabError(f"{name} must be a list of whole numbers, got {values!r}.")
    values = tuple(whole_number(v, f"every value of {name}") for v in values)
    if not values:
        raise LabError(f"{name} needs at least one value.")
    return values
