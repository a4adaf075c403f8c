"""One verdict path: every bench section returns what its claims function takes, the suite stores
the claims it gives, and the same claims come back from the section's JSON. On the tiny model,
the sections that need no Hugging Face peer (the others: their claims tests, on synthetic dicts)."""

import json

import pytest

from labsupport.bench import SECTIONS, BenchOptions, run
from labsupport.report import html_report, markdown_claims_tables

TINY_SECTIONS = ["roofline", "kv_cache", "precision", "quantization", "long_context"]


@pytest.fixture(scope="module")
def report():
    options = BenchOptions.from_cli("cpu", new_tokens=4, repeats=1, kv_lengths=[4, 8]).changed(
        roofline={"batches": (1, 2, 4)}, precision={"prefill_tokens": 16},
        quantization={"eval_tokens": 24, "slow_new_tokens": 3},
        long_context={"context": 64, "batch": 2, "prefill_lengths": (16, 32), "naive_budget_mib": 1})
    return run(TINY_SECTIONS, device="cpu", model_name="tiny-llama", options=options, progress=lambda _: None)


def test_each_section_carries_its_claims_and_they_come_back_from_the_json(report):
    assert list(report["sections"]) == TINY_SECTIONS
    again = json.loads(json.dumps(report, default=str))                  # what the bench JSON holds
    for name, section in report["sections"].items():
        assert section["claims"], name
        assert all({"claim", "verdict"} <= set(row) or "chapter's claim" in row for row in section["claims"]), name
        assert SECTIONS[name].claims(again["sections"][name]) == json.loads(json.dumps(section["claims"])), name
    assert "claim" not in {key for s in report["sections"].values() for f in s["figures"] for key in f}
    assert report["options"]["kv_cache"]["lengths"] == [4, 8]              # the options, by section


def test_the_claims_judge_what_each_section_measured(report):
    sections = report["sections"]
    kv = {row["claim"][:22]: row["verdict"] for row in sections["kv_cache"]["claims"]}
    assert kv["(course) cache size = "] == "holds"                        # the allocation equals the formula
    assert kv["(course) grouped-query"] == "holds"
    precision = sections["precision"]["claims"]
    assert precision[0]["topic"] == "memory" and precision[0]["verdict"].startswith("holds")
    long_context = {row["claim"][:25]: row["verdict"] for row in sections["long_context"]["claims"]}
    assert long_context["An int8 KV cache halves t"] == "holds"
    assert long_context["A sliding window caps the"] == "not measured here"          # notebook 08's
    roofline = sections["roofline"]["claims"]
    assert len(roofline) == 3 * len(sections["roofline"]["sweeps"])         # three claims per dtype
    quantization = sections["quantization"]["claims"]
    assert {row["weights"] for row in quantization} >= {"bf16", "int8", "int4 g32"}


def test_the_report_renders_each_sections_claims_table(report):
    page = html_report(report)
    assert page.count("<h3>The handbook chapter's claims</h3>") == len(TINY_SECTIONS)
    assert page.count('<tr class="claim">') == sum(len(s["claims"]) for s in report["sections"].values())
    tables = markdown_claims_tables(report)
    assert all(f"### {name} (notebook {SECTIONS[name].notebook})" in tables for name in TINY_SECTIONS)


def test_every_bandwidth_fraction_is_against_the_read_probe_with_the_copys_beside_it(report):
    """Issue 54: a fraction of bandwidth is set against the read probe, the copy's figure beside it."""
    hardware = report["machine"]["hardware"]
    assert hardware["read_bandwidth"] > 0
    ratio = hardware["bandwidth"] / hardware["read_bandwidth"]
    sections = report["sections"]
    kv = [row for row in sections["kv_cache"]["rows"] if "cached_bandwidth_fraction" in row]
    precision = list(sections["precision"]["models"].values())
    quantization = [row for row in sections["quantization"]["rows"].values() if row.get("bandwidth_fraction")]
    assert kv and precision and quantization
    for row in kv:
        assert row["cached_read_bandwidth_fraction"] == pytest.approx(row["cached_bandwidth_fraction"] * ratio)
    for row in precision + quantization:
        assert row["read_bandwidth_fraction"] == pytest.approx(row["bandwidth_fraction"] * ratio)
    notes = [f["note"] for name in ("kv_cache", "precision", "quantization") for f in sections[name]["figures"]
             if "bandwidth" in f.get("note", "")]
    assert notes and all("of read bandwidth (" in note and "of copy" in note for note in notes), notes
