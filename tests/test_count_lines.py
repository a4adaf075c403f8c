"""The README's table of the engine's size goals is the one scripts/count_lines.py writes now (issue 39):
the sizes cannot drift from the code, and the counting rules are tested."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("count_lines", ROOT / "scripts" / "count_lines.py")
cl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cl)


def test_the_readme_holds_the_table_this_code_gives():
    readme = (ROOT / "README.md").read_text()
    assert cl.readme_with_table(readme, cl.goals_table()) == readme, \
        "the README's engine sizes are out of date: run python scripts/count_lines.py --readme"


def test_every_goal_names_paths_that_exist_and_a_peer():
    for name, paths, peer, peer_lines, goal in cl.GOALS:
        assert all((ROOT / "labsupport" / "engine" / p).exists() for p in paths), name
        assert peer.startswith(("nano-vllm ", "gpt-fast ")) and peer_lines > 0 and goal >= 1


def test_code_docstrings_comments_and_blank_lines_are_told_apart(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""A module.\n\nTwo lines."""\n\n# a comment\nx = 1  # code, with a comment\n\n'
                      'def f():\n    """Its docstring."""\n    return x\n')
    assert cl.count(source) == (3, 3, 1, 3)     # code: x =, def, return; docstrings 2 + 1 (its blank line is blank)


def test_check_blocks_count_only_an_if_whose_whole_body_is_one_raise(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f(x):\n    if x < 0:\n        raise ValueError(\n            'negative')\n"
                      "    if x > 9:\n        x = 9\n        raise ValueError('big')\n"
                      "    if x == 3:\n        raise ValueError('three')\n    else:\n        pass\n"
                      "    if x == 4: raise ValueError('four')\n    return x\n")
    assert cl.check_blocks(source) == (2, 4)     # the first (3 lines) and the one-liner; not those with more
    assert "x nano-vllm now" in cl.checks_summary()
