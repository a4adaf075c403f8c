"""`workloads`: every prompt and CPU / GPU size preset in one place. Both presets exist for every
caller, their values are those the course always used, and the callers read them there."""

import dataclasses

import pytest

from labsupport.lab import batching, roofline, workloads
from labsupport.lab.serving_workload import QUESTIONS, serving_workload, stack_workload
from labsupport.bench import BenchOptions
from labsupport.bench.serving import default_slots
from labsupport.weights.fixtures import ByteTokenizer
from labsupport.lab.workloads import PRESETS, PrecisionWorkload, StackWorkload, device_class, preset

# The values before `workloads` existed, caller by caller: changing one is a decision, not a refactoring.
EXPECTED = {
    "cpu": dict(roofline_batches=(1, 2, 4, 8, 16, 32, 48), linear_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                batch_sizes=(1, 2, 4, 8, 16, 32, 64),
                batching_explorer_max_batch=32, kv_explorer_max_length=1024,
                precision=PrecisionWorkload(decode_tokens=16, prefill_tokens=256, agreement_tokens=64, repeats=3),
                serving_slots=8, serving_requests=24,
                stack=StackWorkload(requests=8, notebook_requests=8, slots=4, repeats=1, explorer_requests=4)),
    # batch_sizes: the bench's sweep stopped at 256 while notebook 02's went to 512; both now go to 512,
    # as the roofline sweep (a GPU's ridge is crossed only past a few hundred rows)
    "gpu": dict(roofline_batches=(1, 4, 16, 64, 128, 256, 512),
                linear_batches=(1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096),
                batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
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
    assert options == (BenchOptions.gpu() if kind == "gpu" else BenchOptions.cpu())
    assert options.batching.sizes == sizes.batch_sizes and options.roofline.batches == sizes.roofline_batches
    assert (options.serving.slots, options.serving.requests) == (sizes.serving_slots, sizes.serving_requests)
    serving = workloads.SERVING_PRESETS[kind]
    assert (options.serving.token_budget, options.serving.curve_requests, options.serving.curve_slots,
            options.serving.curve_loads) == (serving.token_budget, serving.curve_requests, serving.curve_slots,
                                             serving.curve_loads)
    assert options.stack.requests == sizes.stack.requests
    assert default_slots(device) == sizes.serving_slots
    tokenizer = ByteTokenizer()
    assert len(serving_workload(tokenizer, device)) == sizes.serving_requests
    assert len(stack_workload(tokenizer, device)) == sizes.stack.requests
    if kind == "cpu":                            # on a GPU: tests/test_gpu_simulated.py, which simulates one
        assert roofline.decode_batches(device) == list(sizes.roofline_batches)
        assert roofline.linear_batches(device) == list(sizes.linear_batches)
        assert batching.batch_sizes(device) == list(sizes.batch_sizes)


def test_the_prompts_are_the_ones_the_bench_and_the_notebooks_use():
    from labsupport.bench import baseline, batching, kv_cache, precision
    assert baseline.DEFAULT_PROMPT is workloads.DEFAULT_PROMPT
    assert batching.BATCHING_PROMPTS is workloads.BATCHING_PROMPTS and len(workloads.BATCHING_PROMPTS) == 8
    assert kv_cache.KV_PROMPT is workloads.KV_PROMPT and precision.LIGHTHOUSE_PROMPT is workloads.LIGHTHOUSE_PROMPT
    assert workloads.LIGHTHOUSE_PROMPT == "The history of the lighthouse begins with fires lit on hills by the sea."


def test_workloads_is_pure_data_at_the_bottom_of_lab():
    """It imports no other module of the package (only dataclasses and torch), so that every
    module of lab/ can read its sizes; the prompts of notebooks 05 to 07 live here too."""
    import ast
    tree = ast.parse(open(workloads.__file__, encoding="utf-8").read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {("." * node.level) + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "dataclasses", "torch"}
    assert QUESTIONS is workloads.CHAT_QUESTIONS
    from labsupport.bench import speculative
    assert speculative.GROUNDED_PROMPT.endswith(workloads.GROUNDED_TEXT) and speculative.CREATIVE_PROMPT is \
        workloads.CREATIVE_PROMPT
