"""The plots of each benchmark section, from the raw data its dict in the bench JSON holds.

Introduced in notebook 00 (where the time goes); every notebook's section has its builder here,
named by `bench.suite.SECTIONS` (``Section.figures``), and the report (`report.html_report`)
draws them. Each builder takes the section's dict and returns a list of plotly figures,
built from the notebooks' own figure functions where there is one; `ratio_figures` is
the fallback for a section whose data a builder does not expect.
"""

from __future__ import annotations

import math


def value_text(f: dict) -> str:
    """A reported figure's value as the report writes it: "1.50x", "40%", "12.3 GB/s", "not measured".
    Introduced in notebook 00 (where the time goes)."""
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


def _bar_figure(labels, values, texts, y_title: str, title: str, colors="#1f77b4"):
    """One bar per label, its value written above it."""
    import plotly.graph_objects as go
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors, text=texts, textposition="outside"))
    fig.update_yaxes(title=y_title, rangemode="tozero")
    fig.update_layout(title=title, height=380, template="plotly_white", font=dict(size=13))
    return fig


def baseline_figures(section: dict) -> list:
    """The bench section's plots: labsupport vs Hugging Face tokens/s; decode bandwidth vs the read and copy
    bandwidths (the read where the report has it). Notebook 00 (where the time goes)."""
    from .batching import peer_figure
    figs = [peer_figure(section["tokens_per_s"], "generate(), fp32, greedy, batch 1: labsupport vs Hugging Face")]
    if section.get("bandwidth_achieved_bytes_per_s") and section.get("copy_bandwidth_bytes_per_s"):
        read = section.get("read_bandwidth_bytes_per_s")          # absent from reports before the read probe
        values = {"decode (weights + KV cache read per token)": section["bandwidth_achieved_bytes_per_s"] / 1e9,
                  **({"measured read bandwidth": read / 1e9} if read else {}),
                  "measured copy bandwidth": section["copy_bandwidth_bytes_per_s"] / 1e9}
        colors = ["#1f77b4", "#2ca02c", "#7f7f7f"] if read else ["#1f77b4", "#7f7f7f"]
        figs.append(_bar_figure(list(values), list(values.values()), [f"{v:.1f}" for v in values.values()],
                                "memory bandwidth [GB/s]", "Decode: bandwidth used vs the machine's read and copy "
                                "bandwidths", colors=colors))
    return figs


def roofline_figures(section: dict) -> list:
    """The bench section's plots: every decode step of the sweep on the roofline, and the step time by batch.
    Notebook 00 (where the time goes)."""
    from ..lab.roofs import HardwareProfile
    from .roofline import roofline_figure, step_time_figure
    rows = [r for dtype_rows in section["sweeps"].values() for r in dtype_rows]
    profile = HardwareProfile(**section["hardware"])
    points = [{**r, "group": f"decode step, {r['dtype']}", "label": f"batch {r['batch']} ({r['dtype']})"}
              for r in rows]
    return [roofline_figure(profile, points), step_time_figure(rows)]


def kv_cache_figures(section: dict) -> list:
    """The bench section's plots: time per token by position, and the speed-up by generation length.
    Notebook 01 (KV cache)."""
    from .kv_cache import per_token_time_figure
    figs = [per_token_time_figure(section["per_position_s"])]
    rows = list(section.get("rows", [])) + list(section.get("estimated_rows", []))
    if rows:
        labels = [f"{r['new_tokens']} new tokens" + ("" if "timings_s" in r else " (estimated)") for r in rows]
        figs.append(_bar_figure(labels, [r["speedup"] for r in rows], [f"{r['speedup']:.1f}x" for r in rows],
                                "speed-up over the uncached loop [x]", "KV cache speed-up by generation length"))
    return figs


def batching_figures(section: dict) -> list:
    """The bench section's plots: throughput and latency against batch size, and the padded batch.
    Notebook 02 (batching)."""
    from .batching import padding_figure, scaling_figure
    rows = [{**r, "ms_per_token": r.get("ms_per_token", r.get("ms_per_step")), "group": "measured (fp32)"}
            for r in section["sweep"]]
    figs = [scaling_figure(rows)]
    if section.get("padding", {}).get("lengths"):
        figs.append(padding_figure([section["padding"]["lengths"]], titles=("one batch of mixed prompts",)))
    return figs


def precision_figures(section: dict) -> list:
    """The bench section's plots: memory per dtype, and decode and prefill speed-ups.
    Notebook 03 (mixed precision)."""
    from .precision import memory_figure, speed_figure
    models = section["models"]
    memory = [{"model": "this model (as loaded)", "dtype": d, "mib": m["bytes"] / 2**20} for d, m in models.items()]
    speed = [{"regime": regime, "dtype": d, "speedup": m.get(f"{key}_speedup")}
             for regime, key in (("decode", "decode"), ("prefill (512-token prompt)", "prefill"))
             for d, m in models.items() if d != "float32"]
    return [memory_figure(memory), speed_figure(speed)]


def quantization_figures(section: dict) -> list:
    """The bench section's plots: six panels: memory, speed against fp32 and bf16, quality.
    Notebook 04 (quantization)."""
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


def speculative_figures(section: dict) -> list:
    """The bench section's plots: tokens/s of every engine per task.
    Notebook 05 (speculative decoding)."""
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


def serving_figures(section: dict) -> list:
    """The bench section's plots: throughput, latency and time to first token per server; the load curve.
    Notebook 06 (continuous batching)."""
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
        from .serving import load_curve_figure
        return [fig, load_curve_figure(section["load_curve"]["rows"])]
    return [fig]


def stack_figures(section: dict) -> list:
    """The bench section's plots: the cumulative gain of every stage.
    Notebook 07 (putting it together)."""
    from .stack import cumulative_figure
    return [cumulative_figure(section)]


def engines_figures(section: dict) -> list:
    """The bench section's plots: every engine's decode speed and prefill; the int4 batching knee
    where llama.cpp ran. Notebook 00 (where the time goes)."""
    from .engines import engines_figure, knee_figure
    return [engines_figure(section)] + ([knee_figure(section["decode_knee"])] if section.get("decode_knee") else [])


def compile_figures(section: dict) -> list:
    """The bench section's plots: eager vs compiled decode per precision and batch.
    Notebook 07 (putting it together)."""
    from .engines import compile_figure
    return [compile_figure(section)] if section["rows"] else []


def long_context_figures(section: dict) -> list:
    """The bench section's plots: the int8 cache, prefill attention and the crossovers.
    Notebook 08 (long context)."""
    from .long_context import bench_section_figures
    return bench_section_figures(section)


def http_serving_figures(section: dict) -> list:
    """The bench section's plot: latency and throughput against offered load, per server.
    Notebook 09 (serving over HTTP)."""
    from .http_serving import http_load_curve_figure
    return [http_load_curve_figure(section["rows"])] if section.get("rows") else []


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
            text=[value_text(f) for f in members], textposition="auto", name="measured"))
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


def tensor_parallel_figures(section: dict) -> list:
    """The bench section's plot: decode and prefill speed per tensor-parallel degree, with the
    share of each spent inside the all-reduces. Notebook 10 (past one device)."""
    from .tensor_parallel import degrees_figure
    return [degrees_figure(section["result"])] if section.get("result") else []
