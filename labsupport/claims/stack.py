"""The handbook chapter's claims of notebook 07 (putting it together), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested."""

from __future__ import annotations

from ..precision import tensor_bytes


def _row(result: dict, name: str) -> dict | None:
    """The row of `run_stack`'s result for stage `name` (None if that stage did not run)."""
    return next((r for r in result["stages"] if r["stage"] == name), None)


def stack_claims(result: dict, model) -> list[dict]:
    """Every claim of the handbook chapter beside what this run measured.

    Introduced in notebook 07 (putting it together). Memory figures are computed from
    the model's tensors; speed figures come from `run_stack`'s result.
    """

    def gain(name):
        row = _row(result, name)
        return None if row is None else f"{row['gain']:.2f}x over {row['builds_on']}"

    low = next((r for r in result["stages"] if r["stage"] in ("+ bf16", "+ fp16")), None)
    fp32_bytes = tensor_bytes(model)
    half_bytes = sum(t.numel() * 2 for t in list(model.parameters()) + list(model.buffers()))
    rows = [
        ("KV cache", "caching keys and values removes the recomputation of the whole sequence at every step",
         gain("+ KV cache")),
        ("batching", "batch 1 -> 16 might give 10-15x throughput, with only a modest latency increase",
         f"{gain('+ static batching')} (batch {result['slots']}; notebook 02 sweeps batch 1-16)"),
        ("mixed precision", "cutting the precision in half halves the memory footprint",
         f"{fp32_bytes / 2**20:.0f} MiB fp32 -> {half_bytes / 2**20:.0f} MiB in 16 bits ({half_bytes / fp32_bytes:.0%})"),
        ("mixed precision", "float16 is faster than float32 on GPUs with tensor cores",
         (f"{low['stage'][2:]}: {low['gain']:.2f}x over {low['builds_on']}" if low else
          "no native 16-bit type on this device: skipped")),
        ("quantization", "int8 works with minimal degradation; int4 noticeable loss but much larger models fit",
         f"{gain('+ int4 weights')}; {_row(result, '+ int4 weights')['same_tokens_as_fp32']:.0%} of tokens equal fp32's "
         "(notebook 04 measures perplexity)"),
        ("speculative decoding", "when draft and target agree, sometimes 2-4x faster",
         f"{gain('+ speculative decoding')} (prompt lookup at batch 1 against batched int4; "
         "notebook 05 measures it at batch 1)"),
        ("continuous batching", "a static batch with one long and three short answers wastes three quarters "
         "of its capacity; continuous batching refills the slots", gain("+ continuous batching")),
        ("all together", "production serving systems combine all of them",
         f"{result['stack_vs_hf']:.1f}x Hugging Face generate() (fp32, one request at a time), best stage: "
         f"{result['best']}" if result.get("stack_vs_hf") else f"best stage: {result['best']}"),
    ]
    return [{"technique": t, "chapter's claim": c, "measured here": m} for t, c, m in rows]
