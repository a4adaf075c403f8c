"""Notebook 07's cost model (lab.stack_cost) and its computed sentences (lab.stack_story): the
inputs come from run_stack's counts, the overhead fit explains the stages it should, and the
prose follows the model's origin and the device's roofline, on the embedded and a hub-shaped config."""

import dataclasses

import pytest

from labsupport.engine.config import PRESETS
from labsupport.lab.roofs import HardwareProfile
from labsupport.lab.speculative_math import expected_tokens_per_call
from labsupport.lab.stack_cost import (cost_inputs, cost_misses, cost_model, explained, fit_overhead, predict_ladder,
                                       predict_tokens_per_s, speculative_passes_per_token)
from labsupport.lab.stack_story import losses_ledger, model_origin_note, regime_sentence, why_not

EMBEDDED = PRESETS["smollm2-135m"]
HUB = dataclasses.replace(PRESETS["smollm2-1.7b-shape"], name="smollm2-1.7b")     # as load_model names it


def ladder(speculation=None) -> dict:
    """A made-up run_stack result: 100 tokens, 4 slots, 540 MB in fp32; `speculation`: the speculative
    stage's row's (run_stack's `_speculation`), None for a row without it."""
    def row(stage, builds_on, weight_bytes, rows, passes, tokens_per_s, fraction=None):
        return {"stage": stage, "builds_on": builds_on, "weight_bytes": weight_bytes, "batch_rows": rows,
                "weight_passes": passes, "tokens_per_s": tokens_per_s, "seconds": 100 / tokens_per_s,
                "bandwidth_fraction": fraction, "precision": "fp32", "top1_agreement": None,
                "speculation": speculation if stage == "+ speculative decoding" else None}
    stages = [row("naive loop", None, 540e6, 1, 100, 2.0), row("+ KV cache", "naive loop", 540e6, 1, 104, 30.0, 0.8),
              row("+ static batching", "+ KV cache", 540e6, 4, 30, 90.0, 0.3),
              row("+ int4 weights", "+ static batching", 85e6, 4, 30, 60.0, 0.02),
              row("+ int4, batch 1", "+ KV cache", 85e6, 1, 104, 40.0),
              row("+ speculative decoding", "+ int4, batch 1", 85e6, 1, 95, 38.0)]
    for r in stages:
        r["gain"] = None if r["builds_on"] is None else r["tokens_per_s"] / next(
            b for b in stages if b["stage"] == r["builds_on"])["tokens_per_s"]
        r["kept"] = r["gain"] is not None and r["gain"] > 1
    return {"stages": stages, "tokens": 100, "slots": 4, "stack_vs_hf": 0.8}


def test_the_reference_reads_bytes_at_the_bandwidth_plus_an_overhead():
    # 1e9 parameters in 16 bits = 2 GB at 10 GB/s: 0.2 s, plus 50 ms; 4 rows, 2 tokens per pass per row
    assert predict_tokens_per_s(1e9, 16, 4, 0.5, 10.0, 50.0) == pytest.approx(4 / (0.5 * 0.25))


def test_cost_inputs_come_from_the_counted_passes_and_the_overhead_is_their_median():
    result = ladder()
    inputs = cost_inputs(result)
    assert [s["stage"] for s in inputs][0] == "+ KV cache"                 # the naive loop is left out
    s = {x["stage"]: x for x in inputs}
    assert s["+ KV cache"]["bits_per_weight"] == 32 and s["+ int4 weights"]["bits_per_weight"] == pytest.approx(85e6 * 8 / 135e6)
    assert s["+ static batching"]["passes_per_token"] == pytest.approx(30 * 4 / 100)
    assert s["+ speculative decoding"]["passes_per_token"] == pytest.approx(0.95)   # no speculation counts: counted
    assert all(x["alpha"] is None and x["k"] is None for x in inputs)
    overhead = fit_overhead(inputs, 20.0)
    beyond = sorted(x["seconds_per_pass"] - x["parameters"] * x["bits_per_weight"] / 8 / 20e9 for x in inputs)
    assert overhead == pytest.approx(1e3 * beyond[len(beyond) // 2])
    predictions = predict_ladder(inputs, 20.0)
    assert all(p["ratio"] == pytest.approx(p["predicted"] / p["measured"]) for p in predictions)
    assert predictions[0]["predicted"] == pytest.approx(predict_tokens_per_s(135e6, 32, 1, 1.04, 20.0, overhead))
    assert explained(1.9) and explained(0.6) and not explained(2.1) and not explained(0.4)
    missed = cost_misses([{"stage": "x", "predicted": 300.0, "measured": 100.0, "ratio": 3.0}])
    assert len(missed) == 1 and "x: predicted 300.0" in missed[0]
    from test_prose_length import sl                  # short sentences (issue 52): none over 25 words
    assert max(sl.words(sentence) for sentence in sl.sentences(missed[0])) <= 25


def test_speculation_gets_its_passes_per_token_from_alpha_and_k():
    assert speculative_passes_per_token(0.6, 4) == pytest.approx(1 / (1 + 0.6 + 0.36 + 0.216 + 0.1296))
    assert speculative_passes_per_token(1.0, 3) == 0.25 and speculative_passes_per_token(0.0, 4) == 1.0
    assert speculative_passes_per_token(0.6, 4) == pytest.approx(1 / expected_tokens_per_call(0.6, 4))
    inputs = cost_inputs(ladder({"k": 4, "alpha": 0.5, "drafted_per_pass": 3.2, "tokens_per_pass": 1.6}))
    spec = next(x for x in inputs if x["stage"] == "+ speculative decoding")
    assert spec["passes_per_token"] is None and (spec["alpha"], spec["k"]) == (0.5, 4)
    assert spec["counted_passes_per_token"] == pytest.approx(0.95)
    predict = cost_model(inputs, 20.0)
    overhead = fit_overhead(inputs, 20.0)
    assert predict.overhead_ms == overhead
    assert predict(spec) == pytest.approx(predict_tokens_per_s(135e6, spec["bits_per_weight"], 1, 1 / 1.9375, 20.0,
                                                               overhead))
    row = next(p for p in predict_ladder(inputs, 20.0) if p["stage"] == spec["stage"])
    assert row["passes_per_token"] == pytest.approx(1 / 1.9375)


def test_the_origin_note_follows_the_model_not_the_course():
    assert "GGUF file in Q4_1" in model_origin_note(EMBEDDED)
    hub = model_origin_note(HUB)
    assert "not from a GGUF" in hub and "Q4_1" not in hub.split("not from a GGUF")[0]
    assert "not from a GGUF" in model_origin_note(dataclasses.replace(EMBEDDED, name="smollm2-135m-hub"))


def test_the_regime_sentence_comes_from_the_roofline_of_each_dtype():
    # an H100-like GPU: fp32 ridge about 20 FLOP/byte (tens of rows), 16-bit about 300 (hundreds)
    gpu = HardwareProfile(device="cuda", name="fake H100", bandwidth=3.0e12, flops={"float32": 60e12, "bfloat16": 900e12})
    text = regime_sentence(gpu, HUB, slots=64)
    assert "float32: ridge 20.0 FLOP/byte" in text and "bfloat16: ridge 300.0 FLOP/byte" in text
    assert "compute-bound in float32" in text and "memory-bound in bfloat16" in text
    cpu = HardwareProfile(device="cpu", name="fake CPU", bandwidth=10e9, flops={"float32": 100e9})
    assert "compute-bound in float32" in regime_sentence(cpu, EMBEDDED, slots=32)


def test_why_not_and_the_ledger_are_computed_from_the_rows():
    result = ladder()
    rows = {r["stage"]: r for r in result["stages"]}
    text = why_not(rows["+ int4 weights"], result)
    assert "0.16x the weight bytes per pass" in text and "ran at 30% of the copy bandwidth" in text
    assert "notebook 04" in text and "CPU" not in text
    assert "Few drafted tokens were accepted" in why_not(rows["+ speculative decoding"], result)
    ledger = losses_ledger(result, [{"stage": "x", "predicted": 1.0, "measured": 10.0, "ratio": 0.1}])
    assert any(line.startswith("+ int4 weights: 0.67x") for line in ledger)
    assert any("Hugging Face" in line for line in ledger) and ledger[-1].startswith("cost model, x")


def test_the_origin_note_follows_the_gguf_file(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_GGUF", "/models/SmolLM2-135M-Instruct-Q8_0.gguf")
    note = model_origin_note(EMBEDDED)
    assert "GGUF file in Q8_0" in note and "not on a 4-bit grid" in note
