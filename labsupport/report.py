"""The main job's report: a table of what this machine measured, beside the
handbook chapter's claims. Used by ``python -m labsupport tour``."""

from __future__ import annotations

from pathlib import Path

from .bench import all_figures, write_json


def _value(f: dict) -> str:
    v = f["value"]
    if isinstance(v, bool):
        return str(v)
    if f["unit"] == "fraction":
        return f"{100 * v:.0f}%"
    if f["unit"] == "x":
        return f"{v:.2f}x"
    return f"{v:.3g} {f['unit']}"


def _verdict(f: dict) -> str:
    if f["met"] is None:
        return ""
    target = f"{100 * f['target']:.0f}%" if f["unit"] == "fraction" else f"{f['target']:g}{f['unit']}"
    return ("meets" if f["met"] else "MISSES") + f" target {target}"


def table_rows(report: dict) -> list[list[str]]:
    return [[f["name"], _value(f), _verdict(f), f.get("claim") or "", f.get("note") or ""]
            for f in all_figures(report)]


HEADER = ["measurement", "measured", "course target", "handbook chapter's claim", "detail"]


def text_table(report: dict) -> str:
    """A plain-text table for the terminal (the detail column goes on its own line)."""
    rows = table_rows(report)
    widths = [max(len(HEADER[i]), *(len(r[i]) for r in rows)) for i in range(4)]
    line = "  ".join(h.ljust(w) for h, w in zip(HEADER, widths))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if r[4]:
            out.append("    " + r[4])
    return "\n".join(out)


def markdown_table(report: dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in table_rows(report)]
    return "\n".join(lines)


def write_report(report: dict, directory: str | Path) -> Path:
    """Save report.json and report.md in `directory`; returns the markdown path."""
    directory = Path(directory)
    write_json(report, directory / "report.json")
    machine = report["machine"]
    md = [f"# What this machine measured ({report['created']})", "",
          f"Model: {report['model']}; device: {machine['device_name']} ({machine['device']}); "
          f"torch {machine['torch']}, {machine['threads']} threads.", "",
          markdown_table(report), ""]
    path = directory / "report.md"
    path.write_text("\n".join(md))
    return path
