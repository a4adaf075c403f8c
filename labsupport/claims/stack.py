"""The handbook chapter's claims of notebook 07 (putting it together), each set against this run's measurements.

Every verdict is computed here, with its thresholds in the docstring, and tested. A speed
verdict goes through `busy.judge`: when the load probe of the run or the spread of the
timings behind it says the machine was busy, the row says so instead of judging."""

from __future__ import annotations

from ..lab.busy import busy_reason, judge
from ..engine.precision import tensor_bytes
from ..lab.stack import HF_PEER, INT4_BATCH_1
from .ratios import MARGIN, compare_speed

FASTER = MARGIN        # a gain at least this large is "faster"; at most 1 / FASTER, "slower"
CLEARLY = 1.10         # one gain this much larger than another is "more"; closer than that, "about the same"


def _row(result: dict, name: str) -> dict | None:
    """The row of `run_stack`'s result for stage `name` (None if that stage did not run)."""
    return next((r for r in result["stages"] if r["stage"] == name), None)


def _busy(result: dict, *names: str) -> str | None:
    """Why the timings of the stages `names` cannot carry a verdict (`busy.busy_reason`), or None."""
    timings = {name: _row(result, name)["timing"] for name in names
               if _row(result, name) is not None and "timing" in _row(result, name)}
    return busy_reason(timings, load=result.get("load"))


def _speed(result: dict, name: str, holds: float = FASTER, below: str = "") -> tuple[str, str]:
    """(measured, verdict) for the gain of stage `name` over the stage it builds on: "holds" at
    `holds` or more; faster but below it: "faster, " + `below`; within FASTER of 1: no measurable
    difference; else slower. Judged only when the machine was quiet."""
    row = _row(result, name)
    if row is None:
        return "not run here", "not tested here"
    gain = row["gain"]
    measured = f"{gain:.2f}x over {row['builds_on']}"
    verdict = "holds" if gain >= holds else {
        "faster": f"faster, {below}" if below else "holds", "same": "no measurable difference here",
        "slower": "does not hold here: slower"}[compare_speed(gain, FASTER)]
    return measured, judge(verdict, _busy(result, name, row["builds_on"]))


def fewer_bytes_finding(result: dict) -> dict | None:
    """Does reading fewer bytes per weight pay more at batch 1 than batched? From `run_stack`'s result.

    Introduced in notebook 07 (putting it together). Both sides swap the fp32 model for the
    int4 stage's model (16-bit + int4 where the device has 16-bit): at batch 1,
    ``+ int4, batch 1`` over ``+ KV cache``; batched, ``+ int4 weights`` over
    ``+ static batching`` (the product of the 16-bit and int4 gains). Verdict: "holds" when
    the batch-1 gain is at least CLEARLY (1.10) times the batched one, "not here" when the
    batched gain is that much larger, "about the same" between. Returns {"claim",
    "measured", "verdict", "batch_1", "batched"}, or None when a stage is missing.
    """
    rows = [_row(result, name) for name in (INT4_BATCH_1, "+ KV cache", "+ int4 weights", "+ static batching")]
    if any(r is None for r in rows):
        return None
    one, cached, batched, static = rows
    at_1, at_n = one["tokens_per_s"] / cached["tokens_per_s"], batched["tokens_per_s"] / static["tokens_per_s"]
    if at_1 >= CLEARLY * at_n:
        verdict = "holds: fewer bytes helped more at batch 1"
    elif at_n >= CLEARLY * at_1:
        verdict = "not here: fewer bytes helped more once batched"
    else:
        verdict = "about the same at both batch sizes here"
    return {"claim": "(course) reading fewer bytes per weight helps most where a step is memory-bound: "
                     "at batch 1 more than batched",
            "measured": f"{one['precision']} over fp32: {at_1:.2f}x at batch 1, {at_n:.2f}x at batch {result['slots']}",
            "verdict": judge(verdict, _busy(result, INT4_BATCH_1, "+ KV cache", "+ int4 weights", "+ static batching")),
            "batch_1": at_1, "batched": at_n}


def stack_claims(result: dict, model) -> list[dict]:
    """Every claim of the handbook chapter beside what this run measured, with a verdict.

    Introduced in notebook 07 (putting it together). Memory figures come from the model's
    tensors; speed figures from `run_stack`'s result. Thresholds: a speed claim "holds" at a
    gain of FASTER (1.05) or more, or at the chapter's own figure where it gives one (10x for
    batching, 2x for speculative decoding; faster but below it says so); 16 bits "halve" the
    memory at 49-51% of fp32's bytes; int4 fits "much larger models" at 35% of fp32's weight
    bytes or less, and loses "noticeably" below 95% teacher-forced top-1 agreement with fp32.
    The fp16-on-tensor-cores claim is judged on a GPU only. Every speed verdict goes through
    `busy.judge`.
    """
    half_bytes = sum(t.numel() * 2 for t in list(model.parameters()) + list(model.buffers()))
    return measured_stack_claims(result, tensor_bytes(model), half_bytes)


def stack_section_claims(section: dict) -> list[dict]:
    """The stack bench section's claims: `measured_stack_claims` of its dict (the ladder of
    `run_stack` and ``model_bytes``). Introduced in notebook 07 (putting it together)."""
    return measured_stack_claims(section, section["model_bytes"]["fp32"], section["model_bytes"]["half"])


def measured_stack_claims(result: dict, fp32_bytes: int, half_bytes: int) -> list[dict]:
    """`stack_claims` with the model's bytes given: `fp32_bytes` of its tensors in fp32 and
    `half_bytes` at 2 bytes each. Introduced in notebook 07 (putting it together)."""
    slots = result["slots"]
    rows = [("KV cache", "caching keys and values removes the recomputation of the whole sequence at every step",
             *_speed(result, "+ KV cache"))]
    measured, verdict = _speed(result, "+ static batching", holds=10, below=f"below 10x at batch {slots}")
    rows.append(("batching", "batch 1 -> 16 might give 10-15x throughput, with only a modest latency increase",
                 f"{measured} (batch {slots}; notebook 02 sweeps batch 1-16)", verdict))
    rows.append(("mixed precision", "cutting the precision in half halves the memory footprint",
                 f"{fp32_bytes / 2**20:.0f} MiB fp32 -> {half_bytes / 2**20:.0f} MiB in 16 bits "
                 f"({half_bytes / fp32_bytes:.0%})",
                 "holds" if 0.49 <= half_bytes / fp32_bytes <= 0.51 else "does not hold here"))
    low = next((r for r in result["stages"] if r["stage"] in ("+ bf16", "+ fp16")), None)
    if low is None:
        rows.append(("mixed precision", "float16 is faster than float32 on GPUs with tensor cores",
                     "no native 16-bit type on this device: skipped", "not tested here"))
    else:
        measured, verdict = _speed(result, low["stage"])
        if not result["device"].startswith("cuda"):
            verdict = "not tested here: the claim is about GPUs (this is a CPU)"
        rows.append(("mixed precision", "float16 is faster than float32 on GPUs with tensor cores",
                     f"{low['stage'][2:]}: {measured}", verdict))
    rows.append(("quantization", "int8 works with minimal degradation; int4 noticeable loss but much larger "
                 "models fit", *_int4_quality(result)))
    measured, verdict = _speed(result, "+ speculative decoding", holds=2, below="below 2x here")
    rows.append(("speculative decoding", "when draft and target agree, sometimes 2-4x faster",
                 f"{measured} (prompt lookup; both one request at a time)", verdict))
    measured, verdict = _speed(result, "+ continuous batching")
    rows.append(("continuous batching", "a static batch with one long and three short answers wastes three quarters "
                 "of its capacity; continuous batching refills the slots",
                 f"{measured} ({slots} slots each; notebook 06 measures the waste)", verdict))
    finding = fewer_bytes_finding(result)
    if finding is not None:
        rows.append(("all together", finding["claim"], finding["measured"], finding["verdict"]))
    rows.append(("all together", "production serving systems combine all of them", *_all_together(result)))
    return [{"technique": t, "chapter's claim": c, "measured here": m, "verdict": v} for t, c, m, v in rows]


def _int4_quality(result: dict) -> tuple[str, str]:
    """(measured, verdict) of the int4 stage: its weight bytes and top-1 agreement against fp32's."""
    int4, fp32 = _row(result, "+ int4 weights"), _row(result, "+ KV cache")
    if int4 is None or int4.get("weight_bytes") is None:
        return "not run here", "not tested here"
    share = int4["weight_bytes"] / fp32["weight_bytes"]
    measured = f"int4 weights {share:.0%} of fp32's; int8 is not in the stack (notebook 04)"
    memory = "much larger models fit: holds" if share <= 0.35 else "less memory saved than claimed"
    agreement = int4.get("top1_agreement")
    if agreement is None:
        return measured, f"{memory}; quality not measured here (notebook 04)"
    measured += f"; top-1 agreement with fp32 {agreement:.0%} (teacher-forced)"
    quality = "noticeable loss: holds" if agreement < 0.95 else "less loss than claimed here"
    return measured, f"{memory}; {quality}"


def _all_together(result: dict) -> tuple[str, str]:
    """(measured, verdict): the best stage against Hugging Face generate()."""
    if result.get("stack_vs_hf") is None:
        return f"best stage: {result['best']}", "not tested here (no Hugging Face run)"
    ratio = result["stack_vs_hf"]
    measured = (f"{ratio:.1f}x Hugging Face generate() (fp32, one request at a time), best stage: "
                f"{result['best']}")
    verdict = {"faster": "holds: the combined stack is faster", "same": "no measurable difference here",
               "slower": "does not hold here: slower"}[compare_speed(ratio, FASTER)]
    return measured, judge(verdict, _busy(result, result["best"], HF_PEER))
