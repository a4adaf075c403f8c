"""The main job's report: a table of what this machine measured, beside the
handbook chapter's claims. Used by ``python -m labsupport tour``."""

from __future__ import annotations

import math
from pathlib import Path

from .bench.core import all_figures, write_json
from .bench.suite import SECTIONS
from .lab.busy import BUSY_VERDICT
from .lab.tables import markdown_table


def _value(f: dict) -> str:
    v = f["value"]
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) and math.isnan(v):
        return "not measured"                       # the note says why (a skipped peer, say)
    if f["unit"] == "fraction":
        return f"{100 * v:.0f}%"
    if f["unit"] == "x":
        return f"{v:.2f}x"
    return f"{v:.3g} {f['unit']}"


def _verdict(f: dict) -> str:
    if f.get("busy"):
        return f"{BUSY_VERDICT} ({f['busy']})"
    if f["met"] is None:
        return ""
    target = f"{100 * f['target']:.0f}%" if f["unit"] == "fraction" else f"{f['target']:g}{f['unit']}"
    return ("meets" if f["met"] else "MISSES") + f" target {target}"


def table_rows(report: dict) -> list[list[str]]:
    """The report's figures as rows of strings, the columns of HEADER. Covers notebooks 00-07 (the tour)."""
    return [[f["name"], _value(f), _verdict(f), f.get("claim") or "", f.get("note") or ""]
            for f in all_figures(report)]


HEADER = ["measurement", "measured", "course target", "handbook chapter's claim", "detail"]


def text_table(report: dict) -> str:
    """A plain-text table for the terminal (the detail column goes on its own line).
    Covers notebooks 00-07 (the tour)."""
    rows = table_rows(report)
    widths = [max(len(HEADER[i]), *(len(r[i]) for r in rows)) for i in range(4)]
    line = "  ".join(h.ljust(w) for h, w in zip(HEADER, widths))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if r[4]:
            out.append("    " + r[4])
    return "\n".join(out)


def markdown_report_table(report: dict) -> str:
    """The report's figures as a Markdown table (`tables.markdown_table`; a "|" in a cell becomes "/").

    Used by ``python -m labsupport tour`` for report.md (notebook 07 runs the same sections)."""
    return markdown_table(HEADER, [[c.replace("|", "/") for c in r] for r in table_rows(report)])


def write_report(report: dict, directory: str | Path) -> Path:
    """Save report.json, report.md and report.html in `directory`; returns the HTML path.
    Covers notebooks 00-07 (the tour)."""
    directory = Path(directory)
    write_json(report, directory / "report.json")
    machine = report["machine"]
    md = [f"# What this machine measured ({report['created']})", "",
          f"Model: {report['model']}; device: {machine['device_name']} ({machine['device']}); "
          f"torch {machine['torch']}, {machine['threads']} threads.", "",
          markdown_report_table(report), ""]
    (directory / "report.md").write_text("\n".join(md))
    return write_html(report, directory / "report.html")


# ------------------------------------------------------------------ the HTML report

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 2.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; width: 100%; margin: .8em 0; font-size: .92em; }
th, td { border: 1px solid #ddd; padding: .35em .55em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { white-space: nowrap; font-variant-numeric: tabular-nums; }
tr.meets td.verdict { color: #1a7f37; } tr.misses td.verdict { color: #b42318; font-weight: bold; }
.detail { color: #555; font-size: .9em; } .plot { margin: 1em 0; } .muted { color: #666; }
"""


def _esc(text) -> str:
    import html
    return html.escape(str(text), quote=True)


def _machine_rows(report: dict) -> list[tuple[str, str]]:
    machine = report.get("machine", {})
    hardware = machine.get("hardware") or {}
    rows = [("created", report.get("created", "")), ("model", report.get("model", "")),
            ("device", f"{machine.get('device_name', '')} ({machine.get('device', '')})"),
            ("torch / python", f"torch {machine.get('torch', '')}, python {machine.get('python', '')}"),
            ("threads", machine.get("threads", ""))]
    if hardware.get("bandwidth"):
        rows.append(("measured copy bandwidth", f"{hardware['bandwidth'] / 1e9:.1f} GB/s"))
    for dtype, flops in (hardware.get("flops") or {}).items():
        rows.append((f"measured matmul speed ({dtype})", f"{flops / 1e9:.0f} GFLOP/s"))
    if report.get("options"):
        rows.append(("options", ", ".join(f"{k}={v}" for k, v in report["options"].items())))
    seconds = [s.get("seconds") for s in report.get("sections", {}).values() if s.get("seconds")]
    if seconds:
        rows.append(("time measuring", f"{sum(seconds):.0f} s"))
    return rows


def _figure_table(figures: list[dict]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in HEADER[:4])
    body = []
    for f in figures:
        verdict = _verdict(f)
        css = "" if f["met"] is None else ("meets" if f["met"] else "misses")
        detail = f"<div class=\"detail\">{_esc(f['note'])}</div>" if f.get("note") else ""
        body.append(f"<tr class=\"figure {css}\"><td>{_esc(f['name'])}{detail}</td>"
                    f"<td class=\"num\">{_esc(_value(f))}</td><td class=\"verdict\">{_esc(verdict)}</td>"
                    f"<td>{_esc(f.get('claim') or '')}</td></tr>")
    return f"<table class=\"figures\"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# Plots per section (`bench.SECTIONS`'s names), from the raw data the bench JSON holds.
# Each returns a list of plotly figures; a section without a builder here, or whose
# builder fails on data it does not expect, gets `ratio_figures` instead.

def _bar_figure(labels, values, texts, y_title: str, title: str, colors="#1f77b4"):
    """One bar per label, its value written above it."""
    import plotly.graph_objects as go
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors, text=texts, textposition="outside"))
    fig.update_yaxes(title=y_title, rangemode="tozero")
    fig.update_layout(title=title, height=380, template="plotly_white", font=dict(size=13))
    return fig


def _baseline_plots(section: dict) -> list:
    from .plots.batching import peer_figure
    figs = [peer_figure(section["tokens_per_s"], "generate(), fp32, greedy, batch 1: labsupport vs Hugging Face")]
    if section.get("bandwidth_achieved_bytes_per_s") and section.get("copy_bandwidth_bytes_per_s"):
        values = {"decode (weights + KV cache read per token)": section["bandwidth_achieved_bytes_per_s"] / 1e9,
                  "measured copy bandwidth": section["copy_bandwidth_bytes_per_s"] / 1e9}
        figs.append(_bar_figure(list(values), list(values.values()), [f"{v:.1f}" for v in values.values()],
                                "memory bandwidth [GB/s]", "Decode: bandwidth used vs the machine's copy bandwidth",
                                colors=["#1f77b4", "#7f7f7f"]))
    return figs


def _roofline_plots(section: dict) -> list:
    from .lab.roofs import HardwareProfile
    from .plots.roofline import roofline_figure, step_time_figure
    rows = [r for dtype_rows in section["sweeps"].values() for r in dtype_rows]
    profile = HardwareProfile(**section["hardware"])
    points = [{**r, "group": f"decode step, {r['dtype']}", "label": f"batch {r['batch']} ({r['dtype']})"}
              for r in rows]
    return [roofline_figure(profile, points), step_time_figure(rows)]


def _kv_cache_plots(section: dict) -> list:
    from .plots.kv_cache import per_token_time_figure
    figs = [per_token_time_figure(section["per_position_s"])]
    rows = list(section.get("rows", [])) + list(section.get("estimated_rows", []))
    if rows:
        labels = [f"{r['new_tokens']} new tokens" + ("" if "timings_s" in r else " (estimated)") for r in rows]
        figs.append(_bar_figure(labels, [r["speedup"] for r in rows], [f"{r['speedup']:.1f}x" for r in rows],
                                "speed-up over the uncached loop [x]", "KV cache speed-up by generation length"))
    return figs


def _batching_plots(section: dict) -> list:
    from .plots.batching import padding_figure, scaling_figure
    rows = [{**r, "ms_per_token": r.get("ms_per_token", r.get("ms_per_step")), "group": "measured (fp32)"}
            for r in section["sweep"]]
    figs = [scaling_figure(rows)]
    if section.get("padding", {}).get("lengths"):
        figs.append(padding_figure([section["padding"]["lengths"]], titles=("one batch of mixed prompts",)))
    return figs


def _precision_plots(section: dict) -> list:
    from .plots.precision import memory_figure, speed_figure
    models = section["models"]
    memory = [{"model": "this model (as loaded)", "dtype": d, "mib": m["bytes"] / 2**20} for d, m in models.items()]
    speed = [{"regime": regime, "dtype": d, "speedup": m.get(f"{key}_speedup")}
             for regime, key in (("decode", "decode"), ("prefill (512-token prompt)", "prefill"))
             for d, m in models.items() if d != "float32"]
    return [memory_figure(memory), speed_figure(speed)]


def _quantization_plots(section: dict) -> list:
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go
    rows = section["rows"]
    names = list(rows)
    panels = [("resident_fraction", "resident bytes / fp32", "{:.0%}"),
              ("memory_fraction", "bytes read per token / fp32", "{:.0%}"),
              ("decode_speedup", "decode speed / fp32 [x]", "{:.2f}x"),
              ("decode_speedup_bf16", "decode speed / bf16 [x]", "{:.2f}x"),
              ("perplexity_increase", "perplexity increase", "{:+.1%}"), ("top1_agreement", "top-1 agreement", "{:.0%}")]
    fig = make_subplots(rows=3, cols=2, subplot_titles=[p[1] for p in panels], vertical_spacing=0.14)
    for i, (key, _, fmt) in enumerate(panels):
        xs = [n for n in names if rows[n].get(key) is not None]
        ys = [rows[n][key] for n in xs]
        fig.add_trace(go.Bar(x=xs, y=ys, text=[fmt.format(v) for v in ys], textposition="outside",
                             marker_color="#1f77b4", showlegend=False, cliponaxis=False),
                      row=i // 2 + 1, col=i % 2 + 1)
    fig.update_layout(title="Quantized weights against fp32 and bf16 (same run)", height=900,
                      template="plotly_white", font=dict(size=12), margin=dict(t=90))
    return [fig]


def _speculative_plots(section: dict) -> list:
    import plotly.graph_objects as go
    fig = go.Figure()
    tasks = section["tasks"]
    engines = list(dict.fromkeys(e for t in tasks.values() for e in t["tokens_per_s"]))
    for engine in engines:
        xs = [t for t in tasks if engine in tasks[t]["tokens_per_s"]]
        ys = [tasks[t]["tokens_per_s"][engine] for t in xs]
        fig.add_trace(go.Bar(x=xs, y=ys, name=engine, text=[f"{v:.1f}" for v in ys], textposition="outside"))
    fig.update_xaxes(title="task")
    fig.update_yaxes(title="throughput [tokens/s]", rangemode="tozero")
    fig.update_layout(title=f"Speculative decoding (k={section.get('k', '?')}): tokens/s per task",
                      barmode="group", height=420, template="plotly_white", font=dict(size=13),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return [fig]


def _serving_plots(section: dict) -> list:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    speed = section["tokens_per_s"]
    metrics = section["metrics"]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1,
                        subplot_titles=("throughput [tokens/s]", "latency percentiles [s]",
                                        "time to first token [s]"))
    fig.add_trace(go.Bar(x=list(speed), y=list(speed.values()), text=[f"{v:.1f}" for v in speed.values()],
                         textposition="outside", marker_color="#1f77b4", showlegend=False, cliponaxis=False),
                  row=1, col=1)
    for key, color in (("latency_p50", "#1f77b4"), ("latency_p99", "#d62728")):
        fig.add_trace(go.Bar(x=list(metrics), y=[m[key] for m in metrics.values()], name=key.replace("_", " "),
                             marker_color=color), row=1, col=2)
    for key, color in (("ttft_p50", "#1f77b4"), ("ttft_p99", "#d62728")):
        policies = [p for p, m in metrics.items() if m.get(key) is not None]
        fig.add_trace(go.Bar(x=policies, y=[metrics[p][key] for p in policies], name=key.replace("_", " "),
                             marker_color=color, opacity=0.6), row=1, col=3)
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="seconds from arrival to last token", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="seconds from arrival to first token", rangemode="tozero", row=1, col=3)
    fig.update_layout(title=f"{section['requests']} requests, {section['slots']} slots, all arriving at once",
                      barmode="group", height=420, template="plotly_white", font=dict(size=12))
    if section.get("load_curve", {}).get("rows"):
        from .plots.serving import load_curve_figure
        return [fig, load_curve_figure(section["load_curve"]["rows"])]
    return [fig]


def _stack_plots(section: dict) -> list:
    from .plots.stack import cumulative_figure
    return [cumulative_figure(section)]


def _engines_plots(section: dict) -> list:
    from .plots.engines import engines_figure
    return [engines_figure(section)]


def _compile_plots(section: dict) -> list:
    from .plots.engines import compile_figure
    return [compile_figure(section)] if section["rows"] else []


def _long_context_plots(section: dict) -> list:
    from .plots.long_context import bench_section_figures
    return bench_section_figures(section)


def _http_serving_plots(section: dict) -> list:
    from .plots.http_serving import http_load_curve_figure
    return [http_load_curve_figure(section["rows"])] if section.get("rows") else []


SECTION_PLOTS = {"baseline": _baseline_plots, "engines": _engines_plots, "roofline": _roofline_plots,
                 "kv_cache": _kv_cache_plots, "batching": _batching_plots, "precision": _precision_plots,
                 "quantization": _quantization_plots, "speculative": _speculative_plots,
                 "serving": _serving_plots, "stack": _stack_plots, "compile": _compile_plots,
                 "long_context": _long_context_plots, "http_serving": _http_serving_plots}

_UNIT_TITLES = {"x": "ratio [x]", "fraction": "fraction [%]"}


def ratio_figures(section: dict) -> list:
    """The fallback: one horizontal bar chart per unit of the section's figures, targets marked.
    Covers notebooks 00-07 (the tour)."""
    import plotly.graph_objects as go
    by_unit: dict[str, list[dict]] = {}
    for f in section.get("figures", []):
        if isinstance(f.get("value"), (int, float)) and not isinstance(f["value"], bool):
            by_unit.setdefault(f["unit"], []).append(f)
    figs = []
    for unit, members in by_unit.items():
        scale = 100 if unit == "fraction" else 1
        fig = go.Figure(go.Bar(
            y=[f["name"] for f in members], x=[scale * f["value"] for f in members], orientation="h",
            marker_color=["#7f7f7f" if f["met"] is None else ("#2ca02c" if f["met"] else "#d62728")
                          for f in members],
            text=[_value(f) for f in members], textposition="auto", name="measured"))
        targets = [f for f in members if f.get("target") is not None]
        if targets:
            fig.add_trace(go.Scatter(y=[f["name"] for f in targets], x=[scale * f["target"] for f in targets],
                                     mode="markers", marker=dict(symbol="line-ns-open", size=22, color="black",
                                                                 line=dict(width=3)), name="course target"))
        fig.update_xaxes(title=_UNIT_TITLES.get(unit, unit), rangemode="tozero")
        fig.update_yaxes(autorange="reversed", automargin=True)
        fig.update_layout(title=f"Measured figures ({_UNIT_TITLES.get(unit, unit)})",
                          height=max(260, 120 + 40 * len(members)), template="plotly_white",
                          font=dict(size=12), legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
        figs.append(fig)
    return figs


def section_figures(name: str, section: dict) -> list:
    """The plots of one section: its own builder where there is one, else (or if it fails) `ratio_figures`.
    Covers notebooks 00-07 (the tour)."""
    builder = SECTION_PLOTS.get(name)
    if builder is not None:
        try:
            figs = builder(section)
            if figs:
                return figs
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError):
            pass
    return ratio_figures(section)


def html_report(report: dict) -> str:
    """The report as one self-contained HTML page (plotly.js inlined once; no network needed).
    Covers notebooks 00-07 (the tour)."""
    parts = []
    plotly_included = False
    for name, section in report.get("sections", {}).items():
        notebook = SECTIONS[name].notebook if name in SECTIONS else None
        title = f"{_esc(name)}" + (f" <span class=\"muted\">(notebook {_esc(notebook)})</span>" if notebook else "")
        seconds = f"<p class=\"muted\">measured in {section['seconds']:.0f} s</p>" if section.get("seconds") else ""
        parts.append(f"<section id=\"{_esc(name)}\"><h2>{title}</h2>{seconds}")
        figures = section.get("figures", [])
        parts.append(_figure_table(figures) if figures else "<p class=\"muted\">no figures</p>")
        for fig in section_figures(name, section):
            fig.update_layout(width=None, autosize=True)
            parts.append("<div class=\"plot\">" + fig.to_html(
                full_html=False, include_plotlyjs=not plotly_included, default_width="100%",
                config={"displaylogo": False, "responsive": True}) + "</div>")
            plotly_included = True
        parts.append("</section>")
    machine = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in _machine_rows(report))
    toc = " · ".join(f"<a href=\"#{_esc(n)}\">{_esc(n)}</a>" for n in report.get("sections", {}))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>What this machine measured ({_esc(report.get('created', ''))})</title>\n"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>{_CSS}</style>\n"
            "</head>\n<body>\n"
            f"<h1>What this machine measured ({_esc(report.get('created', ''))})</h1>\n"
            "<p>Each figure is a ratio of candidates timed alternately in one run, beside the handbook "
            "chapter's claim and the course's target. Absolute times mean something only on a dedicated "
            "machine.</p>\n"
            f"<table class=\"machine\">{machine}</table>\n<p>{toc}</p>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def write_html(report: dict, path: str | Path) -> Path:
    """Write `html_report` to `path`; returns it. Covers notebooks 00-07 (the tour)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_report(report), encoding="utf-8")
    return path
