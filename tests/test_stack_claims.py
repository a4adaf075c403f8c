"""Notebook 07's claims table: every verdict computed from synthetic runs that should hold,
runs that should not, and runs measured on a busy machine (no verdict then)."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import stack_claims
from labsupport.claims.stack import fewer_bytes_finding
from labsupport.lab.stack import HF_PEER, INT4_BATCH_1

LADDER = {"naive loop": None, "+ KV cache": "naive loop", "+ static batching": "+ KV cache",
          "+ bf16": "+ static batching", "+ int4 weights": "+ bf16", INT4_BATCH_1: "+ KV cache",
          "+ speculative decoding": INT4_BATCH_1, "+ continuous batching": "+ int4 weights", HF_PEER: None}


def synthetic_result(speed: dict, device="cpu", load=None, agreement=0.9, int4_share=0.3, noisy=()):
    """A `run_stack`-shaped result from tokens/s per stage; stages in `noisy` disagree with themselves."""
    rows = []
    for stage, base in LADDER.items():
        weights = None if stage == HF_PEER else (1000 if "int4" not in stage and "continuous" not in stage
                                                 and "speculative" not in stage else 1000 * int4_share)
        seconds = 10 / speed[stage]
        rows.append({"stage": stage, "builds_on": base, "tokens_per_s": speed[stage], "precision": "fp32",
                     "gain": speed[stage] / speed[base] if base else None,
                     "cumulative": speed[stage] / speed["naive loop"],
                     "timing": {"median": seconds, "spread": seconds if stage in noisy else 0.0},
                     "weight_bytes": weights, "kv_cache_bytes": None if weights is None else 10,
                     "top1_agreement": None if weights is None else (1.0 if weights == 1000 else agreement)})
        rows[-1]["kept"] = base is not None and rows[-1]["gain"] > 1
    best = max((r for r in rows if r["kept"] and r["stage"] != HF_PEER), key=lambda r: r["tokens_per_s"])
    return {"stages": rows, "slots": 4, "device": device, "load": load, "best": best["stage"],
            "stack_vs_hf": best["tokens_per_s"] / speed[HF_PEER]}


GOOD = {"naive loop": 1.0, "+ KV cache": 4.0, "+ static batching": 44.0, "+ bf16": 66.0, "+ int4 weights": 70.0,
        INT4_BATCH_1: 12.0, "+ speculative decoding": 30.0, "+ continuous batching": 90.0, HF_PEER: 3.0}
BAD = {"naive loop": 10.0, "+ KV cache": 9.0, "+ static batching": 12.0, "+ bf16": 11.0, "+ int4 weights": 11.5,
       INT4_BATCH_1: 8.0, "+ speculative decoding": 7.0, "+ continuous batching": 11.6, HF_PEER: 13.0}


def verdicts(table):
    return {(row["technique"], row["chapter's claim"][:25]): row["verdict"] for row in table}


def by_technique(table, technique, nth=0):
    return [row for row in table if row["technique"] == technique][nth]


def test_every_claim_holds_on_a_run_that_supports_it(tiny_llama):
    table = stack_claims(synthetic_result(GOOD, device="cuda:0", agreement=0.8), tiny_llama)
    assert list(table[0]) == ["technique", "chapter's claim", "measured here", "verdict"]
    assert all(row["verdict"].startswith("holds") or "holds" in row["verdict"] for row in table), verdicts(table)
    assert by_technique(table, "batching")["verdict"] == "holds"                     # 11x >= the chapter's 10x
    assert by_technique(table, "speculative decoding")["verdict"] == "holds"         # 2.5x at batch 1


def test_claims_that_do_not_hold_say_so(tiny_llama):
    table = stack_claims(synthetic_result(BAD, agreement=0.99, int4_share=0.6), tiny_llama)
    assert by_technique(table, "KV cache")["verdict"] == "does not hold here: slower"
    assert by_technique(table, "batching")["verdict"] == "faster, below 10x at batch 4"
    assert by_technique(table, "mixed precision")["verdict"] == "holds"              # the memory halves, always
    assert by_technique(table, "mixed precision", 1)["verdict"].startswith("not tested here: the claim is about GPUs")
    quality = by_technique(table, "quantization")["verdict"]
    assert "less memory saved than claimed" in quality and "less loss than claimed" in quality
    assert by_technique(table, "speculative decoding")["verdict"] == "does not hold here: slower"
    assert by_technique(table, "continuous batching")["verdict"] == "no measurable difference here"
    assert by_technique(table, "all together", 1)["verdict"] == "does not hold here: slower"


def test_a_busy_machine_gets_no_speed_verdict(tiny_llama):
    table = stack_claims(synthetic_result(GOOD, load=3.0), tiny_llama)
    assert by_technique(table, "KV cache")["verdict"].startswith(BUSY_VERDICT)
    assert "load average was 3.0" in by_technique(table, "speculative decoding")["verdict"]
    assert by_technique(table, "mixed precision")["verdict"] == "holds"              # memory: not timed
    # the spread of one stage's repeats spoils only the verdicts drawn from it
    table = stack_claims(synthetic_result(GOOD, noisy={"+ continuous batching"}), tiny_llama)
    assert by_technique(table, "continuous batching")["verdict"].startswith(BUSY_VERDICT)
    assert by_technique(table, "KV cache")["verdict"] == "holds"


@pytest.mark.parametrize("at_1, batched, verdict", [
    (3.0, 1.5, "holds: fewer bytes helped more at batch 1"),
    (1.2, 1.8, "not here: fewer bytes helped more once batched"),
    (1.5, 1.45, "about the same at both batch sizes here")])
def test_fewer_bytes_finding(at_1, batched, verdict):
    speed = dict(GOOD)
    speed[INT4_BATCH_1] = speed["+ KV cache"] * at_1
    speed["+ bf16"] = speed["+ static batching"]                       # so that bf16 x int4 = `batched`
    speed["+ int4 weights"] = speed["+ static batching"] * batched
    finding = fewer_bytes_finding(synthetic_result(speed))
    assert finding["verdict"] == verdict
    assert finding["batch_1"] == pytest.approx(at_1) and finding["batched"] == pytest.approx(batched)
    assert f"{at_1:.2f}x at batch 1" in finding["measured"]
    assert fewer_bytes_finding(synthetic_result(speed, load=5.0))["verdict"].startswith(BUSY_VERDICT)


def test_the_bench_sections_claims_come_from_its_dict(tiny_llama):
    """The stack section stores the model's bytes beside the ladder, so its claims need no model."""
    import json

    from labsupport.bench.stack import model_bytes
    from labsupport.claims import stack_section_claims
    result = synthetic_result(GOOD, device="cuda:0", agreement=0.8)
    section = json.loads(json.dumps({**result, "model_bytes": model_bytes(tiny_llama)}))
    assert stack_section_claims(section) == stack_claims(result, tiny_llama)
