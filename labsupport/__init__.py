"""labsupport: the engine behind the course on fast LLM text generation.

The package is an index of the course; each module names the notebook that
introduces it:

    hardware     00  device and dtype choice (one dtype parser), bf16 in hardware or emulated
    models/      00  config, the compact Transformer, weight import and layout, the embedded
                     model and its shareable cache (model_cache)
    measure      00  the one timing path (warm-up, sync, repeats, median, spread) and the
                     machine's two roofs: bandwidth and FLOP/s (`probe`, `HardwareProfile`)
    inputs       01  the one place where public inputs are checked (ids, whole numbers, NaN)
    roofline     00  FLOPs and bytes of a decode step, the ridge point, decode sweeps
    kv_cache     01  the static KV cache and its memory formula
    kv_timing    01  time per token by position, with and without the cache
    sampling     01  greedy, temperature, top-k, top-p
    generate     01  prefill / decode_step / generate, and the uncached loop
    batching     02  left padding, attention mask, positions, padding waste
    batch_timing 02  throughput and latency against batch size (runs generate)
    precision    03  fp32 / bf16 / fp16: footprint, agreement, overflow, bf16 support
    variants     03  the model in each precision and weight format, each built once and shared
    linear_swap  04  the linear-layer swap with an undo handle (quantization, weight layout)
    quantize     04  int8 / int4 weight-only layers and kernels (quantize_bnb: bitsandbytes),
                     built from quantize_formats, quantize_kernels, quantize_eval
    speculative  05  drafts, the exact accept/resample rule, cache rollback
    serving/     06  requests, block manager, paged KV cache, schedulers, engine, workloads, metrics
    stack        07  every technique stacked on one workload
    bench/       00+ one module per notebook: its benchmark section(s) and Hugging Face
                     peers; options as a validated dataclass; ``python -m labsupport bench``
    claims       00+ every chapter claim against what was measured, in notebook order
    workloads    00+ every prompt and every CPU / GPU size preset (`PRESETS`)
    plots/, explorers/, checks/   one module per notebook: figures, live explorers, exercise checkers
    report       --  the main job's table: ``python -m labsupport tour``
    cli          --  ``python -m labsupport tour``, ``bench``, ``student``, ``badges``, ``check``
    delivery     --  Colab badges and setup cells, student versions of the notebooks

The technique modules (hardware ... stack) never import the layers built on them
(bench/, claims, plots/, explorers/, checks/, report, cli): tests/test_layering.py.
"""

from .errors import LabError
from .generation import (GenerationResult, TextStreamer, chat_prompt, decode_step, generate,
                       generate_naive, generate_text, prefill)
from .hardware import require_supported_platform, pick_device, pick_dtype
from .roofs import probe
from .kv_cache import StaticKVCache, kv_cache_bytes
from .models.config import PRESETS, ModelConfig
from .models.loading import course_model_name, load_hf_model, load_model, model_config
from .sampling import GREEDY, SamplingConfig

__version__ = "0.1.0"


def notebook_setup() -> None:
    """Check that labsupport runs on this platform (one sentence if not: see `hardware.require_supported_platform`).

    Introduced in notebook 00. A `LabError` needs no set-up to show as one sentence:
    it renders itself (`LabError._render_traceback_`) and still fails its cell, so
    nbval and nbgrader count it. Earlier versions swallowed the error here; this one
    removes any such handler left in a running kernel.
    """
    require_supported_platform()
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and LabError in getattr(shell, "custom_exceptions", ()):
        shell.set_custom_exc((), None)


__all__ = [
    "LabError", "GenerationResult", "TextStreamer", "chat_prompt", "decode_step", "generate",
    "generate_naive", "generate_text", "prefill", "pick_device", "pick_dtype", "probe",
    "StaticKVCache", "kv_cache_bytes", "PRESETS", "ModelConfig", "load_hf_model", "load_model",
    "course_model_name", "model_config",
    "GREEDY", "SamplingConfig", "notebook_setup",
]
