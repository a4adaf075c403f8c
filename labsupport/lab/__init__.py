"""Measuring each technique, in notebook order. Imports the engine and weights only.

A notebook's own modules carry its stem (tests/test_stems.py): roofline_* (00), kv_cache_* (01),
batching_* (02), precision (03), quantization_* (04), speculative_* (05), serving_* (06, 06b),
stack_* (07), long_context_* (08), http_serving_* (09), tensor_parallel_* (10); a later notebook
may use an earlier one's. Shared: busy, load_curve, measure, progress, prose, quality, roofs,
step_timing, tables, timing_model, variants, workloads. (workloads, pure data, sits at the bottom
and owns every prompt and size; measure and busy time things; roofs holds the machine's two roofs.)
Introduced in notebook 00 (where the time goes)."""
