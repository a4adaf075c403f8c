"""How long the notebooks' sentences are: the mean words per sentence of each notebook's prose.

Issue 37 asks for prose a learner whose first language is not English can read: one idea per
sentence, under 20 words on average. This script measures it the same way for every notebook:

- only markdown cells count (code and its output are not prose);
- headings, tables, fenced code and HTML tags are left out; inline code and a formula count as one word;
  a link counts as its text;
- a sentence ends at '.', '!' or '?' before a space, and at the end of a list item or a paragraph
  (a colon does not end one); "e.g.", "i.e.", "etc.", "vs.", "et al." and "cf." do not end one.

    python scripts/sentence_lengths.py            # a table, one row per notebook
    python scripts/sentence_lengths.py --longest 5  # and each notebook's five longest sentences

tests/test_prose_length.py holds every notebook under the limit.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
LIMIT = 20  # mean words per sentence, per notebook

_ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf|al|approx|no|Fig)\.", re.IGNORECASE)
_FENCE = re.compile(r"```.*?```", re.DOTALL)
_MATH_BLOCK = re.compile(r"\$\$.*?\$\$", re.DOTALL)
_INLINE = re.compile(r"`[^`]*`|\$[^$]+\$")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_TAG = re.compile(r"<[^>]+>")
_ENDS = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z0-9][\w'’./%x×-]*")


def prose_lines(markdown: str) -> list[str]:
    """The paragraphs and list items of one markdown cell, each as one line of plain text."""
    text = _FENCE.sub(" ", markdown)
    text = _MATH_BLOCK.sub(" formula ", text)
    text = _INLINE.sub(" token ", text)
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub(" ", text)
    blocks, current = [], []
    for raw in text.splitlines():
        line = raw.strip()
        starts_item = bool(re.match(r"([-*+]|\d+[.)])\s", line))
        if not line or line.startswith(("#", "|")) or starts_item:
            if current:
                blocks.append(" ".join(current))
            current = []
            if starts_item:
                current = [re.sub(r"^([-*+]|\d+[.)])\s+", "", line)]
            continue
        if line.startswith(">"):
            line = line.lstrip("> ")
        current.append(line)
    if current:
        blocks.append(" ".join(current))
    return [b for b in blocks if b.strip()]


def sentences(markdown: str) -> list[str]:
    """The sentences of one markdown cell (see the module docstring for the rules)."""
    found = []
    for block in prose_lines(markdown):
        guarded = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\u2024"), block)
        found += [s.replace("\u2024", ".") for s in _ENDS.split(guarded) if _WORD.search(s)]
    return found


def words(sentence: str) -> int:
    return len(_WORD.findall(sentence))


def notebook_sentences(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [s for c in cells if c["cell_type"] == "markdown" for s in sentences("".join(c["source"]))]


def report(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        found = notebook_sentences(path)
        counts = [words(s) for s in found]
        rows.append({"notebook": path.name, "sentences": len(found),
                     "mean_words": round(statistics.fmean(counts), 1) if counts else 0.0,
                     "over_40": sum(c > 40 for c in counts),
                     "longest": sorted(found, key=words, reverse=True)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longest", type=int, default=0, help="print each notebook's N longest sentences")
    args = parser.parse_args(argv)
    rows = report(sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")))
    print(f"{'notebook':36} {'sentences':>9} {'mean words':>10} {'> 40 words':>10}")
    for row in rows:
        print(f"{row['notebook']:36} {row['sentences']:9d} {row['mean_words']:10.1f} {row['over_40']:10d}")
        for s in row["longest"][:args.longest]:
            print(f"    ({words(s)}) {s}")
    worst = max(rows, key=lambda r: r["mean_words"])
    print(f"limit {LIMIT} words on average; the longest-worded notebook: {worst['notebook']} ({worst['mean_words']})")
    return 0 if worst["mean_words"] < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
