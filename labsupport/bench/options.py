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
from ..workloads import PRESETS, DevicePreset, device_class


def device_sizes(preset: DevicePreset) -> dict:
    """The fields of `BenchOptions` that a device preset (`workloads.PRESETS`) decides.

    Introduced in notebook 00 (where the time goes)."""
    return dict(roofline_batches=preset.roofline_batches, batch_sizes=preset.batch_sizes,
                serving_slots=preset.serving_slots, serving_requests=preset.serving_requests,
                stack_requests=preset.stack.requests)


CPU_SIZES = device_sizes(PRESETS["cpu"])         # the defaults below

# The fields the command line's --new-tokens and --repeats stand for (see `from_cli`).
NEW_TOKENS_FIELDS = ("new_tokens", "batch_new_tokens", "precision_new_tokens", "quant_new_tokens")
REPEATS_FIELDS = ("repeats", "roofline_repeats", "kv_repeats", "kv_step_repeats", "quant_repeats",
                  "serving_repeats", "stack_repeats")
# Smallest allowed value of each whole-number field (1 unless listed).
MINIMUM = {"quant_new_tokens": 2, "quant_slow_new_tokens": 2, "quant_eval_tokens": 2}


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

    # -- putting it together (notebook 07) ------------------------------------------------
    stack_slots: int = 8
    """Batch slots of stack's batched stages."""
    stack_requests: int = CPU_SIZES["stack_requests"]
    """Requests in stack's workload (`workloads.stack_workload`)."""
    stack_repeats: int = 1
    """Timed repeats of every stage of stack."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kv_naive_budget_s":
                value = finite_number(value, f.name, minimum=0.0)
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
        return cls(**{**device_sizes(PRESETS["gpu"]), **changes})

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


def _whole_numbers(values, name: str) -> tuple[int, ...]:
    """`values` as a non-empty tuple of whole numbers of at least 1; else one sentence."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise LabError(f"{name} must be a list of whole numbers, got {values!r}.")
    values = tuple(whole_number(v, f"every value of {name}") for v in values)
    if not values:
        raise LabError(f"{name} needs at least one value.")
    return values
