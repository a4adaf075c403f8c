"""Issue 52, item 2: the prose the code prints is held to the notebooks' own bar (tests/test_prose_length.py):
no sentence over 35 words, and under 20 words on average per module. Every public function of
labsupport/claims/*.py, lab/prose.py and lab/stack_story.py that returns learner-facing sentences
(the claims tables' cells, the "where it loses here" ledgers, the computed sentences) is called on
small synthetic measurements, the long branches included, and its text split into sentences with
scripts/sentence_lengths.py's rules. No model is loaded: the configs are presets, the runs made up."""

from types import SimpleNamespace

import pytest
import torch

from test_prose_length import sl
from test_batching_claims import FLAT_THEN_LINEAR, QUIET as BATCHING_QUIET, sweep as batching_sweep
from test_long_context_claims import (AGREEMENT, CROSSOVERS, INT8_BYTES, QUALITY, VARIANTS, WINDOWS, prefill,
                                      shares)
from test_roofline_claims import PROFILE, TEXTBOOK, sweep as roofline_sweep
from test_serving_claims import BAD as SERVING_BAD, GOOD as SERVING_GOOD, metrics as serving_metrics, production
from test_speculative_claims import EXACT_SAMPLING, stats, task
from test_stack_claims import BAD as STACK_BAD, GOOD as STACK_GOOD, synthetic_result
from test_stack_cost import EMBEDDED, HUB, ladder

from labsupport.claims import (batching, http_serving, kv_cache, long_context, precision, quantization, roofline,
                               serving, speculative, stack, tensor_parallel)
from labsupport.lab import prose, stack_story
from labsupport.lab.busy import busy_reason
from labsupport.errors import LabError
from labsupport.lab.roofs import HardwareProfile

# Not covered here (not this module's files, or not built by a function): the checkers' feedback
# (labsupport/checks), lab/speculative_k.where_it_loses (05), lab/stack_cost.cost_misses (07's ledger
# with predictions), lab/busy's reasons on their own, and the notebooks' own f-strings.
LONGEST, MEAN = 35, 20          # the notebooks' bar: none over 35 words, under 20 on average
LOAD = 3.0                      # a busy machine: one reason, the load
BUSY = busy_reason(load=LOAD)   # "the load average was 3.0 per core (the measurement alone gives about 1)"
COLUMNS = ("claim", "measured", "verdict", "chapter's claim", "measured here")


def cells(rows):
    """The prose cells of a claims table (its labels, such as a topic or a format, are left out)."""
    rows = [rows] if isinstance(rows, dict) else rows
    return [row[key] for row in rows for key in COLUMNS if isinstance(row.get(key), str)]


# --- the claims, one builder per module: every branch whose words differ, on made-up measurements ---------

def batching_texts(monkeypatch):
    rows = batching_sweep(FLAT_THEN_LINEAR)
    texts = [batching.ridge_text(r) for r in (12.0, float("inf"))]
    texts += [batching.loop_verdict(r) for r in (3.1, 1.0, 0.5)]
    texts += [batching.headline_verdict(r) for r in (12.0, 8.5, 3.0)]
    texts += [batching.regime_verdict(*args) for args in ((None, 300.0, 64), (None, 20.0, 64), (32, 20.0, 64),
                                                          (2, 200.0, 512), (4, 20.0, 64), (None, float("inf"), 64))]
    texts += [batching.padding_verdict(*args) for args in ((0.5, 0.1, 1.4), (0.5, 0.1, 1.0), (0.0, 0.0, 1.0))]
    texts.append(batching.batch_sweep_busy_reason(batching_sweep([50, 52, 130, 60, 90, 220, 440])))
    values = dict(real_over_loop=3.1, ratio_16=9.0, sweep=rows, ridge=20.0, waste=0.5, sorted_waste=0.1,
                  padded_over_sorted=1.4, timings=BATCHING_QUIET, device_type="cpu", load=1.0)
    texts += cells(batching.batching_claims(**values))
    texts += cells(batching.batching_claims(**dict(values, real_over_loop=None, padded_over_sorted=None, load=LOAD)))
    return texts


def http_ledger():
    def row(server, rate, ttft, itl, throughput, errors=0):
        return {"server": server, "rate": rate, "ttft_p50": ttft, "itl_p50": itl, "throughput": throughput,
                "errors": errors, "skipped": None}
    rows = [row(http_serving.INPROC, 1.0, 0.100, 0.020, 30.0), row(http_serving.HTTP, 1.0, 0.130, 0.022, 29.0),
            row(http_serving.INPROC, 4.0, 0.5, 0.03, 60.0), row(http_serving.HTTP, 4.0, 0.7, 0.04, 48.0, errors=2)]
    texts = http_serving.http_losses(rows, [1.0, 4.0], loads=[25, 120], busy=BUSY)
    texts += http_serving.http_losses(rows[:2], [1.0])
    texts += http_serving.http_losses([row(http_serving.INPROC, 1.0, 0.1, 0.02, 30.0),
                                       row(http_serving.HTTP, 1.0, 0.09, 0.02, 30.0)], [1.0])
    texts += http_serving.http_losses(rows[:1], [1.0])
    return texts


def kv_cache_texts(monkeypatch):
    memory, gqa = [(256, 100, 100), (512, 200, 200)], {"num_heads": 9, "kv_heads": 3, "gqa_bytes": 1000, "mha_bytes": 3000}
    seven_b = {"weights": 13 * 2 ** 30, "at_512": 256 * 2 ** 20, "at_128k": 64 * 2 ** 30}
    texts = []
    for speedups, same, busy in (({64: 2.0, 256: 6.0}, True, None), ({64: 1.6, 256: 1.6}, True, None),
                                 ({64: 0.9, 256: 1.0}, True, None), ({64: 2.0}, False, None),
                                 ({64: 2.0, 256: 6.0}, True, BUSY)):
        texts += cells(kv_cache.kv_cache_claims(speedups, (64,), same, memory, gqa, seven_b, busy=busy))
    texts += cells(kv_cache.kv_cache_claims({64: 2.0}, (64,), True, [(256, 100, 120)], dict(gqa, mha_bytes=2000),
                                            dict(seven_b, at_512=2 ** 30, at_128k=8 * 2 ** 30)))
    rows = [{"sequence_length": 16 + 32 * i, "naive_s": n, "cached_s": 0.02} for i, n in enumerate((0.02, 0.09, 0.04))]
    texts.append(kv_cache.step_busy_reason(rows))
    return texts


def long_context_texts(monkeypatch):
    args = dict(prefill_rows=prefill(), share_rows=shares(), crossovers=CROSSOVERS, variant_rows=VARIANTS,
                int8_bytes=INT8_BYTES, int8_speed={"context": 2048, "batch": 16, "float_s": 0.6, "int8_s": 0.5},
                quality=dict(QUALITY, kl_divergence=1e-3), agreement=AGREEMENT, window_rows=WINDOWS, busy=None)
    bad = dict(prefill_rows=prefill(quadratic=False), share_rows=shares(grows=False),
               crossovers=[{"model": "m", "batch": 1, "context": 100.0}, {"model": "m", "batch": 16, "context": 50.0}],
               variant_rows=[dict(r, attention_s=0.01) for r in VARIANTS], int8_bytes=dict(INT8_BYTES, sixteen_bit=100),
               int8_speed={"context": 2048, "batch": 16, "float_s": 0.5, "int8_s": 0.7},
               quality=dict(QUALITY, int8_ppl=11.0), agreement=dict(AGREEMENT, relative_logit_difference=0.05),
               window_rows=[dict(r, perplexity=10.0) for r in WINDOWS])
    texts = cells(long_context.long_context_claims(**args)) + cells(long_context.long_context_claims(**{**args, **bad}))
    texts += cells(long_context.long_context_claims(**dict(args, busy=BUSY)))
    texts += cells(long_context.long_context_claims(**dict(args, share_rows=None, variant_rows=None, quality=None,
                                                           agreement=None, window_rows=None)))
    faster = shares()
    faster[2]["step_s"] = 0.001
    texts.append(long_context.long_context_busy_reason(share_rows=faster))
    return texts + long_context_ledger()


def long_context_ledger():
    losing = [{"T": 256, "naive_s": 0.001, "fused_s": 0.002}, {"T": 4096, "naive_s": None, "fused_s": 0.1}]
    variants = [{"variant": "MHA", "kv_heads": 9, "attention_s": 0.010},
                {"variant": "MQA", "kv_heads": 1, "attention_s": 0.010}]
    texts = long_context.long_context_losses(losing, {"T": 2048, "tiled_s": 0.3, "fused_s": 0.01}, variants,
                                              {"float_s": 0.5, "int8_s": 0.6}, QUALITY,
                                              [{"window": 32, "perplexity": 14.0}, {"window": None, "perplexity": 10.0}],
                                              busy=BUSY)
    texts += long_context.long_context_losses(prefill(), None, VARIANTS, {"float_s": 0.6, "int8_s": 0.5},
                                              dict(QUALITY, int8_ppl=10.0), WINDOWS[2:])
    return texts


def precision_texts(monkeypatch):
    from labsupport.lab.measure import Timing
    monkeypatch.setattr(precision, "precision_choices", lambda device: ["float32", "bfloat16", "float16"])
    monkeypatch.setattr(precision, "emulation_note", lambda device, dtype: (
        "emulated: this CPU has no fp16 (AMX-FP16) instructions" if dtype == "float16" else ""))
    monkeypatch.setattr(precision, "dtype_label", lambda device, dtype: str(dtype))
    quiet = Timing([1.00, 1.01, 0.99]).to_dict()

    def speed(ratio, load=1.0):
        return {"speedup": ratio, "seconds": 1.0, "fp32_seconds": ratio, "note": "", "timing": quiet,
                "fp32_timing": quiet, "load": load}
    gpt2 = {"float32": 474.7002, "float16": 237.3501}
    agreements = {"float16": {"top1_agreement": 0.99, "mean_abs_diff": 0.01, "max_abs_diff": 0.1},
                  "bfloat16": {"top1_agreement": 0.90, "mean_abs_diff": 0.05, "max_abs_diff": 0.5}}
    memory = {"float32": 1000, "bfloat16": 500, "float16": 500}
    texts = [precision.speed_verdict(r, d, e) for r in (1.5, 2.5, 1.1, 0.8) for d in ("cpu", "cuda") for e in (0, 1)]
    for ratio, load in ((1.5, 1.0), (1.1, 1.0), (0.8, 1.0), (1.5, LOAD)):
        speeds = {("decode", "bfloat16"): speed(ratio, load), ("prefill", "bfloat16"): speed(ratio, load),
                  ("prefill", "float16"): {"speedup": None, "note": "skipped: this CPU has no fp16 matrix "
                                           "instructions (AMX-FP16), so fp16 matmuls are emulated and a long "
                                           "prefill would take minutes"}}
        rows = precision.measured_precision_claims("cpu", "smollm2-135m", memory, speeds, agreements, gpt2)
        texts += cells(rows)
        texts.append(precision.summarize_verdicts(rows))
    texts += cells(precision.measured_precision_claims("cpu", "m", {"float32": 1000, "bfloat16": 600}, {}, {},
                                                       {"float32": 474.7, "float16": 237.3}))
    return texts


def quantization_texts(monkeypatch):
    from labsupport.lab.measure import Timing

    def measured(resident, read, speed, perplexity=10.0, **extra):
        return {"resident_fraction": resident, "read_fraction": read, "speed_vs_fp32": speed,
                "timing": Timing([0.010, 0.0101, 0.0099]), "perplexity": perplexity, "top1": 0.97, **extra}
    rows = {"fp32": measured(1.0, 1.0, 1.0), "bf16": measured(0.5, 0.5, 1.1, perplexity=10.05),
            "int8": measured(0.47, 0.25, 2.1, perplexity=10.1, speed_vs_bf16=1.4, kernel="torch._int_mm, fused"),
            "int4 g32": measured(0.37, 0.16, 0.9, perplexity=14.0, kernel="torch._weight_int4pack_mm"),
            "bnb nf4": measured(0.3, 0.15, None, speed_note="not timed: bitsandbytes runs on a GPU only")}
    texts = [quantization.memory_verdict(*a) for a in ((0.5, 0.5, 0.5), (0.37, 0.16, 0.125), (0.4, 0.4, 0.125))]
    texts += [quantization.speed_claim_verdict(r, 3.0) for r in (2.5, 1.5, 0.9)]
    texts += [quantization.quality_verdict(*a) for a in ((0.01, "small"), (0.05, "small"), (0.5, "small"))]
    for load in (None, LOAD):
        claims = quantization.quantization_claims(rows, load=load)
        texts += cells(claims) + [quantization.quantization_conclusions(claims)]
    return texts


def roofline_texts(monkeypatch):
    texts = []
    for seconds, profile, load in ((TEXTBOOK, PROFILE, 1.0), ({**TEXTBOOK, 2: 0.016, 4: 0.018}, PROFILE, 1.0),
                                   ({b: 5 * s for b, s in TEXTBOOK.items()}, PROFILE, 1.0),
                                   ({1: 0.010, 2: 0.010, 4: 0.010, 8: 0.011, 16: 0.011, 32: 0.012, 64: 0.013}, PROFILE, 1.0),
                                   ({1: 0.010, 2: 0.017, 4: 0.019, 8: 0.024, 16: 0.040}, PROFILE, 1.0),
                                   (TEXTBOOK, HardwareProfile(device="cpu", name="low ridge", bandwidth=100e9,
                                                              flops={"float32": 10e9}), 1.0),
                                   (TEXTBOOK, PROFILE, LOAD)):
        claims = roofline.roofline_claims(roofline_sweep(seconds), profile, load=load)
        texts += cells(claims) + [roofline.claims_summary(claims)]
    with_bf16 = HardwareProfile(device="cpu", name="fake CPU", bandwidth=40e6, flops={"float32": 400e6, "bfloat16": 800e6})
    slow = {b: 5 * s for b, s in TEXTBOOK.items()}
    both = [*roofline.roofline_claims(roofline_sweep(slow), with_bf16, load=1.0),
            *roofline.roofline_claims(roofline_sweep(slow, dtype="bfloat16"), with_bf16, load=1.0)]
    noisy = [*roofline.roofline_claims(roofline_sweep(TEXTBOOK, noisy_batch=8), with_bf16, load=LOAD),
             *roofline.roofline_claims(roofline_sweep(TEXTBOOK, noisy_batch=4, dtype="bfloat16"), with_bf16, load=LOAD)]
    texts += [roofline.claims_summary(both), roofline.claims_summary(noisy)]
    texts.append(roofline.sweep_busy_reason(roofline_sweep({1: 0.9, 2: 2.5, 4: 2.5, 8: 0.35, 16: 0.40})))
    texts.append(roofline.claims_summary([]))
    return texts


def serving_texts(monkeypatch):
    from test_serving_claims import step
    toy = SimpleNamespace(steps=[step(0, 1, 0, 4), *[step(i, i + 1, 0, 1) for i in range(1, 31)]], max_slots=4)
    monkeypatch.setattr(serving, "summarize", lambda run: {"slot_utilization": 0.3})
    texts = []
    for values in (SERVING_GOOD, SERVING_BAD):
        texts += cells(serving.serving_claims(**values, toy_static=toy, load=None))
        texts += cells(serving.serving_claims(**values, toy_static=None, load=LOAD))
    for changes in ({}, dict(stall_ratio=1.0, itl=(0.6, 0.5), computed=(400, 300),
                             curve=((1.0, 10.0, 0.5), (4.0, 40.0, 0.6))),
                    dict(throughput=(10.0, 8.0), ttft=(2.0, 1.6))):
        texts += cells(serving.engine_claims(**production(**changes)))
    return texts + serving_ledger()


def serving_ledger():
    speed = {"static": 10.0, "continuous": 10.2, "hf": 12.0}
    metrics = {"static": dict(serving_metrics(0.5, 3.0), steps=40, prefill_tokens_computed=100),
               "continuous": dict(serving_metrics(0.8, 3.0, ttft_p50=0.8), steps=30, prefill_tokens_computed=100)}
    prefix = {"without": metrics["continuous"],
              "with": dict(metrics["continuous"], ttft_p50=0.7, prefill_tokens_computed=40)}
    chunked = {"without": {"itl_p99": 0.2, "throughput": 10.0}, "with": {"itl_p99": 0.18, "throughput": 8.0}}
    sources = {"total": 60, "repeated_prompt": 30, "repeated_requests": 4, "common_prefix": 20}
    busy = {"speed": BUSY, "chunked": BUSY,
            "prefix": "the repeats of continuous disagree by 40% of their median", "costs": None}
    texts = serving.serving_losses(speed, metrics, {"ratio": 1.3}, prefix, chunked,
                                    costs={"gather_share": 0.2, "table_build_share": 0.02}, sources=sources, busy=busy)
    texts += serving.serving_losses({"static": 10.0, "continuous": 20.0, "hf": 10.0}, metrics, {"ratio": 2.0},
                                    {"without": metrics["continuous"], "with": dict(prefix["with"], ttft_p50=0.2)},
                                    {"without": {"itl_p99": 0.3, "throughput": 10.0},
                                     "with": {"itl_p99": 0.1, "throughput": 9.5}})
    return texts


def speculative_texts(monkeypatch):
    texts = []
    grounded = task(2.0, {"prompt lookup": (0.8, stats(0.9, 0.001, 1.0)), "int4 self-draft": (1.5, stats(1.0, 0.2, 1.0))})
    creative = task(2.0, {"prompt lookup": (2.1, stats(0.3, 0.001, 1.5)), "int4 self-draft": (1.6, stats(0.8, 0.2, 1.0))})
    texts += cells(speculative.speculative_claims(grounded, creative, True, EXACT_SAMPLING))
    texts += cells(speculative.speculative_claims(grounded, creative, True, None, load=LOAD))
    grounded = task(2.0, {"prompt lookup": (1.95, stats(0.5, 0.001, 1.0)), "int4 self-draft": (1.9, stats(0.6, 3.0, 1.0))})
    creative = task(2.0, {"prompt lookup": (1.2, stats(0.4, 0.001, 1.0)), "int4 self-draft": (1.9, stats(0.7, 3.0, 1.0))})
    texts += cells(speculative.speculative_claims(grounded, creative, False, {**EXACT_SAMPLING, "tv_target": 0.2}))
    grounded, creative = task(2.0, {"prompt lookup": (1.5, stats(0.9))}), task(2.0, {"prompt lookup": (1.9, stats(0.6))})
    texts += cells(speculative.speculative_claims(grounded, creative, True, {**EXACT_SAMPLING, "tv_draft": 0.04}))
    return texts


def stack_texts(monkeypatch):
    texts = []
    for speed, device, load in ((STACK_GOOD, "cuda:0", None), (STACK_BAD, "cpu", None), (STACK_GOOD, "cpu", LOAD)):
        result = synthetic_result(speed, device=device, load=load)
        texts += cells(stack.measured_stack_claims(result, 540 * 2 ** 20, 270 * 2 ** 20))
    untested = synthetic_result(STACK_GOOD)
    untested["stages"] = [r for r in untested["stages"] if r["stage"] not in ("+ bf16", "+ int4 weights")]
    texts += cells(stack.measured_stack_claims(dict(untested, stack_vs_hf=None), 1000, 500))
    for at_1, batched in ((3.0, 1.5), (1.2, 1.8), (1.5, 1.45)):
        speed = dict(STACK_GOOD, **{"+ int4, batch 1": 4.0 * at_1, "+ bf16": 44.0, "+ int4 weights": 44.0 * batched})
        texts += cells(stack.fewer_bytes_finding(synthetic_result(speed)))
    return texts


def tensor_parallel_result(tp_speed=10.0, prefill_s=0.9, kv_heads=(2, 1)):
    one = {"decode_tokens_per_s": 20.0, "prefill_s": 0.6, "same_tokens": True, "all_reduces_per_step": 60.0,
           "prefill_all_reduces": 60, "all_reduce_share_of_decode": 0.0, "all_reduce_share_of_prefill": 0.0}
    two = dict(one, decode_tokens_per_s=tp_speed, prefill_s=prefill_s, all_reduce_share_of_decode=0.5,
               all_reduce_share_of_prefill=0.2, shares=[{"kv_heads": k} for k in kv_heads])
    return {"prefill_tokens": 512, "degrees": {1: one, 2: two}}


def tensor_parallel_texts(monkeypatch):
    row = {"ttft_slo": 1.0, "tpot_slo": 0.15}
    comparison = {"requests": 12, "same_tokens": True,
                  "handover": {"bytes_per_request": 2 ** 21, "seconds_per_request": 0.0016},
                  "disaggregated": dict(row, goodput=0.74, tpot_p50=0.149),
                  "colocated": dict(row, goodput=2.44, tpot_p50=0.051)}
    texts = []
    for result, busy in ((tensor_parallel_result(), None), (tensor_parallel_result(tp_speed=30.0), None),
                         (tensor_parallel_result(tp_speed=20.5), None), (tensor_parallel_result(), BUSY)):
        texts += cells(tensor_parallel.tensor_parallel_claims(result, busy=busy))
    for goodput in (0.74, 2.5, 3.0):
        texts += cells(tensor_parallel.disaggregation_claims(dict(comparison, disaggregated=dict(row, goodput=goodput,
                                                                                                  tpot_p50=0.149))))
    return texts + tensor_parallel_ledger()


def tensor_parallel_ledger():
    row = {"ttft_slo": 1.0, "tpot_slo": 0.15}
    comparison = {"disaggregated": dict(row, goodput=0.74, tpot_p50=0.149),
                  "colocated": dict(row, goodput=2.44, tpot_p50=0.051)}
    links = [{"link": "NVLink 4 (H100 SXM)", "all_reduces_per_step": 60, "seconds_per_step": 3e-4,
              "share_of_measured_step": 0.004}]
    return (tensor_parallel.tensor_parallel_losses(tensor_parallel_result(), links, comparison)
            + tensor_parallel.tensor_parallel_losses(tensor_parallel_result(40.0, prefill_s=0.3, kv_heads=(1, 1)), []))


# --- lab.prose and lab.stack_story: the sentences computed from the model and the device --------------------

def prose_texts(monkeypatch):
    from labsupport.engine.config import PRESETS
    monkeypatch.delenv("LABSUPPORT_GGUF", raising=False)
    small, hub = PRESETS["smollm2-135m"], PRESETS["smollm2-1.7b-shape"]
    texts = [f(c) for f in (prose.shape_sentence, prose.gqa_sentence, prose.operations_per_step) for c in (small, hub)]
    texts += [prose.origin_sentence(name) for name in ("smollm2-135m", "smollm2-1.7b")]
    texts += [prose.ridge_rows_sentence(c, dtype, context) for c in (small, hub)
              for dtype in (torch.float32, torch.bfloat16) for context in (0, 2048)]
    texts += [prose.pure_roofline_stop(r) for r in (12.0, float("inf"))]
    monkeypatch.setattr(prose, "bf16_emulated", lambda device: False)
    texts.append(prose.bf16_baseline_note("cpu"))
    monkeypatch.setattr(prose, "bf16_emulated", lambda device: True)
    for switched_off in (True, False):
        monkeypatch.setattr(prose, "cpu_bf16_switched_off", lambda: switched_off)
        texts.append(prose.bf16_baseline_note("cpu"))
    sources = {"run_total": 3000, "total": 2900, "shared_prefix": 1800, "common_prefix": 37, "repeated_prompt": 900,
               "repeated_requests": 40, "other_prefix": 300, "matches_run": True}
    texts += [prose.prefix_sources_note(dict(sources, matches_run=m), 16, 256, 216) for m in (True, False)]
    return texts


def stack_story_texts(monkeypatch):
    monkeypatch.delenv("LABSUPPORT_GGUF", raising=False)
    texts = [stack_story.model_origin_note(c) for c in (EMBEDDED, HUB)]
    monkeypatch.setenv("LABSUPPORT_GGUF", "/models/SmolLM2-135M-Instruct-Q8_0.gguf")
    texts.append(stack_story.model_origin_note(EMBEDDED))
    gpu = HardwareProfile(device="cuda", name="fake H100", bandwidth=3.0e12, flops={"float32": 60e12, "bfloat16": 900e12})
    texts += [stack_story.regime_sentence(gpu, HUB, slots=64), stack_story.regime_sentence(PROFILE, EMBEDDED, slots=4)]
    result = ladder()
    rows = {r["stage"]: r for r in result["stages"]}
    texts += [stack_story.why_not(rows[name], result) for name in ("+ int4 weights", "+ speculative decoding")]
    texts.append(stack_story.why_not(dict(rows["+ int4 weights"], stage="+ other"), result))
    return texts + stack_ledger()


def stack_ledger():
    return stack_story.losses_ledger(ladder())


BUILDERS = {"claims/batching": batching_texts, "claims/http_serving": lambda monkeypatch: http_ledger(),
            "claims/kv_cache": kv_cache_texts,
            "claims/long_context": long_context_texts, "claims/precision": precision_texts,
            "claims/quantization": quantization_texts, "claims/roofline": roofline_texts,
            "claims/serving": serving_texts, "claims/speculative": speculative_texts, "claims/stack": stack_texts,
            "claims/tensor_parallel": tensor_parallel_texts, "lab/prose": prose_texts,
            "lab/stack_story": stack_story_texts}


# The "where it loses here" ledgers of notebooks 06-10, each on its own: a few long lines cannot hide
# behind a module's many short table cells.
LEDGERS = {"claims.serving.batching_losses + engine_losses (06, 06b)": serving_ledger,
           "claims.long_context.long_context_losses (08)": long_context_ledger,
           "claims.http_serving.http_losses (09)": http_ledger,
           "claims.tensor_parallel.tensor_parallel_losses (10)": tensor_parallel_ledger,
           "lab.stack_story.losses_ledger (07)": stack_ledger}


def sentences(texts):
    return [s for text in texts for s in sl.sentences(text)]


@pytest.mark.parametrize("module", BUILDERS)
def test_no_printed_sentence_is_over_35_words(module, monkeypatch):
    found = sentences(BUILDERS[module](monkeypatch))
    assert len(found) >= 10, f"{module}: only {len(found)} sentences built; is the text read?"
    long = sorted({s for s in found if sl.words(s) > LONGEST}, key=sl.words, reverse=True)
    assert not long, f"{module}: {len(long)} sentence(s) over {LONGEST} words:\n" + "\n".join(
        f"({sl.words(s)}) {s}" for s in long)


@pytest.mark.parametrize("module", BUILDERS)
def test_printed_sentences_average_under_20_words(module, monkeypatch):
    counts = [sl.words(s) for s in sentences(BUILDERS[module](monkeypatch))]
    mean = sum(counts) / len(counts)
    assert mean < MEAN, f"{module}: its printed sentences average {mean:.1f} words (limit {MEAN})"


@pytest.mark.parametrize("ledger", LEDGERS)
def test_each_where_it_loses_ledger_averages_under_20_words(ledger):
    counts = [sl.words(s) for s in sentences(LEDGERS[ledger]())]
    assert len(counts) >= 8 and sum(counts) / len(counts) < MEAN, (ledger, len(counts), sum(counts) / len(counts))


def test_the_prefix_sources_note_keeps_every_number_in_short_sentences():
    """06b's "of the N prompt tokens taken from the cache ..." was one sentence of 52-71 words."""
    sources = {"run_total": 3000, "total": 2900, "shared_prefix": 1800, "common_prefix": 37, "repeated_prompt": 900,
               "repeated_requests": 40, "other_prefix": 300, "matches_run": False}
    note = prose.prefix_sources_note(sources, 16, 256, 216)
    for number in ("3000", "1800", "37", "16", "900", "30%", "40", "256", "216", "300", "2900"):
        assert number in note, number
    assert "estimates" in note
    assert "estimates" not in prose.prefix_sources_note(dict(sources, matches_run=True), 16, 256, 216)
    with pytest.raises(LabError, match="prefix_cache_sources"):
        prose.prefix_sources_note({"run_total": 3000}, 16, 256, 216)


def test_the_ridge_lines_never_print_an_infinite_batch():
    """At a long context no GPU reaches its fp32 ridge: the lines say so instead of "batch inf to inf"."""
    from labsupport.engine.config import PRESETS
    text = prose.ridge_rows_sentence(PRESETS["smollm2-135m"], torch.float32, context=2048)
    assert "inf" not in text and "no GPU reaches its fp32 ridge" in text
    assert "batch 19 to 51" in prose.ridge_rows_sentence(PRESETS["smollm2-135m"], torch.float32)
