"""Measuring each technique, in notebook order: workloads (every prompt and size) at the bottom,
then timing (measure, busy), the two roofs, the roofline, step profiles, KV-cache timing,
batching, precision, quality, speculative formulas, serving workloads, metrics and load
curves, the stack, long context. Imports the engine and weights only.
Introduced in notebook 00 (where the time goes)."""
