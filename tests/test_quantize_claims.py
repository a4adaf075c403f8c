"""Notebook 04's claims table: memory on resident bytes (read per token beside them), speed
against fp32 with the ratio to bf16 beside it, quality by the rise in perplexity; speed
verdicts withheld on a busy machine; the conclusions written from the verdicts."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import quantization_claim
from labsupport.claims.quantization import (chapter_format, loss_of, memory_verdict, quantization_claims,
                                            quantization_conclusions, quality_verdict, speed_claim_verdict)
from labsupport.lab.measure import Timing

QUIET = Timing([0.010, 0.0101, 0.0099])
NOISY = Timing([0.010, 0.020, 0.011])


def measured(resident, read, speed, perplexity=10.0, timing=QUIET, **extra):
    return {"resident_fraction": resident, "read_fraction": read, "speed_vs_fp32": speed,
            "timing": timing, "perplexity": perplexity, "top1": 0.97, **extra}


def table(**rows):
    return {"fp32": measured(1.0, 1.0, 1.0), **rows}


def claim(claims, topic, weights):
    return next(c for c in claims if c["topic"] == topic and c["weights"] == weights)


def test_rows_name_the_chapters_format():
    assert [chapter_format(n) for n in ("fp32", "bf16", "int8", "int4 g128", "bnb int8", "bnb nf4")] == \
        [None, "bf16", "int8", "int4", "int8", "int4"]
    assert quantization_claim("int4 g32", 1) == "~3x" and quantization_claim("fp32", 0) is None


@pytest.mark.parametrize("resident, read, verdict", [
    (0.50, 0.50, "holds"), (0.16, 0.16, "holds"),
    (0.37, 0.16, "partly: the bytes read per token are near the claim, the resident bytes are not"),
    (0.40, 0.40, "not: more than claimed")])
def test_memory_is_judged_on_the_footprint_with_the_bytes_read_beside_it(resident, read, verdict):
    assert memory_verdict(resident, read, 0.125 if read < 0.45 else 0.5) == verdict


def test_the_int4_footprint_with_a_float_embedding_is_partly():
    claims = quantization_claims(table(**{"int4 g32": measured(0.37, 0.156, 2.5)}))
    memory = claim(claims, "memory", "int4 g32")
    assert memory["verdict"].startswith("partly") and "37.0% resident, 15.6% read per token" in memory["measured"]


@pytest.mark.parametrize("ratio, verdict", [(2.5, "holds"), (1.5, "partly: faster, but less than claimed"),
                                            (0.9, "not: no faster than fp32 here")])
def test_speed_against_the_claimed_ratio(ratio, verdict):
    assert speed_claim_verdict(ratio, 3.0) == verdict


def test_speed_shows_both_ratios_and_the_kernel():
    claims = quantization_claims(table(int8=measured(0.47, 0.25, 2.1, speed_vs_bf16=1.4, kernel="fused int8")))
    speed = claim(claims, "decode speed", "int8")
    assert speed["measured"] == "2.10x fp32, 1.40x bf16 (fused int8)" and speed["verdict"] == "holds"


def test_an_untimed_row_says_so():
    claims = quantization_claims(table(**{"bnb nf4": measured(0.3, 0.15, None, speed_note="not timed: slow")}))
    assert claim(claims, "decode speed", "bnb nf4") == {
        "topic": "decode speed", "weights": "bnb nf4", "claim": "~3x fp32", "measured": "not timed: slow",
        "verdict": "not timed here"}


def test_a_busy_machine_gets_no_speed_verdict():
    noisy = quantization_claims(table(int8=measured(0.47, 0.25, 2.1, timing=NOISY)))
    assert claim(noisy, "decode speed", "int8")["verdict"].startswith(BUSY_VERDICT)
    loaded = quantization_claims(table(int8=measured(0.47, 0.25, 2.1)), load=2.5)
    assert "load average was 2.5" in claim(loaded, "decode speed", "int8")["verdict"]
    assert claim(loaded, "memory", "int8")["verdict"].startswith("partly")      # memory needs no quiet machine


@pytest.mark.parametrize("increase, claimed, verdict", [
    (0.01, "small", "holds (less loss than claimed: minimal)"), (0.05, "small", "holds"),
    (0.30, "noticeable", "holds"), (0.05, "minimal", "not: a small loss, more than claimed"),
    (0.50, "small", "not: a noticeable loss, more than claimed")])
def test_quality_by_the_rise_in_perplexity(increase, claimed, verdict):
    assert quality_verdict(increase, claimed) == verdict
    assert loss_of(increase) in verdict or verdict == "holds"


def test_the_conclusions_are_written_from_the_verdicts():
    claims = quantization_claims(table(bf16=measured(0.5, 0.5, 1.1, perplexity=10.05),
                                       int8=measured(0.47, 0.25, 2.1, perplexity=10.1),
                                       **{"int4 g32": measured(0.37, 0.16, None, perplexity=14.0)}))
    text = quantization_conclusions(claims)
    assert "* **memory**: the claim holds for bf16; holds only in part for int8, int4 g32." in text
    assert "* **decode speed**: the claim holds for int8; holds only in part for bf16; was not measured here " \
           "for int4 g32." in text
    assert "* **quality**: the claim holds for bf16, int8, int4 g32." in text
