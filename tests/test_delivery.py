"""Course delivery: Colab setup cells and badges, Binder/conda files, student versions.

What runs for real here: the setup cell (exec'd with a fake Colab module and a fake %pip),
the badge generator, nbgrader's ClearSolutions on every notebook, and one student notebook
(01, the cheapest: its first exercise comes after a model load and 16 naive tokens)
executed with nbclient up to its first exercise. What cannot run here: Colab, Binder, conda.
"""

import re
import stat
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import yaml  # PyYAML: a dependency of jupyter-events, which jupyterlab requires

from labsupport import cli, delivery
from labsupport.errors import LabError
from labsupport.delivery import (CODE_STUB, README_END, README_START, SETUP_MARKER, STUB_MESSAGE,
                                 apply_delivery_cells, is_solution_cell, needs_install, setup_cell_source,
                                 student_version, write_badges)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def _pyproject():
    tomllib = pytest.importorskip("tomllib")                          # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _read(path):
    return nbformat.read(path, as_version=4)


# --------------------------------------------------------------------------
# The setup cell
# --------------------------------------------------------------------------


class FakeShell:
    """Stands in for IPython: records the %pip line magic instead of running pip."""

    def __init__(self):
        self.magics = []

    def run_line_magic(self, name, line):
        self.magics.append((name, line))


def _run_setup_cell(monkeypatch, on_colab: bool, installed: bool):
    from IPython.core.inputtransformer2 import TransformerManager

    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    import importlib.util
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "labsupport" and not installed else real_find_spec(name, *a))
    shell = FakeShell()
    code = TransformerManager().transform_cell(setup_cell_source("someone/course", "dev"))
    namespace = {"get_ipython": lambda: shell}
    exec(compile(code, "<setup cell>", "exec"), namespace)
    return shell, namespace


@pytest.mark.parametrize("on_colab, installed", [(True, False), (True, True), (False, True)])
def test_setup_cell_installs_only_on_colab_when_missing(monkeypatch, capsys, on_colab, installed):
    shell, namespace = _run_setup_cell(monkeypatch, on_colab, installed)
    expected = [("pip", 'install -q "labsupport @ git+https://github.com/someone/course@dev"')]
    assert shell.magics == (expected if on_colab and not installed else [])
    # the decision is the pure function's
    import importlib.util
    assert bool(shell.magics) == needs_install(sys.modules, importlib.util.find_spec)
    # then labsupport is imported, set up, and the cell says where it runs
    assert namespace["ls"].__name__ == "labsupport"
    out = capsys.readouterr().out
    assert "device cpu" in out and "torch" in out
    assert ("Google Colab" in out) == on_colab


def test_setup_cell_without_labsupport_elsewhere_says_what_to_do(monkeypatch):
    with pytest.raises(ModuleNotFoundError, match="make install"):
        _run_setup_cell(monkeypatch, on_colab=False, installed=False)


def test_needs_install_pure():
    found, missing = (lambda name: object()), (lambda name: None)
    assert needs_install({"google.colab": object()}, missing)
    assert not needs_install({"google.colab": object()}, found)
    assert not needs_install({}, missing)
    assert not needs_install({}, found)


def test_setup_cell_keeps_colab_torch():
    source = setup_cell_source("a/b")
    assert "torch" not in source.split("%pip", 1)[1].split("\n", 1)[0]      # no torch on the pip line
    assert "--force-reinstall" not in source and "--upgrade" not in source
    deps = _pyproject()["dependencies"]
    torch_spec = next(d for d in deps if re.match(r"torch\b", d))
    assert "==" not in torch_spec and "<" not in torch_spec                 # Colab's build satisfies it


# --------------------------------------------------------------------------
# Badges: generated from REPO, idempotent, and the committed files are up to date
# --------------------------------------------------------------------------


def test_notebooks_and_readme_are_up_to_date():
    stale = write_badges(ROOT, dry_run=True)
    assert not stale, f"stale: {stale}; run python -m labsupport badges"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_has_badge_and_setup_cell_first(path):
    nb = _read(path)
    assert delivery.colab_url(path.name) in nb.cells[0].source
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.source == setup_cell_source()
    assert first_code.outputs == [] and first_code.execution_count is None


def test_badges_rewrite_for_a_new_repo_and_are_idempotent(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for path in NOTEBOOKS[:2]:
        (tmp_path / "notebooks" / path.name).write_text(path.read_text())
    (tmp_path / "README.md").write_text(f"# x\n\n{README_START}\nold\n{README_END}\n\nrest\n")
    changed = write_badges(tmp_path, "alice/llm-course", "main")
    assert len(changed) == 3
    assert write_badges(tmp_path, "alice/llm-course", "main") == []                   # idempotent
    readme = (tmp_path / "README.md").read_text()
    assert "old" not in readme and readme.endswith("\n\nrest\n")
    assert readme.count("colab.research.google.com/github/alice/llm-course/blob/main/notebooks/") == 2
    assert "mybinder.org/v2/gh/alice/llm-course/main" in readme
    nb = _read(tmp_path / "notebooks" / NOTEBOOKS[0].name)
    text = nbformat.writes(nb)
    assert "OWNER/REPO" not in text and text.count("alice/llm-course") == 2          # badge + pip line
    assert sum(c.cell_type == "code" and c.source.startswith(SETUP_MARKER) for c in nb.cells) == 1


def test_setup_cell_inserted_into_a_new_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 06 · Continuous batching\n\nWhy a scheduler."),
                nbformat.v4.new_code_cell("import labsupport as ls\nls.notebook_setup()\n\nimport torch\n"
                                          "device = ls.pick_device()")]
    assert apply_delivery_cells(nb, "06_continuous_batching.ipynb", "a/b")
    assert nb.cells[0].source.split("\n")[:3] == ["# 06 · Continuous batching", "",
                                                  delivery.colab_badge("06_continuous_batching.ipynb", "a/b")]
    assert nb.cells[1].source == setup_cell_source("a/b")
    assert nb.cells[2].source == "import torch\ndevice = ls.pick_device()"
    assert not apply_delivery_cells(nb, "06_continuous_batching.ipynb", "a/b")         # idempotent
    nbformat.validate(nb)


def test_badges_command_stores_the_slug_in_one_place(tmp_path, capsys):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "labsupport").mkdir()
    (tmp_path / "notebooks" / NOTEBOOKS[0].name).write_text(NOTEBOOKS[0].read_text())
    (tmp_path / "labsupport" / "delivery.py").write_text(Path(delivery.__file__).read_text())
    (tmp_path / "README.md").write_text(f"{README_START}\n{README_END}\n")
    assert cli.main(["badges", "--root", str(tmp_path), "--repo", "bob/course"]) == 0
    assert 'REPO = "bob/course"' in (tmp_path / "labsupport" / "delivery.py").read_text()
    assert 'REPO = "bob/course"' not in Path(delivery.__file__).read_text()       # the real one untouched
    assert "github.com/bob/course@main" in (tmp_path / "notebooks" / NOTEBOOKS[0].name).read_text()


def test_repo_constant_rewrite():
    source = Path(delivery.__file__).read_text()
    new = delivery.set_repo_constant(source, "alice/course", "trunk")
    assert 'REPO = "alice/course"' in new and 'BRANCH = "trunk"' in new
    assert new.count("alice/course") == 1
    with pytest.raises(LabError, match="OWNER/NAME"):
        delivery.require_slug("not a slug")


# --------------------------------------------------------------------------
# Colab: explorers fall back to static figures in an Output widget
# --------------------------------------------------------------------------


def test_explorer_falls_back_to_output_on_colab(monkeypatch):
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labsupport.explorers.base import Explorer, figure_widgets_render

    slider = widgets.IntSlider(value=1, min=1, max=3)
    render = lambda values: [go.Figure(go.Scatter(y=[values["n"]] * 3))]        # noqa: E731
    assert figure_widgets_render()
    assert isinstance(Explorer({"n": slider}, render).figures[0].widget, go.FigureWidget)

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert not figure_widgets_render()
    explorer = Explorer({"n": widgets.IntSlider(value=1, min=1, max=3)}, render)
    live = explorer.figures[0]
    assert isinstance(live.widget, widgets.Output) and not live.use_widget
    explorer.controls["n"].value = 3
    assert list(live.figure.data[0].y) == [3, 3, 3]                  # redrawn in the Output


# --------------------------------------------------------------------------
# Binder and conda
# --------------------------------------------------------------------------

# pip name in pyproject -> conda-forge name, where they differ (PyPI's torch is conda-forge's pytorch)
CONDA_NAMES = {"torch": "pytorch"}


def _name(spec: str) -> str:
    return re.split(r"[\s<>=!~\[;]", spec.strip(), maxsplit=1)[0].lower()


def _env_packages(path):
    env = yaml.safe_load(path.read_text())
    assert "conda-forge" in env["channels"]
    conda, pip = set(), set()
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            pip |= {_name(s) for s in entry["pip"] if not s.startswith("-")}
        else:
            conda.add(_name(entry))
    return env, conda, pip


@pytest.mark.parametrize("path", ["environment.yml", "binder/environment.yml"])
def test_environment_names_the_pyproject_dependencies(path):
    env, conda, pip = _env_packages(ROOT / path)
    wanted = {CONDA_NAMES.get(_name(d), _name(d)) for d in _pyproject()["dependencies"]}
    missing = wanted - conda - pip
    assert not missing, f"{path} lacks {missing} (pyproject.toml's dependencies)"
    assert "torch" not in pip                                        # torch comes from conda only
    assert "python" in conda and "pip" in conda


def test_binder_gets_the_cpu_build_and_root_lets_conda_choose():
    binder = yaml.safe_load((ROOT / "binder/environment.yml").read_text())["dependencies"]
    root = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert "pytorch[version='>=2.11',build='cpu*']" in binder           # the CPU build, pyproject's floor
    torch_root = next(d for d in root if isinstance(d, str) and _name(d) == "pytorch")
    assert "cpu" not in torch_root and "cuda" not in torch_root      # __cuda decides
    env_text = (ROOT / "environment.yml").read_text()
    assert "__cuda" in env_text and "CONDA_OVERRIDE_CUDA" in env_text
    pip = next(d for d in root if isinstance(d, dict))["pip"]
    assert "-e ." in pip                                             # labsupport itself
    extras = _pyproject()["optional-dependencies"]
    _, conda, pip_names = _env_packages(ROOT / "environment.yml")
    missing = {_name(d) for d in extras["test"] + extras["instructor"] + extras["lab"]} - conda - pip_names
    assert not missing, f"environment.yml lacks {missing} (pyproject.toml's test/instructor/lab extras)"


# Jupyter's server side and the tools for developers: a hosted Jupyter (Colab) has its own,
# and installing another version replaces them. None may be reachable from the core.
SERVER_AND_TOOLS = {"jupyterlab", "notebook", "jupyter-server", "jupyter", "nbclassic", "jupyter-lsp",
                    "jupyterlab-server", "nbconvert", "nbgrader", "pytest", "nbval", "playwright"}


def _requirement_names(distribution: str) -> set[str]:
    """The names of what `distribution` requires unconditionally (no extras, no markers that fail)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    names = set()
    for text in metadata.requires(distribution) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.add(req.name.lower().replace("_", "-"))
    return names


def test_the_core_dependencies_pull_no_jupyter_server_and_no_test_tool():
    """What Colab installs (pyproject's core list, and everything it requires in turn) never
    reaches JupyterLab, a Jupyter server, nbgrader or a test tool: those are extras."""
    from importlib import metadata

    core = {_name(d).replace("_", "-") for d in _pyproject()["dependencies"]}
    assert not core & SERVER_AND_TOOLS, f"move {core & SERVER_AND_TOOLS} to an extra"
    seen, todo, path = set(), sorted(core), {name: name for name in core}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            required = _requirement_names(name)
        except metadata.PackageNotFoundError:        # an optional platform package not installed here
            continue
        for child in required - seen:
            path.setdefault(child, f"{path[name]} -> {child}")
            todo.append(child)
    pulled = sorted(path[name] for name in seen & SERVER_AND_TOOLS)
    assert not pulled, f"the core dependencies pull {pulled}"


def test_postbuild_installs_and_fetches_the_model():
    post = ROOT / "binder" / "postBuild"
    assert post.stat().st_mode & stat.S_IXUSR, "binder/postBuild must be executable"
    text = post.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -e" in text
    assert "pip install --no-deps -e ." in text
    assert "embedded_model_dir()" in text                            # the download + conversion
    from labsupport.weights.embedded import embedded_model_dir        # the function it calls exists
    assert callable(embedded_model_dir)


# --------------------------------------------------------------------------
# Student versions
# --------------------------------------------------------------------------


def _solution_lines(source: str) -> set[str]:
    inside, lines = False, set()
    for line in source.split("\n"):
        if "BEGIN SOLUTION" in line:
            inside = True
        elif "END SOLUTION" in line:
            inside = False
        elif inside and line.strip():
            lines.add(line.strip())
    outside = {l.strip() for l in re.sub(r"BEGIN SOLUTION.*?END SOLUTION", "", source, flags=re.S).split("\n")}
    return lines - outside                                           # lines that exist only in the solution


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_student_version_has_stubs_and_no_solutions(path):
    teacher = _read(path)
    student = student_version(teacher)
    nbformat.validate(student)
    assert len(student.cells) == len(teacher.cells)
    text = nbformat.writes(student)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    solutions = [i for i, c in enumerate(teacher.cells) if is_solution_cell(c)]
    assert len(solutions) >= 2, "each notebook has two or more exercises"
    for i in solutions:
        assert f'raise NotImplementedError("{STUB_MESSAGE}")' in student.cells[i].source
        for line in _solution_lines(teacher.cells[i].source):
            assert line not in student.cells[i].source, f"cell {i} still shows {line!r}"
        assert student.cells[i].metadata["nbgrader"] == teacher.cells[i].metadata["nbgrader"]
    for cell in student.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    compile_all = "\n".join(c.source for c in student.cells if c.cell_type == "code" and "%" not in c.source)
    compile(compile_all, path.name, "exec")                          # the stubs leave valid Python


def test_student_command_writes_every_notebook(tmp_path, capsys):
    """`python -m labsupport student` (one command line, `labsupport.cli`), as `make student` runs it."""
    assert cli.main(["student", "--root", str(ROOT), "--out", str(tmp_path / "student")]) == 0
    written = sorted(p.name for p in (tmp_path / "student").glob("*.ipynb"))
    assert written == [p.name for p in NOTEBOOKS]
    assert f"{len(NOTEBOOKS)} student notebook(s) in {tmp_path / 'student'}/" in capsys.readouterr().out
    for path in written:                                             # solutions gone, outputs empty
        assert "BEGIN SOLUTION" not in (tmp_path / "student" / path).read_text()
    make = (ROOT / "Makefile").read_text()
    assert "\t$(PY) -m labsupport student --out student\n" in make


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_old_delivery_command_forwards_and_mistakes_are_one_sentence(tmp_path):
    """`python -m labsupport.delivery` runs the one command line; a mistake is one line, status 2."""
    done = _run("labsupport.delivery", "student", "--root", str(tmp_path), "--out", str(tmp_path / "s"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith("error: No notebooks under") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _run("labsupport", "check").returncode == 0


def _notebook(*cells):
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    return nb


@pytest.mark.parametrize("case, words", [
    ("unclosed solution", "no end solution statement found"),
    ("solution outside a solution cell", "Solution region detected in a non-solution cell"),
    ("another kernel", "language 'julia'"),
])
def test_bad_markup_for_a_student_version_is_a_lab_error(case, words):
    source = "x = 1\n# BEGIN SOLUTION\nx = 2" + ("" if case == "unclosed solution" else "\n# END SOLUTION")
    cell = nbformat.v4.new_code_cell(source)
    if case != "solution outside a solution cell":
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": "x",
                                     "schema_version": 3}
    nb = _notebook(nbformat.v4.new_markdown_cell("# 09 · Title"), cell)
    if case == "another kernel":
        nb.metadata["kernelspec"]["language"] = "julia"
    with pytest.raises(LabError, match=re.escape(words)) as err:
        student_version(nb, "09_bad.ipynb")
    assert str(err.value).startswith("09_bad.ipynb: ") and "\n" not in str(err.value)


def test_bad_input_to_the_delivery_commands_is_a_lab_error(tmp_path):
    with pytest.raises(LabError, match="has no code cell"):
        apply_delivery_cells(_notebook(nbformat.v4.new_markdown_cell("# 09 · Title")), "09_x.ipynb")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / NOTEBOOKS[0].name).write_text(NOTEBOOKS[0].read_text())
    with pytest.raises(LabError, match="No README.md"):
        write_badges(tmp_path, dry_run=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(LabError, match="is a file, not a folder"):
        delivery.write_student_versions(tmp_path, tmp_path / "file")
    (tmp_path / "notebooks" / "09_broken.ipynb").write_text("{ not json")
    with pytest.raises(LabError, match="09_broken.ipynb is not a readable notebook"):
        delivery.write_student_versions(tmp_path, tmp_path / "out")


def test_code_stub_is_nbgraders_form():
    assert CODE_STUB.splitlines() == ["# YOUR CODE HERE", f'raise NotImplementedError("{STUB_MESSAGE}")']


@pytest.mark.slow
def test_student_notebook_runs_to_its_first_exercise_then_stops_there(tmp_path):
    """Notebook 01, student version, up to the checker after its first exercise: every cell
    before runs clean, and the first error is the stub's NotImplementedError (about 20 s)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    student = student_version(_read(ROOT / "notebooks" / "01_kv_cache.ipynb"))
    first = next(i for i, c in enumerate(student.cells) if is_solution_cell(c))
    student.cells = student.cells[:first + 2]                         # the exercise and its checker
    client = NotebookClient(student, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as error:
        client.execute()
    assert error.value.ename == "NotImplementedError"
    assert STUB_MESSAGE in error.value.evalue
    failed = [i for i, c in enumerate(student.cells)
              if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)]
    assert failed and failed[0] in (first, first + 1)                # at the exercise, not before
    assert all(c.execution_count for c in student.cells[:failed[0]] if c.cell_type == "code")


def test_the_torch_floor_is_the_oldest_torch_ci_tests():
    """pyproject's torch floor is the torch that .ci/run's matrix installs as its oldest, so the
    promise is a tested one (issue 35: the GPU machine's torch 2.11)."""
    ci = (ROOT / ".ci" / "run").read_text()
    oldest = re.search(r"^TORCH_OLDEST=(\S+)$", ci, re.M).group(1)
    torch_spec = next(d for d in _pyproject()["dependencies"] if re.match(r"torch\b", d))
    floor = re.search(r">=\s*([\d.]+)", torch_spec).group(1)
    assert oldest.split(".")[:2] == floor.split(".")[:2], (torch_spec, oldest)
    assert re.search(r"^TORCH_NEWEST=\S+$", ci, re.M)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_runs_lanes_of_one_thread_and_one_process_on_all_threads():
    """Lanes get one OpenMP thread each (two lanes of two would spin-wait on each other's cores);
    TEST_LANES=0, one process, keeps torch's threads (review of issue 47)."""
    def command(*args):       # inside `make test` itself, make prints its directory: take pytest's line
        done = subprocess.run(["make", "-n", "--no-print-directory", "test", *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        return next(line for line in done.stdout.splitlines() if " -m pytest " in line)
    assert command("TEST_LANES=2").startswith("OMP_NUM_THREADS=1 ") and "-n 2 --dist loadfile" in command("TEST_LANES=2")
    alone = command("TEST_LANES=0")
    assert "OMP_NUM_THREADS" not in alone and "-n 0" in alone
