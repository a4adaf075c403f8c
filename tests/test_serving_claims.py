"""Notebook 06's claims table: every verdict computed from measurements that should hold,
measurements that should not, and timings taken on a busy machine (no verdict then)."""

import pytest

from labsupport.lab.busy import BUSY_VERDICT, busy_reason
from labsupport.claims import serving_claims
from labsupport.claims.serving import alone_waste
from labsupport.engine.serving import Engine, Request


@pytest.fixture(scope="module")
def toy_runs(tiny_llama):
    """The chapter's example, one long and three short answers, in a static batch of 4 and of 2."""
    toy = [Request([1, 2, 3], max_new_tokens=n, request_id=i) for i, n in enumerate([32, 2, 2, 2])]
    return {slots: Engine(tiny_llama, max_slots=slots, policy="static").run(toy, clock="steps") for slots in (4, 2)}


def metrics(slot_use, ttft_p99, ttft_p50=0.1, slots=4):
    return {"slot_utilization": slot_use, "ttft_p99": ttft_p99, "ttft_p50": ttft_p50, "max_slots": slots}


GOOD = dict(speed={"static": 10.0, "continuous": 25.0, "hf": 20.0},
            metrics={"static": metrics(0.4, 9.0), "continuous": metrics(0.9, 3.0)},
            memory={"used_bytes": 30.0, "reserved_bytes": 100.0},
            same_tokens={"static": (20, 20), "continuous": (20, 20), "hf": (20, 20)})
BAD = dict(speed={"static": 10.0, "continuous": 8.0, "hf": 12.0},
           metrics={"static": metrics(0.7, 3.0), "continuous": metrics(0.7, 3.0)},
           memory={"used_bytes": 100.0, "reserved_bytes": 100.0},
           same_tokens={"static": (20, 20), "continuous": (20, 20), "hf": (19, 20)})


def timing(spread=0.0):
    return {"median": 1.0, "spread": spread}


def test_alone_waste_counts_the_steps_the_long_answer_ran_alone(toy_runs):
    waste, steps = alone_waste(toy_runs[4])
    assert waste == 0.75 and steps == 30                   # 32 tokens: 2 steps with all four, 30 alone
    assert alone_waste(toy_runs[2])[0] == 0.5


def test_every_claim_holds_on_measurements_that_support_it(toy_runs):
    rows = serving_claims(**GOOD, toy_static=toy_runs[4], timings={n: timing() for n in GOOD["speed"]}, load=0.5)
    assert [set(r) for r in rows] == [{"claim", "measured", "verdict"}] * len(rows)
    assert [r["verdict"] for r in rows] == ["holds"] * len(rows)
    assert "75% of the slots idle in the 30 steps" in rows[1]["measured"]
    assert "3.00 s continuous vs 9.00 s static" in rows[2]["measured"]


def test_claims_that_do_not_hold_say_so(toy_runs):
    rows = serving_claims(**BAD, toy_static=toy_runs[2])
    assert [r["verdict"] for r in rows] == [
        "not here: continuous batching did not keep more slots busy", "not here", "not here",
        "not here: slower", "not here",
        "not quite: 1 request(s) differ for hf (float32 rounding near a tie, from a different batch shape)"]
    slower = dict(BAD, metrics={"static": metrics(0.5, 3.0), "continuous": metrics(0.8, 3.0)})
    assert serving_claims(**slower, toy_static=toy_runs[4])[0]["verdict"] == "slots refilled, but slower here"
    level = dict(slower, speed={"static": 10.0, "continuous": 10.2, "hf": 10.0})
    assert serving_claims(**level, toy_static=toy_runs[4])[0]["verdict"] == \
        "slots refilled, but no measurable speedup here"


def test_a_busy_machine_gets_no_verdict_from_the_clock(toy_runs):
    rows = serving_claims(**GOOD, toy_static=toy_runs[4], load=4.0)
    timed = [rows[0], rows[2], rows[3]]                    # throughput, time to first token, against HF
    assert all(r["verdict"].startswith(BUSY_VERDICT) and "load average was 4.0" in r["verdict"] for r in timed)
    assert rows[1]["verdict"] == rows[4]["verdict"] == rows[5]["verdict"] == "holds"   # schedule, memory, tokens
    # a noisy Hugging Face timing spoils only the comparison with Hugging Face
    rows = serving_claims(**GOOD, toy_static=toy_runs[4],
                          timings={"static": timing(), "continuous": timing(), "hf": timing(0.6)})
    assert rows[0]["verdict"] == "holds" and rows[3]["verdict"].startswith(BUSY_VERDICT)


def test_compare_speed_has_a_noise_margin_on_both_sides():
    from labsupport.claims.ratios import compare_speed
    assert [compare_speed(r) for r in (1.05, 1.04, 1.0, 1 / 1.04, 1 / 1.05)] == [
        "faster", "same", "same", "same", "slower"]
    assert compare_speed(1.5, margin=2.0) == "same"


# --- the production engine's claims: the prefill stall, chunked prefill, prefix caching, the load curve ---

def step(start, end, prefill_tokens=0, decode_rows=2):
    from labsupport.engine.serving import StepRecord
    return StepRecord(start, end, prefills=int(prefill_tokens > 0), decode_rows=decode_rows, padding_rows=0,
                      preempted=0, blocks_used=1, prefill_tokens=prefill_tokens)


def test_prefill_stall_compares_the_steps_with_a_prefill_with_the_decode_only_ones():
    from types import SimpleNamespace
    from labsupport.claims import prefill_stall
    run = SimpleNamespace(steps=[step(0, 0.5, prefill_tokens=30, decode_rows=0),   # nobody to stall: left out
                                 step(0.5, 0.6), step(0.6, 0.9, 20), step(0.9, 1.0), step(1.0, 1.1),
                                 step(1.1, 1.5, 40)])
    stall = prefill_stall(run)
    assert (stall["prefill_steps"], stall["decode_steps"]) == (2, 3)
    assert stall["prefill_step_s"] == pytest.approx(0.35) and stall["decode_step_s"] == pytest.approx(0.1)
    assert stall["ratio"] == pytest.approx(3.5)
    import math
    assert math.isnan(prefill_stall(SimpleNamespace(steps=[step(0, 1, 10)]))["ratio"])


def production(stall_ratio=3.0, itl=(0.6, 0.2), throughput=(10.0, 9.5), computed=(400, 150), ttft=(2.0, 1.0),
               curve=((1.0, 10.0, 0.5), (2.0, 18.0, 0.7), (4.0, 20.0, 5.0))):
    return dict(stall={"prefill_step_s": 0.1 * stall_ratio, "decode_step_s": 0.1, "prefill_steps": 5,
                       "decode_steps": 50, "ratio": stall_ratio},
                prefix={"without": {"prefill_tokens_computed": computed[0], "ttft_p50": ttft[0]},
                        "with": {"prefill_tokens_computed": computed[1], "ttft_p50": ttft[1]}},
                chunked={"without": {"itl_p99": itl[0], "throughput": throughput[0]},
                         "with": {"itl_p99": itl[1], "throughput": throughput[1]}},
                curve=[{"configuration": "continuous", "rate": r, "throughput": t, "ttft_p99": w}
                       for r, t, w in curve])


def test_engine_claims_hold_on_measurements_that_support_them():
    from labsupport.claims import engine_claims
    rows = engine_claims(**production())
    assert [r["verdict"] for r in rows] == ["holds"] * 4
    assert "300 ms vs 100 ms decoding only" in rows[0]["measured"]
    assert "600 ms without, 200 ms with (3.00x); throughput 95% of without" in rows[1]["measured"]
    assert "150 of 400 prompt tokens computed (38%)" in rows[2]["measured"]
    assert "throughput 2.00x, time to first token p99 10.00x" in rows[3]["measured"]


def test_engine_claims_that_do_not_hold_say_so():
    from labsupport.claims import engine_claims
    rows = engine_claims(**production(stall_ratio=1.0, itl=(0.6, 0.5), computed=(400, 300),
                                      curve=((1.0, 10.0, 0.5), (4.0, 40.0, 0.6))))
    assert [r["verdict"] for r in rows] == [
        "not here: no longer than a decode step", "not here: the p99 inter-token latency improved 1.20x",
        "not here: 75% of the prompt tokens still computed", "not here: no knee in this range of rates"]
    rows = engine_claims(**production(throughput=(10.0, 8.0), ttft=(2.0, 1.6)))
    assert rows[1]["verdict"] == "shorter tail, but throughput 80% of without"
    assert rows[2]["verdict"] == "fewer tokens computed, but the first token only 1.25x sooner"


def test_engine_claims_on_a_busy_machine_give_no_verdict_from_the_clock():
    from labsupport.claims import engine_claims
    reason = busy_reason({}, load=4.0)
    rows = engine_claims(**production(), busy=dict.fromkeys(("stall", "prefix", "chunked", "curve"), reason))
    assert all(r["verdict"].startswith(BUSY_VERDICT) and "load average was 4.0" in r["verdict"] for r in rows)
    # a count of tokens needs no clock: too many tokens computed is a verdict even on a busy machine
    rows = engine_claims(**production(computed=(400, 300)), busy={"prefix": reason})
    assert rows[2]["verdict"] == "not here: 75% of the prompt tokens still computed"
    assert rows[0]["verdict"] == "holds"


def test_the_bench_sections_claims_come_from_its_dict():
    """`serving_section_claims` takes the serving section's dict: the chapter's toy example is
    notebook 06's (its row says so), the rest is judged from the section's runs and load curve."""
    import json

    from labsupport.claims import serving_section_claims
    plain = dict(metrics(0.9, 3.0), prefill_tokens_computed=400)
    cached = dict(metrics(0.9, 1.0, ttft_p50=0.02), prefill_tokens_computed=150)
    curve = [{"configuration": c, "rate": rate, "throughput": tp, "ttft_p99": wait, "itl_p99": itl}
             for rate, tp, wait in ((0.5, 10.0, 1.0), (2.0, 20.0, 9.0))
             for c, itl in (("continuous", 0.3), ("chunked prefill", 0.1))]
    section = json.loads(json.dumps({
        "tokens_per_s": {**GOOD["speed"], "prefix caching": 26.0}, "timings_s": {n: timing() for n in GOOD["speed"]},
        "metrics": {**GOOD["metrics"], "continuous": plain, "prefix caching": cached}, "memory": GOOD["memory"],
        "same_tokens": GOOD["same_tokens"], "load": 0.5,
        "prefill_stall": {"prefill_step_s": 0.2, "decode_step_s": 0.1, "prefill_steps": 5, "decode_steps": 50,
                          "ratio": 2.0},
        "load_curve": {"rows": curve, "chunked_at": 2.0, "load": 0.5}}))
    rows = serving_section_claims(section)
    assert len(rows) == 6 + 4
    assert rows[1]["verdict"] == "not measured here" and "notebook 06" in rows[1]["measured"]
    assert rows[0]["verdict"] == "holds" and all(r["verdict"] == "holds" for r in rows[6:]), [r["verdict"] for r in rows]
    busy = serving_section_claims({**section, "load": 9.0, "load_curve": {**section["load_curve"], "load": 9.0}})
    assert busy[0]["verdict"].startswith(BUSY_VERDICT) and busy[-1]["verdict"].startswith(BUSY_VERDICT)
