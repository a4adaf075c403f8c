"""The main job's report: a table of what this machine measured, and each section's claims
table, the handbook chapter's claims with the verdicts this run gave them. Used by
``python -m labsupport tour``.

One verdict path: a figure's verdict is its course target (`bench.reported`); a claim's is
its section's claims function (`bench.suite.Section.claims`, run by the suite into each
section's ``"claims"``), which the report only renders. The sections, their notebooks and
their plots come from `bench.suite.SECTIONS`; the plots are drawn by `plots.sections`.
"""

from __future__ import annotations

from pathlib import Path

from .bench.core import all_figures, require_writable, write_json
from .bench.suite import SECTIONS
from .lab.busy import BUSY_VERDICT
from .lab.tables import markdown_table
from .plots.sections import ratio_figures, value_text


def _verdict(f: dict) -> str:
    if f.get("busy"):
        return f"{BUSY_VERDICT} ({f['busy']})"
    if f["met"] is None:
        return ""
    target = f"{100 * f['target']:.0f}%" if f["unit"] == "fraction" else f"{f['target']:g}{f['unit']}"
    return ("meets" if f["met"] else "MISSES") + f" target {target}"


def table_rows(report: dict) -> list[list[str]]:
    """The report's figures as rows of strings, the columns of HEADER. Covers notebooks 00-08 (the tour)."""
    return [[f["name"], value_text(f), _verdict(f), f.get("note") or ""] for f in all_figures(report)]


HEADER = ["measurement", "measured", "course target", "detail"]


def section_claims(report: dict) -> dict[str, list[dict]]:
    """Each section's claims table (its ``"claims"`` rows, as its claims function gave them), by
    section, for the sections that have one. Covers notebooks 00-08 (the tour)."""
    return {name: section["claims"] for name, section in report.get("sections", {}).items() if section.get("claims")}


def _claim_text(row: dict) -> str:
    """What a claims-table row is about, in one phrase: every cell but what was measured and
    the verdict (the claim, and its topic, format or dtype where the table has them)."""
    return ", ".join(str(v) for k, v in row.items() if k not in ("measured", "measured here", "verdict"))


def _cells(row: dict) -> list[str]:
    return [str(v) for v in row.values()]


def text_table(report: dict) -> str:
    """A plain-text table for the terminal (the detail column goes on its own line), then each
    section's claims, one line each. Covers notebooks 00-08 (the tour)."""
    rows = table_rows(report)
    widths = [max(len(HEADER[i]), *(len(r[i]) for r in rows)) for i in range(3)] if rows else [0, 0, 0]
    line = "  ".join(h.ljust(w) for h, w in zip(HEADER, widths))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if r[3]:
            out.append("    " + r[3])
    claims = section_claims(report)
    if claims:
        out += ["", "The handbook chapter's claims against this run:"]
        for name, rows in claims.items():
            out += [f"  [{name}] {_claim_text(row)}: {row['verdict']}" for row in rows]
    return "\n".join(out)


def markdown_report_table(report: dict) -> str:
    """The report's figures as a Markdown table (`tables.markdown_table`; a "|" in a cell becomes "/").

    Used by ``python -m labsupport tour`` for report.md (notebook 07 runs the same sections)."""
    return markdown_table(HEADER, [[c.replace("|", "/") for c in r] for r in table_rows(report)])


def markdown_claims_tables(report: dict) -> str:
    """Each section's claims table in Markdown, under a heading naming its notebook ("" when no
    section has claims). Used by ``python -m labsupport tour`` for report.md; covers notebooks 00-08."""
    parts = []
    for name, rows in section_claims(report).items():
        notebook = f" (notebook {SECTIONS[name].notebook})" if name in SECTIONS else ""
        parts += [f"### {name}{notebook}", "",
                  markdown_table(list(rows[0]), [[c.replace("|", "/") for c in _cells(r)] for r in rows]), ""]
    return "\n".join(parts)


REPORT_FILES = ("report.json", "report.md", "report.html")


def require_writable_report(directory: str | Path) -> Path:
    """`directory` as a Path, once each of `REPORT_FILES` can be written in it
    (`bench.core.require_writable`); else one sentence. ``tour`` checks it before measuring.
    Covers notebooks 00-08 (the tour)."""
    directory = Path(directory)
    for name in REPORT_FILES:
        require_writable(directory / name)
    return directory


def write_report(report: dict, directory: str | Path) -> Path:
    """Save report.json, report.md and report.html in `directory`; returns the HTML path.
    Covers notebooks 00-08 (the tour)."""
    directory = Path(directory)
    write_json(report, directory / "report.json")
    machine = report["machine"]
    md = [f"# What this machine measured ({report['created']})", "",
          f"Model: {report['model']}; device: {machine['device_name']} ({machine['device']}); "
          f"torch {machine['torch']}, {machine['threads']} threads.", "",
          markdown_report_table(report), ""]
    claims = markdown_claims_tables(report)
    if claims:
        md += ["## The handbook chapter's claims against this run", "", claims]
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
    options = report.get("options") or {}
    if options and all(isinstance(v, dict) for v in options.values()):       # one row per section's options
        rows += [(f"options: {name}", ", ".join(f"{k}={v}" for k, v in fields.items()))
                 for name, fields in options.items()]
    elif options:                                                             # a report from before (flat)
        rows.append(("options", ", ".join(f"{k}={v}" for k, v in options.items())))
    seconds = [s.get("seconds") for s in report.get("sections", {}).values() if s.get("seconds")]
    if seconds:
        rows.append(("time measuring", f"{sum(seconds):.0f} s"))
    return rows


def _figure_table(figures: list[dict]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in HEADER[:3])
    body = []
    for f in figures:
        verdict = _verdict(f)
        css = "" if f["met"] is None else ("meets" if f["met"] else "misses")
        detail = f"<div class=\"detail\">{_esc(f['note'])}</div>" if f.get("note") else ""
        body.append(f"<tr class=\"figure {css}\"><td>{_esc(f['name'])}{detail}</td>"
                    f"<td class=\"num\">{_esc(value_text(f))}</td><td class=\"verdict\">{_esc(verdict)}</td></tr>")
    return f"<table class=\"figures\"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _claims_table(rows: list[dict]) -> str:
    """A section's claims table: its rows' keys as the header (claim, measured, verdict, ...)."""
    head = "".join(f"<th>{_esc(k)}</th>" for k in rows[0])
    body = "".join("<tr class=\"claim\">" + "".join(f"<td>{_esc(v)}</td>" for v in row.values()) + "</tr>"
                   for row in rows)
    return (f"<h3>The handbook chapter's claims</h3><table class=\"claims\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def section_figures(name: str, section: dict) -> list:
    """The plots of one section: its builder (`SECTIONS[name].figures`, from `plots.sections`)
    where there is one, else (or if it fails on data it does not expect) `plots.sections.ratio_figures`.
    Covers notebooks 00-08 (the tour)."""
    builder = SECTIONS[name].figures if name in SECTIONS else None
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
    Covers notebooks 00-08 (the tour)."""
    parts = []
    plotly_included = False
    for name, section in report.get("sections", {}).items():
        notebook = SECTIONS[name].notebook if name in SECTIONS else None
        title = f"{_esc(name)}" + (f" <span class=\"muted\">(notebook {_esc(notebook)})</span>" if notebook else "")
        seconds = f"<p class=\"muted\">measured in {section['seconds']:.0f} s</p>" if section.get("seconds") else ""
        parts.append(f"<section id=\"{_esc(name)}\"><h2>{title}</h2>{seconds}")
        figures = section.get("figures", [])
        parts.append(_figure_table(figures) if figures else "<p class=\"muted\">no figures</p>")
        if section.get("claims"):
            parts.append(_claims_table(section["claims"]))
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
            "<p>Each figure is a ratio of candidates timed alternately in one run, beside the course's "
            "target; each section's claims table sets the handbook chapter's claims against this run, with "
            "the verdicts its claims function computed. Absolute times mean something only on a dedicated "
            "machine.</p>\n"
            f"<table class=\"machine\">{machine}</table>\n<p>{toc}</p>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def write_html(report: dict, path: str | Path) -> Path:
    """Write `html_report` to `path`; returns it. Covers notebooks 00-08 (the tour)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_report(report), encoding="utf-8")
    return path
