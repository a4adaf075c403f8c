"""A LabError raised in a notebook cell shows as one sentence and still fails the cell.

Before, `notebook_setup()` printed the sentence from a custom handler, and the cell then
counted as passed: nbval (and so CI) was blind to every one-sentence error. Now the error
renders itself (`LabError._render_traceback_`), so Jupyter shows one line while the kernel
reports a real error to nbval, nbclient and nbgrader.
"""

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

SENTENCE = "Use a batch size of at least 1."


def notebook_that_raises(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import labsupport as ls\nls.notebook_setup()"),
        nbformat.v4.new_code_cell(f"from labsupport.errors import LabError\nraise LabError({SENTENCE!r})"),
        nbformat.v4.new_code_cell("print('a later cell')"),
    ]
    nbformat.write(nb, path)
    return path


def test_the_error_shows_as_one_sentence_and_stops_the_notebook(tmp_path):
    nb = nbformat.read(notebook_that_raises(tmp_path / "raises.ipynb"), as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(CellExecutionError):
        client.execute()
    (error,) = nb.cells[1].outputs
    assert error.output_type == "error" and error.ename == "LabError" and error.evalue == SENTENCE
    assert error.traceback == [f"LabError: {SENTENCE}"]            # one line, no traceback
    assert nb.cells[2].outputs == []                                # execution stopped there


def test_nbval_reports_the_cell_as_failed(tmp_path):
    path = notebook_that_raises(tmp_path / "raises.ipynb")
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", str(path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "1 failed" in done.stdout and SENTENCE in done.stdout
