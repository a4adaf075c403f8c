"""Issue 37: the notebooks' prose, one idea per sentence. scripts/sentence_lengths.py measures the mean words
per sentence of each notebook's markdown; every notebook stays under its limit, and the counting rules are
tested so that the limit cannot be met by the measure going wrong."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sentence_lengths", ROOT / "scripts" / "sentence_lengths.py")
sl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sl)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_every_notebook_is_measured():
    assert len(NOTEBOOKS) >= 10


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_mean_sentence_under_the_limit(path):
    row = sl.report([path])[0]
    assert row["sentences"] > 40, f"{path.name}: only {row['sentences']} sentences found; is the prose read?"
    longest = "\n".join(f"({sl.words(s)}) {s}" for s in row["longest"][:5])
    assert row["mean_words"] < sl.LIMIT, (
        f"{path.name} averages {row['mean_words']} words per sentence (limit {sl.LIMIT}); its longest:\n{longest}")


def test_sentences_end_at_stops_not_at_abbreviations_or_decimals():
    found = sl.sentences("A step reads 2.5 GB, e.g. the weights. Then it ends! Does it? Yes")
    assert len(sl.sentences("As Kwon et al. show, paging works.")) == 1
    assert found == ["A step reads 2.5 GB, e.g. the weights.", "Then it ends!", "Does it?", "Yes"]


def test_a_colon_does_not_end_a_sentence():
    assert len(sl.sentences("The rule: keep one idea per sentence, and measure it.")) == 1


def test_code_math_and_links_count_as_words_not_as_sentences():
    text = "Call `ls.generate(model, ids, max_new_tokens=8)` with $O(N^2)$ cost, as [the README](../README.md) says."
    (only,) = sl.sentences(text)
    assert sl.words(only) == 9           # Call token with token cost, as the README says
    assert "README" in only and "http" not in only


def test_headings_tables_and_fenced_code_are_not_prose():
    text = "# 06 · Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\nx = 1. y = 2.\n```\n\nOne sentence here."
    assert sl.sentences(text) == ["One sentence here."]


def test_each_list_item_and_paragraph_ends_a_sentence():
    text = "First paragraph without a stop\n\n- an item without a stop\n- another item\n  wrapped onto a second line"
    assert sl.sentences(text) == ["First paragraph without a stop", "an item without a stop",
                                  "another item wrapped onto a second line"]


def test_a_long_sentence_is_counted_whole():
    long = " ".join(["word"] * 45) + "."
    (only,) = sl.sentences(long)
    assert sl.words(only) == 45


def test_the_script_exits_nonzero_over_the_limit(monkeypatch, capsys):
    monkeypatch.setattr(sl, "LIMIT", 1)
    assert sl.main([]) == 1
    assert "limit 1 words" in capsys.readouterr().out
