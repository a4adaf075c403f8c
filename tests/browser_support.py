"""Driving the course in a real browser: JupyterLab on localhost + headless Chromium.

Used by tests/test_browser.py (the `browser` test) and tests/browser_screenshots.py
(docs/screenshots/). Chromium is the system's (Debian: ``apt-get install chromium``,
or set ``LABSUPPORT_CHROMIUM``); Playwright drives it (``pip install playwright``;
Playwright's own browser download is not needed).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# What a widget shows when it failed to render, in JupyterLab and ipywidgets 8.
WIDGET_ERROR_TEXTS = ("Error displaying widget", "Model not found", "Failed to load model class",
                      "Error rendering output item", "Could not create a view", "Cannot do that:",
                      "Out of memory:")


def chromium_path() -> str | None:
    """The system's Chromium (or Chrome), or None."""
    candidates = [os.environ.get("LABSUPPORT_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                  shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def missing_reason() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if chromium_path() is None:
        return "no Chromium found (apt-get install chromium, or set LABSUPPORT_CHROMIUM)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """`jupyter lab` on a free localhost port with a random token, in its own process group.

    Use as a context manager; leaving it always stops the server and its kernels.
    """

    def __init__(self, root_dir: str | Path, startup_timeout: float = 90):
        self.root_dir = Path(root_dir)
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="labsupport-lab-")
        self.log_path = Path(self._tmp.name) / "jupyter.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}&reset"

    def start(self) -> "Lab":
        tmp = Path(self._tmp.name)
        settings = tmp / "settings"
        # No "receive Jupyter news?" toast over the notebook.
        (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
        (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
               "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
               "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}",
                   "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
                   "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False",
                   "--LabApp.news_url=None", "--ServerApp.allow_root=True"]
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(command, cwd=self.root_dir, env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited at start:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {self.startup_timeout:.0f} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server and every kernel it started (its whole process group)."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # kernels left in the group
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if getattr(self, "_log", None):
            self._log.close()

    def cleanup(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()


def launch_browser(playwright, width: int = 1366, height: int = 768):
    """Headless system Chromium and one page of the given viewport."""
    browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                         args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
    page = browser.new_page(viewport={"width": width, "height": height})
    return browser, page


# ---------------------------------------------------------------- in the page

_KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && !w.sessionContext.pendingInput;
}"""

_CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return Array.from(w.content.model.cells).map(c => c.toJSON());
}"""


def open_notebook(page, lab: Lab, name: str, timeout_s: float = 120) -> None:
    """Open notebook `name` (relative to the server's root) and wait for its kernel to be idle."""
    page.goto(lab.notebook_url(name), timeout=timeout_s * 1000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=timeout_s * 1000)
    page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1000, polling=500)


def run_all(page, timeout_s: float = 600) -> float:
    """Run every cell (Run > Run All Cells) and wait until the kernel is idle and no cell is queued.

    Returns the seconds it took.
    """
    start = time.monotonic()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_timeout(1000)
    page.wait_for_function("""() => {
      const w = window.jupyterapp.shell.currentWidget;
      const k = w.sessionContext.session && w.sessionContext.session.kernel;
      if (!k || k.status !== 'idle') return false;
      const prompts = Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-InputPrompt'));
      return !prompts.some(p => p.textContent.includes('*'));
    }""", timeout=timeout_s * 1000, polling=1000)
    return time.monotonic() - start


def cells(page) -> list[dict]:
    """The notebook's cells as nbformat JSON, as the page holds them now."""
    return page.evaluate(_CELLS)


def notebook_problems(page) -> list[str]:
    """Cells that did not run or raised, and widgets that show an error."""
    problems = []
    for i, cell in enumerate(cells(page)):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if not source.strip():
            continue
        if cell.get("execution_count") is None:
            problems.append(f"code cell {i} did not run: {source[:80]!r}")
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                problems.append(f"code cell {i} raised {output['ename']}: {output['evalue']}")
    body = page.inner_text(".jp-NotebookPanel .jp-Notebook")
    problems += [f"the page shows {text!r}" for text in WIDGET_ERROR_TEXTS if text in body]
    return problems


def explorer_cell(page):
    """The cell that shows the notebook's explorer: the last one whose code ends with ``explorer``."""
    index = None
    for i, cell in enumerate(cells(page)):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = source.strip().splitlines()
        if cell["cell_type"] == "code" and lines and lines[-1].strip() == "explorer":
            index = i
    if index is None:
        raise LookupError("no cell ending with `explorer` in this notebook")
    return page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)


def plot_snapshot(page, scope) -> list[dict]:
    """Every plotly plot under `scope`: its trace data (as plotly.js holds it) and its SVG."""
    return scope.evaluate("""(root) => Array.from(root.querySelectorAll('.js-plotly-plot')).map(gd => ({
      data: JSON.stringify((gd.data || []).map(t => ({type: t.type, name: t.name, x: t.x, y: t.y,
                                                       text: t.text, marker: t.marker}))),
      svg: Array.from(gd.querySelectorAll('svg.main-svg')).map(s => s.innerHTML).join(''),
      width: gd.getBoundingClientRect().width, height: gd.getBoundingClientRect().height}))""")


def wait_plots_rendered(page, scope, count: int = 1, timeout_s: float = 60) -> None:
    scope.locator(".js-plotly-plot svg.main-svg").nth(count - 1).wait_for(timeout=timeout_s * 1000)


def wait_kernel_idle(page, timeout_s: float = 300) -> None:
    page.wait_for_timeout(500)
    page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1000, polling=500)


def close_notebook(page) -> None:
    """Save the notebook (its temporary copy) and shut its kernel down."""
    page.evaluate("""async () => {
      const w = window.jupyterapp.shell.currentWidget;
      await w.context.save();
      await w.sessionContext.shutdown();
    }""")
