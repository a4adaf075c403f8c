"""Issue 52, item 4: one colour code for prefill and decode across notebooks 06, 06b, 09 and 10.

`labsupport.plots.layout.PHASE_COLORS` holds the pair. Every figure function that draws the two
phases is built here from small synthetic data; each trace named after prefill must wear the
prefill colour, each named after decode the decode colour, and no other trace may wear either.
The other figures of those notebooks (requests, ranks, servers, settings) keep both colours free,
so that orange and blue mean the two phases wherever a learner of 06-10 meets them.
"""

from __future__ import annotations

import re

import pytest

from labsupport.plots.layout import PHASE_COLORS

PREFILL, DECODE = PHASE_COLORS["prefill"], PHASE_COLORS["decode"]


def phase_of(name: str) -> str | None:
    """Which phase a trace's legend name speaks of, or None (a queue, a handover, the cache...)."""
    if re.search(r"waiting|queued|all-reduce|cache\b", name):
        return None
    if re.search(r"prefill|prompt tokens computed", name):
        return "prefill"
    if re.search(r"decod", name):
        return "decode"
    return None


def colour_of(trace) -> str | None:
    marker = getattr(trace, "marker", None)
    colour = marker.color if marker is not None else None
    if colour is None and getattr(trace, "line", None) is not None:
        colour = trace.line.color
    return colour


def colours_of(fig) -> set:
    """Every colour a figure's traces, shapes and arrows are drawn in."""
    found = set()
    for trace in fig.data:
        colour = colour_of(trace)
        found |= set(colour) if isinstance(colour, (list, tuple)) else {colour}
    found |= {shape.fillcolor for shape in fig.layout.shapes} | {shape.line.color for shape in fig.layout.shapes}
    found |= {a.arrowcolor for a in fig.layout.annotations}
    return found - {None}


def check(fig, expected_phases: set[str]):
    seen = set()
    for trace in fig.data:
        name, colour = trace.name or "", colour_of(trace)
        phase = phase_of(name)
        if phase is None:
            assert colour not in (PREFILL, DECODE), f"{name!r} wears a phase colour ({colour}) but is no phase"
        else:
            assert colour == PHASE_COLORS[phase], f"{name!r} is {phase} but is drawn in {colour}"
            seen.add(phase)
    assert seen == expected_phases


def test_the_pair_is_two_different_colours_and_serving_uses_the_same():
    from labsupport.plots import serving
    assert PREFILL != DECODE
    assert serving.PHASE_COLORS["prefill"] == PREFILL and serving.PHASE_COLORS["decode"] == DECODE


def test_the_phase_timeline_of_06_and_06b(tiny_llama):
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_workload import make_workload
    from labsupport.plots.serving import phase_timeline_figure
    requests = make_workload([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 10, 11]], count=4, median_new_tokens=3,
                             max_new_tokens=5, seed=3)
    result = Engine(tiny_llama, max_slots=2, block_size=4, token_budget=8).run(requests, clock="steps")
    check(phase_timeline_figure(result, clock="steps"), {"prefill", "decode"})


def test_the_degrees_of_10():
    from labsupport.plots.tensor_parallel import degrees_figure
    result = {"prefill_tokens": 64, "cores": 2,
              "degrees": {w: {"threads_per_rank": 2 // w, "decode_tokens_per_s": 10.0 * w, "prefill_s": 0.5 / w,
                              "all_reduce_share_of_decode": 0.1 * (w - 1), "all_reduce_share_of_prefill": 0.05 * (w - 1)}
                          for w in (1, 2)}}
    check(degrees_figure(result), {"prefill", "decode"})


def test_the_handover_of_10_no_longer_swaps_them():
    from labsupport.plots.tensor_parallel import handover_figure
    rows = [{"arrival": 0.1 * i, "prefill_from": 0.1 * i + 0.01, "first_token": 0.1 * i + 0.05,
             "received": 0.1 * i + 0.06, "seated": 0.1 * i + 0.07, "finished": 0.1 * i + 0.3} for i in range(3)]
    fig = handover_figure(rows)
    check(fig, {"prefill", "decode"})
    colours = {trace.name: trace.marker.color for trace in fig.data}
    assert colours["prefill on rank 0"] == PREFILL and colours["decode on rank 1"] == DECODE


def test_the_engines_figure_of_00():
    from labsupport.plots.engines import engines_figure
    rows = {name: {"decode_tokens_per_s": 20.0, "bandwidth_fraction": 0.4, "prefill_s": 0.2}
            for name in ("labsupport fp32", "HF generate() fp32")}
    check(engines_figure({"rows": rows, "new_tokens": 8}), {"prefill", "decode"})


@pytest.mark.parametrize("name, phase", [("decoding / decode tokens", "decode"), ("prefill on rank 0", "prefill"),
                                         ("waiting for a decode slot", None), ("inside the all-reduces", None),
                                         ("prompt tokens from the prefix cache", None),
                                         ("prefilling / prompt tokens computed", "prefill")])
def test_the_names_are_read_as_meant(name, phase):
    assert phase_of(name) == phase


def serving_run(model):
    from labsupport.engine.serving import Engine
    from labsupport.lab.serving_workload import make_workload
    requests = make_workload([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 10, 11]], count=4, median_new_tokens=3,
                             max_new_tokens=5, seed=3)
    return Engine(model, max_slots=2, block_size=4).run(requests, clock="steps")


def other_figures(model):
    """The figures of 06, 06b, 09 and 10 that draw no phase, from small synthetic data."""
    from labsupport.engine.config import PRESETS
    from labsupport.engine.parallel import plan_split
    from labsupport.plots import http_serving, serving, serving_settings, tensor_parallel
    run = serving_run(model)
    config = PRESETS["smollm2-135m"]
    load_rows = [{"configuration": name, "rate": rate, "throughput": 10.0 * rate, "ttft_p99": 0.1, "itl_p99": 0.01}
                 for name in serving.CONFIG_COLORS for rate in (1.0, 2.0)]
    server_rows = [{"server": name, "rate": rate, "ttft_p50": 0.1, "ttft_p99": 0.2, "itl_p50": 0.01, "itl_p99": 0.02,
                    "throughput": 5.0} for name in http_serving.SERVER_COLORS for rate in (1.0, 2.0)]
    settings = [{"label": f"setting {i}", "policy": policy, "throughput": 3.0, "ttft_p50": 0.1, "latency_p50": 0.2,
                 "latency_p99": 0.3, "itl_p99": 0.05} for i, policy in enumerate(("static", "continuous", "other"))]
    return {
        "06 block tables": serving.block_table_figure({i: [2 * i, 2 * i + 1] for i in range(8)},
                                                      {i: 6 for i in range(8)}, num_blocks=16, block_size=4),
        "06 slot timeline": serving.slot_timeline_figure({"continuous": run}, clock="steps"),
        "06 slot use": serving.utilization_figure({"continuous": run}, clock="steps"),
        "06 blocks": serving.blocks_figure({"continuous": run}, reserved_blocks=4, clock="steps"),
        "06 decode cost": serving.decode_cost_figure({"table_build_share": 0.1, "gather_share": 0.3, "rest_share": 0.6,
                                                      "step_s": 0.01, "pool_step_s": 0.008}),
        "06 settings": serving_settings.settings_figure(settings, current="setting 0"),
        "06b load curve": serving.load_curve_figure(load_rows),
        "09 load curve": http_serving.http_load_curve_figure(server_rows),
        "10 split": tensor_parallel.split_figure(config, plan_split(config, 2)),
    }


@pytest.mark.platform      # reaches engine.parallel (plan_split): in the subset tests/test_platform_marker.py keeps whole
def test_the_other_figures_of_06_to_10_leave_both_phase_colours_free(tiny_llama):
    for name, fig in other_figures(tiny_llama).items():
        taken = colours_of(fig) & {PREFILL, DECODE}
        assert not taken, f"{name} draws something that is no phase in {taken}"
