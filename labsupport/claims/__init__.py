"""The handbook chapter's claims, each set against what this machine measured, in notebook order.

Introduced in notebook 00 (where the time goes); every notebook ends with its table.

One module per notebook stem (tests/test_stems.py). Shared: ratios. Each function takes that notebook's measurements and returns rows
of plain dicts (claim, measured, verdict, ...), ready for `tables.records_table`; each
module's ``*_section_claims`` takes the dict its benchmark section returned and calls the
same function, so the notebook and the bench judge a claim by one verdict path. The verdicts are computed, with their thresholds in each docstring,
and tested with measurements that should hold and measurements that should not. Where the
machine was busy while it measured (`busy.busy_reason`), a verdict says so instead of judging.

    roofline_claims       00  small batches memory-bound, large ones compute-bound, 1 -> 16 gives 10-15x
    kv_cache_claims       01  the cache removes recomputation, its size formula, a 7B model's cache (computed)
    batching_claims       02  the chapter's 1.0x, batch 16 over batch 1, the regimes, padding
    precision_claims      03  fp16 halves the memory, ~1.5x faster, minimal quality loss
    quantization_claims   04  int8 / int4 memory, speed and quality, per format (quantization_claim: one bench row)
    speculative_claims    05  2-4x when draft and target agree, where a step's time goes, exact output
    serving_claims        06  slots freed, the static waste, time to first token, paged memory
    engine_claims         06  the prefill stall, chunked prefill, prefix caching, the load curve
    stack_claims          07  every technique of the chapter beside the stack's run
    long_context_claims   08  naive vs fused attention, decode at long context, fewer kv-heads, int8 cache, window
    tensor_parallel_claims 10 the same tokens, two all-reduces per layer, where tensor parallelism pays
"""

from .batching import batching_claims, batching_section_claims
from .kv_cache import kv_cache_claims, kv_cache_section_claims, step_busy_reason
from .long_context import long_context_busy_reason, long_context_claims, long_context_section_claims
from .precision import measured_precision_claims, precision_claims, precision_section_claims, summarize_verdicts
from .quantization import (QUANTIZATION_CLAIMS, quantization_claim, quantization_claims,
                           quantization_conclusions, quantization_section_claims)
from .roofline import claims_summary, roofline_claims, roofline_section_claims, sweep_busy_reason
from .serving import engine_claims, prefill_stall, serving_claims, serving_section_claims
from .speculative import speculative_claims, speculative_section_claims
from .stack import measured_stack_claims, stack_claims, stack_section_claims
from .tensor_parallel import tensor_parallel_claims, tensor_parallel_section_claims

__all__ = ["roofline_claims", "claims_summary", "sweep_busy_reason", "kv_cache_claims", "step_busy_reason",
           "batching_claims", "precision_claims", "measured_precision_claims", "summarize_verdicts",
           "QUANTIZATION_CLAIMS", "quantization_claim", "quantization_claims", "quantization_conclusions",
           "speculative_claims", "serving_claims", "engine_claims", "prefill_stall", "stack_claims",
           "measured_stack_claims", "long_context_claims", "long_context_busy_reason", "tensor_parallel_claims",
           # the bench sections' claims: each takes the dict its section returned (`bench.suite.SECTIONS`)
           "roofline_section_claims", "kv_cache_section_claims", "batching_section_claims",
           "precision_section_claims", "quantization_section_claims", "speculative_section_claims",
           "serving_section_claims", "stack_section_claims", "long_context_section_claims",
           "tensor_parallel_section_claims"]
