"""The main job's report: report.md, report.json and one self-contained report.html."""

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from labsupport import report as report_module
from labsupport.bench import SECTIONS, all_figures, reported
from labsupport.plots import sections as section_plots
from labsupport.report import (html_report, markdown_claims_tables, markdown_report_table, section_figures,
                               text_table, write_report)
from labsupport.lab.tables import markdown_table, records_table

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "results" / "2core-cpu-2026-11-30.json"
PLOTLY_HEADER = re.compile(r"\* plotly\.js v\d+\.\d+\.\d+")
VOID = {"meta", "br", "img", "input", "hr", "link", "col", "source", "wbr", "area", "base", "embed", "param",
        "track"}


def synthetic_report() -> dict:
    return {
        "created": "2026-11-30 12:00:00", "model": "smollm2-135m", "options": {"repeats": 1},
        "machine": {"device": "cpu", "device_name": "Test CPU <2 threads>", "torch": "2.x", "python": "3.11",
                    "threads": 2, "hardware": {"device": "cpu", "name": "Test CPU", "bandwidth": 4e10,
                                               "flops": {"float32": 2e11}}},
        "sections": {
            "kv_cache": {"seconds": 3.0, "figures": [
                reported("KV cache speedup, 64 new tokens", 3.5, "x", target=2),
                reported("GQA saving", 3.0, "x")],
                "claims": [{"claim": "quadratic -> linear", "measured": "3.5x at 64 | tokens", "verdict": "holds"},
                           {"claim": "GQA shrinks the cache", "measured": "3.00x", "verdict": "holds"}]},
            # A section the report has no builder for, with a value that needs escaping: the fallback plot.
            "serving": {"seconds": 1.0, "figures": [
                reported("throughput, continuous / static batching", 1.7, "x", target=2, note="a <b> & c"),
                reported("KV pages used", 0.4, "fraction", target=0.5, higher_is_better=False),
                reported("scheduler is exact", True, "bool")]},
            "empty": {"figures": []},
        },
    }


class _Checker(HTMLParser):
    """Counts table rows and plot divs, and checks that tags are balanced."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.rows, self.plots, self.scripts = [], [], 0, 0, 0  # scripts: fetched ones
        self.claims = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "figure" in (attrs.get("class") or "").split():
            self.rows += 1
        if tag == "tr" and "claim" in (attrs.get("class") or "").split():
            self.claims += 1
        if tag == "div" and "plotly-graph-div" in (attrs.get("class") or ""):
            self.plots += 1
        if tag == "script" and attrs.get("src"):
            self.scripts += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def check_html(page: str, report: dict) -> _Checker:
    assert page.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert not checker.errors, checker.errors[:5]
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    assert checker.rows == len(all_figures(report)), "one table row per figure"
    assert checker.claims == sum(len(s.get("claims", [])) for s in report["sections"].values()), "one per claim"
    # Offline: plotly.js inlined exactly once, no script fetched from anywhere.
    assert len(PLOTLY_HEADER.findall(page)) == 1
    assert checker.scripts == 0
    return checker


def test_html_from_a_synthetic_report(tmp_path):
    report = synthetic_report()
    path = write_report(report, tmp_path)
    assert path == tmp_path / "report.html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json", "report.md"]
    page = path.read_text(encoding="utf-8")
    checker = check_html(page, report)
    # kv_cache's own builder needs raw data this report lacks: both sections fall back to ratio bars.
    assert checker.plots == 1 + 2
    assert "a &lt;b&gt; &amp; c" in page and "Test CPU &lt;2 threads&gt;" in page
    assert "MISSES target 2x" in page and "meets target 50%" in page
    assert f"notebook {SECTIONS['serving'].notebook}" in page
    assert "<h3>The handbook chapter's claims</h3>" in page and "quadratic -&gt; linear" in page
    assert json.loads((tmp_path / "report.json").read_text())["sections"].keys() == report["sections"].keys()


def _notebooks_markdown_table(header, rows):
    """The definition notebooks 05, 06 and 07 each carried before `labsupport.lab.tables`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def test_one_markdown_table_for_notebooks_claims_and_the_report():
    header, rows = ["server", "tokens/s", "vs static", "same"], [["static", 12.5, "1.00x", True], ["hf", 3, None, 0.1]]
    table = markdown_table(header, rows)
    assert table == ("| server | tokens/s | vs static | same |\n|---|---|---|---|\n"
                     "| static | 12.5 | 1.00x | True |\n| hf | 3 | None | 0.1 |")     # str() of each cell
    assert table == _notebooks_markdown_table(header, rows)
    assert markdown_table(["a"], []) == "| a |\n|---|"
    records = [{"claim": "batch 16 / batch 1", "measured": 7.25}, {"claim": "ridge", "measured": "12 rows"}]
    assert records_table(records) == markdown_table(["claim", "measured"], [[r["claim"], r["measured"]] for r in records])


def test_the_reports_markdown_tables_figures_then_claims(tmp_path):
    report = synthetic_report()
    report["sections"]["serving"]["figures"][0]["note"] = "a | b"                  # a "|" in a cell becomes "/"
    expected = "\n".join([
        "| measurement | measured | course target | detail |",
        "|---|---|---|---|",
        "| KV cache speedup, 64 new tokens | 3.50x | meets target 2x |  |",
        "| GQA saving | 3.00x |  |  |",
        "| throughput, continuous / static batching | 1.70x | MISSES target 2x | a / b |",
        "| KV pages used | 40% | meets target 50% |  |",
        "| scheduler is exact | True |  |  |"])
    assert markdown_report_table(report) == expected
    claims = "\n".join([f"### kv_cache (notebook {SECTIONS['kv_cache'].notebook})", "",
                        "| claim | measured | verdict |", "|---|---|---|",
                        "| quadratic -> linear | 3.5x at 64 / tokens | holds |",
                        "| GQA shrinks the cache | 3.00x | holds |", ""])
    assert markdown_claims_tables(report) == claims
    write_report(report, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert expected in md and claims in md and md.index(expected) < md.index("## The handbook chapter's claims")
    text = text_table(report)
    assert "[kv_cache] quadratic -> linear: holds" in text and "a | b" in text


def test_the_sections_plots_and_claims_come_from_the_one_list_of_sections():
    # the sections are listed once (`bench.SECTIONS`), with their plots (from plots/) and claims
    assert not hasattr(report_module, "SECTION_PLOTS") and not hasattr(report_module, "_baseline_plots")
    for name, section in SECTIONS.items():
        assert section.figures.__module__ == section_plots.__name__, name
        assert section.claims is None or section.claims.__module__.startswith("labsupport.claims."), name
    assert [n for n, s in SECTIONS.items() if s.claims is None] == ["baseline", "engines", "compile", "http_serving"]


def test_html_without_any_plot_has_no_plotly():
    report = synthetic_report()
    report["sections"] = {"empty": {"figures": []}}
    page = html_report(report)
    assert "plotly.js v" not in page and "<table" in page


@pytest.mark.skipif(not TOUR.exists(), reason="no committed tour result")
def test_html_from_the_committed_tour(tmp_path):
    report = json.loads(TOUR.read_text())
    page = html_report(report)
    checker = check_html(page, report)
    for name, section in report["sections"].items():
        assert f'<section id="{name}">' in page
        assert section_figures(name, section), f"section {name} has no plot"
    # Every known section drew its own plots (not the fallback): two each, one for quantization
    # and speculative decoding.
    assert checker.plots == sum(len(section_figures(n, s)) for n, s in report["sections"].items()) >= 12
    assert "Roofline of" in page and "one batch of mixed prompts" in page


def test_a_builder_that_fails_falls_back_to_ratio_bars():
    report = json.loads(TOUR.read_text()) if TOUR.exists() else None
    if report is None:
        pytest.skip("no committed tour result")
    section = copy.deepcopy(report["sections"]["batching"])
    del section["sweep"]
    figs = section_figures("batching", section)
    assert figs and all(f.layout.title.text.startswith("Measured figures") for f in figs)


def test_engines_and_compile_sections_draw_their_figures():
    from labsupport.plots.engines import compile_figure, engines_figure
    row = {"decode_tokens_per_s": 20.0, "prefill_s": 0.05, "bandwidth_fraction": 0.5}
    fig = engines_figure({"rows": {"labsupport fp32": row, "HF generate() fp32": dict(row, decode_tokens_per_s=12.0)},
                          "new_tokens": 16, "absent": {"llama.cpp": "not installed"}})
    assert list(fig.data[0].y) == [20.0, 12.0] and "not installed" in fig.layout.title.text
    assert list(fig.data[0].text) == ["50% of copy bandwidth"] * 2          # a report from before the read probe
    read = dict(row, read_bandwidth_fraction=0.4)
    assert list(engines_figure({"rows": {"labsupport fp32": read}, "new_tokens": 16, "absent": {}}).data[0].text) \
        == ["40% of read bandwidth"]                                        # issue 54: against the read probe
    record = {"row": "fp32", "batch": 1, "eager_decode_tokens_per_s": 20.0, "compiled_decode_tokens_per_s": 25.0,
              "warmup_s": 90.0}
    fig = compile_figure({"rows": [record], "inductor_variants": [dict(record, variant="freezing"),
                                                                  {"variant": "max-autotune", "skipped": "failed"}]})
    assert list(fig.data[1].y) == [25.0, 25.0] and len(fig.data[0].x) == 2


def test_a_figure_that_was_not_measured_says_so():
    from labsupport.plots.sections import value_text
    assert value_text({"value": float("nan"), "unit": "x"}) == "not measured"
    assert value_text({"value": 1.5, "unit": "x"}) == "1.50x"
