"""Notebook 08's claims (claims/long_context.py) on synthetic measurements: ones that should
hold, ones that should not, and busy ones."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import long_context_busy_reason, long_context_claims


def timing(median, spread=0.0):
    return {"samples": [median], "median": median, "min": median, "max": median * (1 + spread), "spread": spread}


def prefill(quadratic=True):
    rows = []
    for T in (256, 512, 1024, 2048):
        naive_s = 1e-3 * (T / 256) ** (2 if quadratic else 1)
        rows.append({"T": T, "naive_s": naive_s, "fused_s": naive_s / 4, "naive_bytes": 8 * T * T if quadratic else 8 * T,
                     "fused_bytes": 100 * T, "memory": "computed", "naive_over_budget": False,
                     "timings": {"naive_s": timing(naive_s), "fused_s": timing(naive_s / 4)}})
    rows.append({"T": 4096, "naive_s": None, "fused_s": 0.1, "naive_bytes": 8 * 4096 ** 2, "fused_bytes": 100 * 4096,
                 "memory": "computed", "naive_over_budget": True, "timings": {"fused_s": timing(0.1)}})
    return rows


def shares(grows=True):
    rows = []
    for batch in (1, 16):
        for i, context in enumerate((256, 1024, 2048)):
            share = (0.05 + 0.1 * i * (batch / 8 if grows else 0)) if grows else 0.3 - 0.1 * i
            rows.append({"batch": batch, "context": context, "step_s": 0.05 * batch ** 0.5 * (1 + i),
                         "attention_s": share * 0.05, "attention_share": min(share, 0.95), "weight_bytes": 5e8,
                         "cache_bytes": batch * context * 46080, "timings": {"step_s": timing(0.05)}})
    return rows


CROSSOVERS = [{"model": "m", "batch": 1, "context": 11676.0}, {"model": "m", "batch": 16, "context": 11676.0 / 16}]
VARIANTS = [{"variant": "MHA", "kv_heads": 9, "cache_bytes": 900, "attention_s": 0.03},
            {"variant": "GQA", "kv_heads": 3, "cache_bytes": 300, "attention_s": 0.012},
            {"variant": "MQA", "kv_heads": 1, "cache_bytes": 100, "attention_s": 0.006}]
INT8_BYTES = {"int8": 66, "sixteen_bit": 128, "fp32": 256, "head_dim": 64}
QUALITY = {"tokens": 512, "float_ppl": 10.0, "int8_ppl": 10.02, "relative_logit_difference": 0.004,
           "top1_agreement": 0.99}
AGREEMENT = {"new_tokens": 32, "relative_logit_difference": 0.005, "same_tokens": 1.0, "first_difference": None}
WINDOWS = [{"window": 32, "perplexity": 14.0, "cache_bytes": 32, "full_cache_bytes": 512},
           {"window": 128, "perplexity": 10.5, "cache_bytes": 128, "full_cache_bytes": 512},
           {"window": None, "perplexity": 10.0, "cache_bytes": 512, "full_cache_bytes": 512}]


def claims(**changes):
    args = dict(prefill_rows=prefill(), share_rows=shares(), crossovers=CROSSOVERS, variant_rows=VARIANTS,
                int8_bytes=INT8_BYTES, int8_speed={"context": 2048, "batch": 16, "float_s": 0.6, "int8_s": 0.5},
                quality=QUALITY, agreement=AGREEMENT, window_rows=WINDOWS, busy=None)
    args.update(changes)
    return {row["claim"].split(":")[0][:40]: row for row in long_context_claims(**args)}


def verdicts(**changes):
    return [row["verdict"] for row in claims(**changes).values()]


def test_every_claim_holds_on_measurements_that_should_hold():
    assert all(v.startswith("holds") for v in verdicts()), verdicts()
    assert len(verdicts()) == 10


def test_claims_that_should_not_hold():
    bad = verdicts(prefill_rows=prefill(quadratic=False), share_rows=shares(grows=False),
                   crossovers=[{"model": "m", "batch": 1, "context": 100.0}, {"model": "m", "batch": 16, "context": 50.0}],
                   variant_rows=[dict(r, attention_s=0.01) for r in VARIANTS],
                   int8_bytes=dict(INT8_BYTES, sixteen_bit=100),
                   int8_speed={"context": 2048, "batch": 16, "float_s": 0.5, "int8_s": 0.7},
                   quality=dict(QUALITY, int8_ppl=11.0), agreement=dict(AGREEMENT, relative_logit_difference=0.05),
                   window_rows=[dict(r, perplexity=10.0) for r in WINDOWS])
    assert not any(v.startswith("holds") for v in bad), bad
    assert any("dequantizes" in v for v in bad)                       # the int8 cache slower: says why


def test_busy_timings_withhold_the_timed_verdicts_only():
    busy = verdicts(busy="the load average was 3.0 per core")
    timed = [v for v in busy if v.startswith(BUSY_VERDICT)]
    assert len(timed) == 4                                            # naive time, decode share, variants, int8 speed
    assert sum(v.startswith("holds") for v in busy) == 6


def test_busy_reason_sees_spread_load_and_more_work_faster():
    assert long_context_busy_reason(prefill(), shares(), load=0.5) is None
    noisy = prefill()
    noisy[0]["timings"]["naive_s"] = timing(1e-3, spread=0.9)
    assert "disagree" in long_context_busy_reason(noisy, load=None)
    assert "load average" in long_context_busy_reason(load=5.0)
    faster = shares()
    faster[2]["step_s"] = 0.001                                        # batch 1, context 2048 far faster than 256
    assert "less time" in long_context_busy_reason(share_rows=faster)
    assert "the int8" in long_context_busy_reason(timed={"the int8 step": timing(1.0, spread=0.8)})


@pytest.mark.parametrize("speed, word", [(1.0, "no measurable difference"), (0.5, "not here")])
def test_int8_speed_verdicts(speed, word):
    rows = claims(int8_speed={"context": 2048, "batch": 16, "float_s": 0.5 * speed, "int8_s": 0.5})
    assert word in next(r["verdict"] for r in rows.values() if "faster at long context" in r["claim"])
