"""The handbook chapter's claims, each set against what this machine measured, in notebook order.

Introduced in notebook 00 (where the time goes); every notebook ends with its table.

One module per notebook. Each function takes that notebook's (or its benchmark section's)
measurements and returns rows of plain dicts (claim, measured, verdict, ...), ready for
`tables.records_table`. The verdicts are computed, with their thresholds in each docstring,
and tested with measurements that should hold and measurements that should not. Where the
machine was busy while it measured (`busy.busy_reason`), a verdict says so instead of judging.

    roofline_claims       00  small batches memory-bound, large ones compute-bound, 1 -> 16 gives 10-15x
    batching_claims       02  the chapter's 1.0x, batch 16 over batch 1, the regimes, padding
    precision_claims      03  fp16 halves the memory, ~1.5x faster, minimal quality loss
    quantization_claim    04  int8 / int4 memory and speed, per benchmark row
    stack_claims          07  every technique of the chapter beside the stack's run
"""

from .batching import batching_claims
from .precision import precision_claims
from .quantization import QUANTIZATION_CLAIMS, quantization_claim
from .roofline import roofline_claims
from .stack import stack_claims

__all__ = ["roofline_claims", "batching_claims", "precision_claims", "QUANTIZATION_CLAIMS",
           "quantization_claim", "stack_claims"]
