"""lab.roofline_latency (notebook 00): TTFT ~ prefill FLOPs / peak, TPOT ~ bytes / bandwidth, each the larger
of its two roofs, on the embedded model's shapes and a hub shape, and on the data sheets."""

import pytest

from labsupport.engine.config import PRESETS
from labsupport.errors import LabError
from labsupport.lab import roofline_latency as L
from labsupport.lab.roofline_hardware import DATA_SHEETS
from labsupport.lab.roofline import decode_step_cost, matmul_params

SMALL, HUB = PRESETS["smollm2-135m"], PRESETS["smollm2-1.7b-shape"]


def test_prefill_flops_by_hand_for_one_and_two_tokens():
    out = SMALL.vocab_size * SMALL.hidden_size
    assert L.prefill_flops(SMALL, 1) == 2 * matmul_params(SMALL)           # one token: a decode step at context 0
    per_pair = 4 * SMALL.num_layers * SMALL.num_heads * SMALL.head_dim       # the second token attends to the first
    assert L.prefill_flops(SMALL, 2) == 2 * (matmul_params(SMALL) - out) * 2 + 2 * out + per_pair


def test_attention_grows_with_the_square_of_the_prompt():
    linear = [L.prefill_flops(SMALL, t) for t in (1000, 2000)]
    assert linear[1] > 2 * linear[0]          # more than twice: the causal attention term is quadratic


def test_long_prompts_are_compute_bound_and_decode_memory_bound_on_every_sheet():
    for row in L.data_sheet_estimates(HUB, prompt_tokens=1024, new_tokens=128):
        assert row.ttft_bound == "compute" and row.tpot_bound == "memory", row
        assert row.request_s == pytest.approx(row.ttft_s + 127 * row.tpot_s)
    assert len(L.data_sheet_estimates(HUB, 16, 16)) == len(DATA_SHEETS)


def test_tpot_is_the_mean_context_step_over_the_bandwidth():
    bandwidth, peak = 100e9, 1e12
    est = L.estimate(SMALL, prompt_tokens=100, new_tokens=40, bandwidth=bandwidth, peak_flops=peak)
    assert est.tpot_s == pytest.approx(decode_step_cost(SMALL, 1, 120).bytes / bandwidth)
    assert est.ttft_s == pytest.approx(L.prefill_flops(SMALL, 100) / peak)
    # a one-token prompt on a fast-compute machine is set by reading the weights once
    one = L.estimate(SMALL, prompt_tokens=1, new_tokens=1, bandwidth=bandwidth, peak_flops=1e15)
    assert one.ttft_bound == "memory" and one.request_s == one.ttft_s


def test_half_the_bytes_half_the_tpot():
    fp32 = L.estimate(HUB, 64, 64, 1e12, 1e15, "float32")
    bf16 = L.estimate(HUB, 64, 64, 1e12, 1e15, "bfloat16")
    assert bf16.tpot_s == pytest.approx(fp32.tpot_s / 2, rel=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_tokens=0), "at least 1 prompt token"), (dict(new_tokens=0), "at least 1 new token"),
    (dict(bandwidth=0), "must be positive"), (dict(peak_flops=float("nan")), "must be positive")])
def test_bad_input_is_one_sentence(kwargs, match):
    args = dict(prompt_tokens=8, new_tokens=8, bandwidth=1e9, peak_flops=1e12) | kwargs
    with pytest.raises(LabError, match=match):
        L.estimate(SMALL, **args)


def test_the_markdown_table_has_a_row_per_machine():
    rows = L.data_sheet_estimates(SMALL, 256, 64)
    table = L.markdown_estimates(rows)
    assert table.count("\n") == len(rows) + 1 and "(compute)" in table and "(memory)" in table


@pytest.mark.parametrize("kwargs, match", [                  # issue 50: each of these was taken as a count or a rate
    (dict(prompt_tokens=2.5), "at least 1 prompt token"), (dict(prompt_tokens=float("nan")), "at least 1 prompt token"),
    (dict(prompt_tokens=True), "at least 1 prompt token"),
    (dict(prompt_tokens=float("inf")), "at least 1 prompt token"),
    (dict(prompt_tokens=10 ** 400), "at most"), (dict(new_tokens=2.5), "at least 1 new token"),
    (dict(new_tokens=float("nan")), "at least 1 new token"), (dict(new_tokens=True), "at least 1 new token"),
    (dict(new_tokens=float("inf")), "at least 1 new token"), (dict(bandwidth=float("inf")), "must be positive"),
    (dict(peak_flops=float("inf")), "must be positive"), (dict(bandwidth=True), "must be positive"),
    (dict(peak_flops=1e-300), "must be positive"), (dict(dtype=0), "bytes per value"),
    (dict(dtype=None), "Unknown precision"), (dict(machine=3), "machine"),
])
def test_counts_are_whole_numbers_and_rates_finite_one_sentence_each(kwargs, match):
    args = dict(prompt_tokens=8, new_tokens=8, bandwidth=1e9, peak_flops=1e12) | kwargs
    with pytest.raises(LabError, match=match) as error:
        L.estimate(SMALL, **args)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("call, match", [
    (lambda: L.prefill_flops(SMALL, 2.5), "at least 1 prompt token"),
    (lambda: L.prefill_flops({"hidden_size": 8}, 8), "ModelConfig"),
    (lambda: L.data_sheet_estimates(SMALL, 8, 8, sheets=[{"name": "x"}]), "DataSheets"),
    (lambda: L.markdown_estimates([{"machine": "x"}]), "LatencyEstimates"),
])
def test_the_other_entry_points_refuse_in_one_sentence(call, match):
    with pytest.raises(LabError, match=match):
        call()


def test_integer_scalars_of_numpy_and_torch_are_counts():
    import numpy as np
    import torch
    plain = L.estimate(SMALL, 8, 8, 1e9, 1e12)
    assert L.estimate(SMALL, np.int64(8), torch.tensor(8), 1e9, 1e12) == plain
