"""The bench section http_serving (notebook 09) and its figure, on a tiny model: every server's
row at every rate, peers that cannot run say why in one sentence, nothing leaks."""

import sys

import pytest
import torch

from labsupport.bench import http_serving
from labsupport.bench.core import BenchContext
from labsupport.bench.http_serving import HttpServingOptions, http_load_curve, peer_server
from labsupport.bench.suite import SECTIONS
from labsupport.errors import LabError
from labsupport.plots.http_serving import http_load_curve_figure
from labsupport.weights.fixtures import ByteTokenizer, random_model

TINY = HttpServingOptions(requests=3, slots=2, median_new_tokens=4, max_new_tokens=8, loads=(50, 150))


def test_the_load_curve_has_a_row_per_server_and_rate_and_the_figure_draws_the_measured_ones():
    model = random_model("tiny-llama")
    rows = http_load_curve(model, ByteTokenizer(), "tiny", [5.0, 50.0], TINY,
                           peers={"vLLM server": "vLLM skipped: it needs a CUDA GPU."})
    assert [(r["server"], r["rate"]) for r in rows] == [
        (s, rate) for rate in (5.0, 50.0) for s in ("in-process engine", "our HTTP server", "vLLM server")]
    for r in rows:
        if r["server"] == "vLLM server":
            assert r["skipped"] and r["tokens"] == 0
        else:
            assert r["skipped"] is None and r["errors"] == 0 and r["throughput"] > 0 and r["ttft_p50"] > 0
    inproc = [r["tokens"] for r in rows if r["server"] == "in-process engine"]
    assert inproc == [r["tokens"] for r in rows if r["server"] == "our HTTP server"]      # the same work
    fig = http_load_curve_figure(rows)
    assert {t.name for t in fig.data} == {"in-process engine", "our HTTP server"} and len(fig.data) == 6
    assert list(fig.data[0].x) == [5.0, 50.0]


def test_the_section_runs_when_named_and_says_why_each_peer_is_missing():
    assert not SECTIONS["http_serving"].in_default_run and SECTIONS["http_serving"].notebook.startswith("09")
    ctx = BenchContext(device=torch.device("cpu"), model_name="tiny-llama")
    section = http_serving.section_http_serving(ctx, TINY)
    assert "GGUF file only" in section["peers"]["llama.cpp server"]
    assert "CUDA GPU" in section["peers"]["vLLM server"]
    names = [f["name"] for f in section["figures"]]
    assert len(names) == 5 and all(n.startswith("http serving: ") for n in names)
    by_name = {f["name"]: f for f in section["figures"]}
    ratio = by_name["http serving: throughput at the highest rate, HTTP server / in-process"]
    assert ratio["value"] > 0 and ratio["target"] == 0.9 and ratio["paths"] == ["eager"]     # a CPU: eager, said
    peer = by_name["http serving: our HTTP server / vLLM server throughput at the highest rate"]
    assert peer["value"] != peer["value"] and "CUDA" in peer["note"]                   # nan, and why
    assert len(section["rows"]) == 4 * len(TINY.loads) and section["rates"] == sorted(section["rates"])


def test_a_peer_server_that_cannot_start_is_one_sentence():
    with pytest.raises(LabError, match="exited .*boom"):
        with peer_server([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], 1, timeout=30):
            pass


def test_in_a_thread_returns_the_value_and_raises_the_error():
    from labsupport.bench.http_serving import in_a_thread
    import threading
    assert in_a_thread(lambda a, b: (a + b, threading.current_thread().name), 2, 3) == (5, "labsupport-in-process")
    with pytest.raises(LabError, match="boom"):
        in_a_thread(lambda: (_ for _ in ()).throw(LabError("boom")))


def test_the_options_refuse_bad_sizes_in_one_sentence():
    with pytest.raises(LabError, match="http_serving.requests"):
        HttpServingOptions(requests=0)
    with pytest.raises(LabError, match="median_new_tokens .* at most max_new_tokens"):
        HttpServingOptions(median_new_tokens=30, max_new_tokens=8)
