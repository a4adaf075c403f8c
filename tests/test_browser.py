"""The course in a real browser: JupyterLab + headless Chromium.

Starts JupyterLab on localhost, opens a copy of notebook 00 (the cheapest with an
explorer: about 1.5 minutes on a 2-core CPU), runs it top to bottom with Run All,
then moves the explorer's controls with real mouse and keyboard events and checks
that the plots on the page changed and that no cell or widget shows an error.

Needs Chromium (Debian: ``apt-get install chromium``) and ``pip install playwright``
(.ci/run installs both); skipped with the reason where either is missing. Marked
``browser`` (``pytest -m "not browser"`` leaves it out) and ``slow``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from browser_support import (NOTEBOOKS, Lab, explorer_cell, launch_browser, missing_reason,
                             notebook_problems, open_notebook, plot_snapshot, run_all,
                             wait_kernel_idle, wait_plots_rendered)

NOTEBOOK = "00_where_the_time_goes.ipynb"
RUN_TIMEOUT_S = 600       # Run All; about 90 s on an idle 2-core CPU
CONTROL_TIMEOUT_S = 180   # one explorer update (a few decode steps at one batch size)

# .ci/run sets LABSUPPORT_REQUIRE_BROWSER=1: there a missing browser fails the test instead of skipping it.
REQUIRED = os.environ.get("LABSUPPORT_REQUIRE_BROWSER", "") not in ("", "0")
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(missing_reason() is not None and not REQUIRED,
                                 reason=f"browser test: {missing_reason()}")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if missing_reason() is not None:
        pytest.fail(f"LABSUPPORT_REQUIRE_BROWSER is set but {missing_reason()}")
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOKS / NOTEBOOK, root / NOTEBOOK)  # autosave writes to the copy only
    server = Lab(root)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()   # the server and its kernels, always


@pytest.fixture(scope="module")
def page(lab):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser, page = launch_browser(pw, 1366, 900)
        page.set_default_timeout(60_000)
        page.page_errors = []
        page.on("pageerror", lambda error: page.page_errors.append(str(error)))
        try:
            yield page
        finally:
            browser.close()


def _changed_after(page, cell, action, what: str) -> None:
    before = plot_snapshot(page, cell)
    action()
    # The kernel measures, then sends the new figures; the page redraws them.
    deadline = time.monotonic() + CONTROL_TIMEOUT_S
    after = before
    while time.monotonic() < deadline:
        after = plot_snapshot(page, cell)
        if [p["data"] for p in after] != [p["data"] for p in before]:
            break
        page.wait_for_timeout(500)
    wait_kernel_idle(page, timeout_s=CONTROL_TIMEOUT_S)
    page.wait_for_timeout(1000)   # every figure of this update drawn
    after = plot_snapshot(page, cell)
    assert len(after) == len(before)
    status = cell.locator(".widget-html").all_inner_texts()
    assert [p["data"] for p in after] != [p["data"] for p in before], f"{what}: no plot's data changed; widget texts {status}"
    assert [p["svg"] for p in after] != [p["svg"] for p in before], f"{what}: no plot was redrawn"


def test_notebook_runs_and_explorer_responds(lab, page):
    start = time.monotonic()
    open_notebook(page, lab, NOTEBOOK)
    seconds = run_all(page, timeout_s=RUN_TIMEOUT_S)
    problems = notebook_problems(page)
    assert not problems, f"after Run All ({seconds:.0f} s):\n" + "\n".join(problems) + "\n" + lab.log()[-2000:]

    cell = explorer_cell(page)
    cell.scroll_into_view_if_needed()
    wait_plots_rendered(page, cell, count=2)
    assert cell.locator(".widget-slider").count() >= 1 and cell.locator(".widget-dropdown select").count() >= 1
    plots = plot_snapshot(page, cell)
    assert len(plots) >= 2 and all(p["width"] > 300 and p["height"] > 200 for p in plots), plots

    # Drag the batch-size slider's handle to the right with the mouse.
    slider = cell.locator(".widget-slider").first
    readout = slider.locator(".widget-readout").inner_text()
    handle = slider.locator(".noUi-handle")

    def drag():
        handle.scroll_into_view_if_needed()
        track = slider.locator(".noUi-target").bounding_box()
        box = handle.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(track["x"] + track["width"] * 0.4, box["y"] + box["height"] / 2, steps=8)
        page.mouse.up()

    _changed_after(page, cell, drag, "moving the batch-size slider")
    assert slider.locator(".widget-readout").inner_text() != readout

    # Pick another precision in the dropdown with the keyboard.
    select = cell.locator(".widget-dropdown select").first
    if select.locator("option").count() > 1:
        value = select.input_value()

        def key():
            down = select.evaluate("s => s.selectedIndex") == 0
            select.click()   # opens the list; the keyboard picks the next entry
            page.wait_for_timeout(300)
            page.keyboard.press("ArrowDown" if down else "ArrowUp")
            page.keyboard.press("Enter")

        _changed_after(page, cell, key, "choosing another precision")
        assert select.input_value() != value

    problems = notebook_problems(page)
    assert not problems, "\n".join(problems)
    widget_errors = [e for e in page.page_errors if any(w in e.lower() for w in ("widget", "plotly", "model"))]
    assert not widget_errors, widget_errors
    print(f"browser test: Run All {seconds:.0f} s, whole test {time.monotonic() - start:.0f} s")
