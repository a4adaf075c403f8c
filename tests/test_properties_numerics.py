"""Property-based pass over the public arguments of the course's numeric helpers (issue 50):
`lab.quality.kl_divergence_from_logits` (notebooks 04, 08), `lab.quantization_awq` (notebook 04's
AWQ search), `lab.roofline_latency` (notebook 00's latency model) and the load generator's
`goodput` (notebook 09).

For arbitrary values (NaN, inf, negatives, bools, huge ints, wrong types, empty tensors) each
function either returns a finite result that keeps its invariant (KL(p, p) = 0 and KL >= 0; the
AWQ search's best error is the smallest and never above plain int4's; latency grows with the
prompt and the answer; goodput >= 0, the share met in [0, 1], whatever the results' order) or
raises a LabError of one line; never another exception. AWQ's tensors stay tiny (at most 3 x 8).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from labsupport.engine.config import PRESETS
from labsupport.errors import LabError
from labsupport.lab import quantization_awq as awq
from labsupport.lab import roofline_latency as L
from labsupport.lab.http_serving_loadgen import LoadResult, goodput
from labsupport.lab.quality import kl_divergence_from_logits
from labsupport.weights.fixtures import random_model

torch.set_num_threads(1)
MODEL = random_model("tiny-llama")                 # its MLP down projections take 128 inputs
SMALL = PRESETS["smollm2-135m"]
REFUSED = object()

# floats hold NaN, both infinities and float32's overflow; ints run far past float's range, except
# where `inputs.finite_number` reads them (it cannot take an int beyond 2 ** 1024: not this pass's file)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
HUGE = st.integers(min_value=-(10 ** 400), max_value=10 ** 400)
SCALARS = st.one_of(st.none(), st.booleans(), HUGE, ANY_FLOAT, st.text(max_size=3))
TAME = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False, width=32)


def outcome(call):
    """call()'s result, or REFUSED after a LabError of one line; any other exception fails the test."""
    try:
        result = call()
    except LabError as error:
        assert "\n" not in str(error) and str(error), repr(str(error))
        event("refused")
        return REFUSED
    event("returned")
    return result


def tensors(shape_rows=st.integers(0, 3), shape_cols=st.integers(0, 5), values=ANY_FLOAT):
    """Small float tensors of any values (empty ones too)."""
    return st.tuples(shape_rows, shape_cols).flatmap(
        lambda shape: st.lists(values, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]).map(
            lambda v: torch.tensor(v, dtype=torch.float32).reshape(shape)))


LOGITS = st.one_of(tensors(values=st.one_of(TAME, ANY_FLOAT, st.just(-math.inf))), SCALARS,
                   st.lists(TAME, max_size=3), tensors(values=TAME).map(lambda t: t.to(torch.int64)))


def break_one(data, valid: dict, arbitrary: dict) -> dict:
    """`valid` arguments with at most one of them (or none, one time in len + 1) drawn from `arbitrary`
    instead: so that both the checks and the results are exercised."""
    broken = data.draw(st.sampled_from([None, *arbitrary]))
    return {k: data.draw(arbitrary[k]) if k == broken else v for k, v in valid.items()}


def logit_pair(data) -> dict:
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)))
    values = st.lists(st.one_of(TAME, TAME, st.just(-math.inf)), min_size=shape[0] * shape[1],
                      max_size=shape[0] * shape[1]).map(lambda v: torch.tensor(v).reshape(shape))
    return break_one(data, {"reference": data.draw(values), "other": data.draw(values)},
                     {"reference": LOGITS, "other": LOGITS})


# --- KL divergence ---------------------------------------------------------------------------------

@given(st.data())
def test_kl_is_finite_and_never_negative_or_one_sentence(data):
    args = logit_pair(data)
    kl = outcome(lambda: kl_divergence_from_logits(args["reference"], args["other"]))
    assert kl is REFUSED or (math.isfinite(kl) and kl >= 0)


@given(tensors(st.integers(1, 3), st.integers(1, 5), st.one_of(TAME, st.just(-math.inf))))
def test_kl_of_a_distribution_with_itself_is_zero_even_with_impossible_tokens(p):
    if not torch.isfinite(p).any(-1).all():              # a row of only -inf is no distribution
        assert outcome(lambda: kl_divergence_from_logits(p, p)) is REFUSED
    else:
        assert kl_divergence_from_logits(p, p) == 0.0
        assert kl_divergence_from_logits(p, p + 7.0) == pytest.approx(0.0, abs=1e-6)


# --- AWQ ------------------------------------------------------------------------------------------

GROUPS = st.one_of(st.sampled_from([2, 4, 8]), SCALARS)
GRIDS = st.one_of(st.lists(st.one_of(st.floats(0, 1), SCALARS), max_size=4), SCALARS)
MATRICES = st.one_of(tensors(st.integers(0, 3), st.sampled_from([0, 2, 4, 8]), ANY_FLOAT), SCALARS,
                     tensors(st.integers(1, 3), st.sampled_from([4, 8]), TAME).map(lambda t: t * 1e30))
SCALES = st.one_of(tensors(st.just(1), st.sampled_from([4, 8]), ANY_FLOAT).map(lambda t: t[0]),
                   tensors(values=ANY_FLOAT), SCALARS)


def awq_args(data) -> dict:
    """A tiny layer (out <= 3, in 4 or 8), its activations, a group size, a grid and positive scales."""
    out_features, in_features = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([4, 8]))
    matrix = lambda rows: st.lists(TAME, min_size=rows * in_features, max_size=rows * in_features).map(  # noqa: E731
        lambda v: torch.tensor(v).reshape(rows, in_features))
    valid = {"weight": data.draw(matrix(out_features)), "x": data.draw(matrix(data.draw(st.integers(1, 3)))),
             "group_size": data.draw(st.sampled_from([g for g in (2, 4, 8) if in_features % g == 0])),
             "grid": data.draw(st.one_of(st.lists(st.floats(0, 1), min_size=1, max_size=4), st.just(awq.AWQ_GRID))),
             "scales": data.draw(st.lists(st.floats(1e-3, 1e3), min_size=in_features, max_size=in_features).map(
                 torch.tensor))}
    return break_one(data, valid, {"weight": MATRICES, "x": MATRICES, "group_size": GROUPS, "grid": GRIDS,
                                   "scales": SCALES})


@settings(max_examples=60)
@given(st.data(), st.booleans())
def test_the_awq_search_finds_its_smallest_error_or_refuses(data, requires_grad):
    a = awq_args(data)
    weight, x, group_size, grid = a["weight"], a["x"], a["group_size"], a["grid"]
    if requires_grad and isinstance(weight, torch.Tensor) and weight.is_floating_point():
        weight = weight.clone().requires_grad_(True)      # an nn.Linear's weight
    found = outcome(lambda: awq.awq_search(weight, x, group_size, grid))
    if found is REFUSED:
        return
    scales, errors = found
    assert len(errors) == len(grid) and all(math.isfinite(e) and e >= 0 for e in errors)
    assert scales.shape == (weight.shape[1],) and torch.isfinite(scales).all() and (scales > 0).all()
    held = awq.error_removed(weight, x, group_size, scales)
    assert held["awq"] == pytest.approx(min(errors), rel=1e-5, abs=1e-6)
    assert math.isfinite(held["removed"]) and held["removed"] <= 1
    if 0.0 in grid:                                       # alpha = 0 is plain int4: never worse than it
        assert held["removed"] >= -1e-6


@settings(max_examples=60)
@given(st.data())
def test_the_steps_take_finite_positive_scales_or_refuse(data):
    a = awq_args(data)
    weight, x, group_size, scales = a["weight"], a["x"], a["group_size"], a["scales"]
    removed = outcome(lambda: awq.error_removed(weight, x, group_size, scales))
    assert removed is REFUSED or (all(math.isfinite(v) for v in removed.values()) and removed["removed"] <= 1)
    approx = outcome(lambda: awq.awq_weight(weight, scales, group_size))
    assert approx is REFUSED or (approx.shape == weight.shape and torch.isfinite(approx).all())
    error = outcome(lambda: awq.output_error(weight, weight, x))
    assert error is REFUSED or error == 0.0


@given(tensors(st.just(1), st.integers(0, 6), st.one_of(st.floats(0, 1e6), st.floats(0, 1e6), ANY_FLOAT)),
       st.one_of(st.floats(0, 1), st.sampled_from([0, 0.5, 1]), SCALARS))
def test_scales_for_are_finite_and_positive_or_refused(mean_abs, alpha):
    s = outcome(lambda: awq.scales_for(mean_abs[0], alpha))
    assert s is REFUSED or (torch.isfinite(s).all() and (s > 0).all())


@settings(max_examples=40)
@given(st.data())
def test_layer_inputs_and_the_fold_refuse_or_leave_the_model_as_it_was(data):
    valid = {"name": data.draw(st.sampled_from(["blocks.0.mlp.down", "blocks.1.mlp.down"])),
             "ids": data.draw(st.lists(st.integers(0, 259), min_size=1, max_size=4)),
             "scales": data.draw(st.lists(st.floats(0.5, 2.0), min_size=128, max_size=128).map(torch.tensor))}
    a = break_one(data, valid, {
        "name": st.one_of(st.sampled_from(["blocks.0.attn.qkv", "blocks.0", "blocks.9.mlp.down", "nope", ""]), SCALARS),
        "ids": st.one_of(st.lists(st.one_of(st.integers(-5, 300), SCALARS), max_size=4), SCALARS),
        "scales": st.one_of(SCALES, st.lists(ANY_FLOAT, min_size=128, max_size=128).map(torch.tensor))})
    x = outcome(lambda: awq.layer_inputs(MODEL, a["name"], a["ids"]))
    assert x is REFUSED or (x.shape == (len(a["ids"]), MODEL.get_submodule(a["name"]).in_features)
                            and torch.isfinite(x).all())
    before = {k: v.clone() for k, v in MODEL.state_dict().items()}

    def fold():
        with awq.awq_int4_down(MODEL, a["name"], 32, a["scales"]) as layer:
            assert MODEL.get_submodule(a["name"]) is layer
    outcome(fold)
    after = MODEL.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


# --- the latency model -----------------------------------------------------------------------------

COUNTS = st.one_of(st.integers(1, 10 ** 12), SCALARS)
RATES = st.one_of(st.floats(1.0, 1e18), SCALARS)
DTYPES = st.one_of(st.sampled_from(["float32", "bf16", torch.float16, 1, 2, 4]), SCALARS)


@given(COUNTS, COUNTS, RATES, RATES, DTYPES)
def test_an_estimate_is_finite_and_positive_or_one_sentence(prompt_tokens, new_tokens, bandwidth, peak, dtype):
    est = outcome(lambda: L.estimate(SMALL, prompt_tokens, new_tokens, bandwidth, peak, dtype))
    if est is not REFUSED:
        assert all(math.isfinite(t) and t > 0 for t in (est.ttft_s, est.tpot_s, est.request_s))
        assert est.request_s >= est.ttft_s
    flops = outcome(lambda: L.prefill_flops(SMALL, prompt_tokens))
    assert flops is REFUSED or (math.isfinite(flops) and flops > 0)


@given(st.integers(1, 10 ** 12), st.integers(1, 10 ** 12), st.integers(0, 10 ** 12), st.integers(0, 10 ** 12),
       st.floats(1.0, 1e18), st.floats(1.0, 1e18))
def test_latency_grows_with_the_prompt_and_the_answer(prompt, new, more_prompt, more_new, bandwidth, peak):
    assume(prompt + more_prompt <= L.MAX_TOKENS and new + more_new <= L.MAX_TOKENS)
    small = L.estimate(SMALL, prompt, new, bandwidth, peak)
    large = L.estimate(SMALL, prompt + more_prompt, new + more_new, bandwidth, peak)
    assert large.ttft_s >= small.ttft_s and large.tpot_s >= small.tpot_s and large.request_s >= small.request_s
    assert L.prefill_flops(SMALL, prompt + more_prompt) >= L.prefill_flops(SMALL, prompt)


@settings(max_examples=30)
@given(COUNTS, COUNTS, st.one_of(st.just(None), st.lists(SCALARS, max_size=2)))
def test_the_data_sheets_and_their_table_refuse_or_give_a_row_each(prompt_tokens, new_tokens, sheets):
    rows = outcome(lambda: L.data_sheet_estimates(SMALL, prompt_tokens, new_tokens,
                                                  *(() if sheets is None else (sheets,))))
    if rows is not REFUSED:
        assert L.markdown_estimates(rows).count("\n") == len(rows) + 1
    table = outcome(lambda: L.markdown_estimates(sheets))
    assert table is REFUSED or sheets == []


# --- the load generator's goodput ------------------------------------------------------------------

TIMES = st.one_of(st.floats(0, 100), ANY_FLOAT, HUGE, st.booleans())


@st.composite
def load_results(draw, tame: bool):
    """A LoadResult (or its dict): served in order (tame) or of any times, or failed."""
    if draw(st.booleans()):                                               # failed: an error, maybe never sent
        result = LoadResult(arrival=0.0, sent=draw(st.one_of(st.just(math.nan), TIMES)), error="429")
    elif tame:
        sent = draw(st.floats(0, 100))
        gaps = draw(st.lists(st.floats(0, 10), min_size=1, max_size=4))
        times = [sent + sum(gaps[:i + 1]) for i in range(len(gaps))]
        result = LoadResult(arrival=0.0, sent=sent, chunk_times=times, tokens=draw(st.sampled_from([0, len(times)])))
    else:
        result = LoadResult(arrival=0.0, sent=draw(TIMES), chunk_times=draw(st.lists(TIMES, max_size=3)),
                            tokens=draw(st.one_of(st.integers(-2, 5), st.booleans())))
    return vars(result) if draw(st.booleans()) else result


SLOS = st.one_of(st.floats(1e-3, 100), ANY_FLOAT, st.integers(-5, 10 ** 300), st.booleans())


@given(st.data(), st.booleans(), SLOS, SLOS)
def test_goodput_is_the_same_for_every_order_and_in_range_or_one_sentence(data, tame, ttft_slo, tpot_slo):
    results = data.draw(st.lists(load_results(tame), max_size=6))
    shuffled = data.draw(st.permutations(results))
    first = outcome(lambda: goodput(results, ttft_slo, tpot_slo))
    second = outcome(lambda: goodput(shuffled, ttft_slo, tpot_slo))
    assert (first is REFUSED) == (second is REFUSED)
    if first is not REFUSED:
        assert first == second
        assert math.isfinite(first["goodput"]) and first["goodput"] >= 0 and 0 <= first["met"] <= 1
        assert first["met"] * len(results) == pytest.approx(round(first["met"] * len(results)))


@given(st.lists(load_results(True), min_size=1, max_size=6))
def test_with_generous_objectives_every_served_request_meets_them(results):
    g = outcome(lambda: goodput(results, 1e6, 1e6))
    served = sum(1 for r in results if (r["error"] if isinstance(r, dict) else r.error) is None)
    if g is REFUSED:                                      # every token came at its sending time: no span
        return
    assert g["met"] == pytest.approx(served / len(results))


@given(st.one_of(SCALARS, st.lists(SCALARS, min_size=1, max_size=3),
                 st.lists(st.dictionaries(st.text(max_size=6), SCALARS, max_size=3), min_size=1, max_size=2)))
def test_goodput_refuses_what_is_not_results(results):
    assert outcome(lambda: goodput(results, 1.0, 0.1)) is REFUSED
