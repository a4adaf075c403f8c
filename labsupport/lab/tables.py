"""Markdown tables: the one format every notebook, the report and the claims share.

A table is a header and rows; every cell is written with ``str`` (numbers are
formatted by the caller, as the notebooks do). Display it with
``IPython.display.Markdown``.
"""

from __future__ import annotations


def markdown_table(header, rows) -> str:
    """`header` (column names) and `rows` (sequences of cells) as a Markdown table.

    Notebook 05 (speculative decoding) first shows it; notebooks 06 and 07, the
    claims tables (`records_table`) and the report (`report.markdown_report_table`)
    use it too. Each cell is written as ``str(cell)``, unescaped.
    """
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def records_table(records: list[dict]) -> str:
    """A list of same-keyed dicts as a Markdown table: the first dict's keys are the header.

    Notebook 00 (where the time goes): its claims table; notebooks 03 and 04 use it for theirs.
    """
    keys = list(records[0])
    return markdown_table(keys, [[record[k] for k in keys] for record in records])
