"""`workloads`: every prompt and CPU / GPU size preset in one place. Both presets exist for every
caller, their values are those the course always used, and the callers read them there."""

import dataclasses

import pytest

from labsupport.lab import workloads
from labsupport.bench.options import BenchOptions
from labsupport.bench.serving import default_slots
from labsupport.weights.fixtures import ByteTokenizer
from labsupport.lab.workloads import PRESETS, PrecisionWorkload, StackWorkload, device_class, preset

# The values before `workloads` existed, caller by caller: changing one is a decision, not a refactoring.
EXPECTED = {
    "cpu": dict(roofline_batches=(1, 2, 4, 8, 16, 32, 48), batch_sizes=(1, 2, 4, 8, 16, 32, 64),
                batching_explorer_max_batch=32, kv_explorer_max_length=1024,
                precision=PrecisionWorkload(decode_tokens=16, prefill_tokens=256, agreement_tokens=64, repeats=3),
                serving_slots=8, serving_requests=24,
                stack=StackWorkload(requests=8, notebook_requests=8, slots=4, repeats=1, explorer_requests=4)),
    "gpu": dict(roofline_batches=(1, 4, 16, 64, 128, 256, 512), batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                batching_explorer_max_batch=None, kv_explorer_max_length=4096,
                precision=PrecisionWorkload(decode_tokens=64, prefill_tokens=2048, agreement_tokens=256,
                                            repeats=10),
                serving_slots=64, serving_requests=256,
                stack=StackWorkload(requests=64, notebook_requests=128, slots=32, repeats=2, explorer_requests=16)),
}


@pytest.mark.parametrize("kind", ["cpu", "gpu"], ids=["cpu-preset", "gpu-preset"])   # a bare "gpu" id marks a GPU test
def test_every_preset_exists_with_the_values_the_course_always_used(kind):
    assert set(PRESETS) == {"cpu", "gpu"}
    assert dataclasses.asdict(PRESETS[kind]) == dataclasses.asdict(workloads.DevicePreset(**EXPECTED[kind]))


def test_devices_get_their_preset():
    assert device_class("cpu") == "cpu" and device_class("cuda") == device_class("cuda:1") == "gpu"
    assert preset("cpu") is PRESETS["cpu"] and preset("cuda") is PRESETS["gpu"]
    assert PrecisionWorkload.for_device("cpu") == PRESETS["cpu"].precision
    assert PrecisionWorkload.for_device("cuda") == PRESETS["gpu"].precision


@pytest.mark.parametrize("device, kind", [("cpu", "cpu"), ("cuda", "gpu")])
def test_the_callers_read_the_presets(device, kind):
    sizes = PRESETS[kind]
    options = BenchOptions.for_device(device)
    assert options == (BenchOptions.gpu() if kind == "gpu" else BenchOptions())
    assert options.batch_sizes == sizes.batch_sizes and options.roofline_batches == sizes.roofline_batches
    assert (options.serving_slots, options.serving_requests) == (sizes.serving_slots, sizes.serving_requests)
    assert options.stack_requests == sizes.stack.requests
    assert default_slots(device) == sizes.serving_slots
    tokenizer = ByteTokenizer()
    assert len(workloads.serving_workload(tokenizer, device)) == sizes.serving_requests
    assert len(workloads.stack_workload(tokenizer, device)) == sizes.stack.requests


def test_the_prompts_are_the_ones_the_bench_and_the_notebooks_use():
    from labsupport.bench import baseline, batching, kv_cache, precision
    assert baseline.DEFAULT_PROMPT is workloads.DEFAULT_PROMPT
    assert batching.BATCHING_PROMPTS is workloads.BATCHING_PROMPTS and len(workloads.BATCHING_PROMPTS) == 8
    assert kv_cache.KV_PROMPT is workloads.KV_PROMPT and precision.LIGHTHOUSE_PROMPT is workloads.LIGHTHOUSE_PROMPT
    assert workloads.LIGHTHOUSE_PROMPT == "The history of the lighthouse begins with fires lit on hills by the sea."
