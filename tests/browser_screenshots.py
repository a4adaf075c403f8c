"""Screenshots of each notebook's explorer in JupyterLab, at a laptop's width.

    .venv/bin/python tests/browser_screenshots.py            # every notebook -> docs/screenshots/NN_explorer.png
    .venv/bin/python tests/browser_screenshots.py 01 03      # some of them

Each notebook is copied to a temporary directory (JupyterLab's autosave never
touches the committed one), run top to bottom in headless Chromium (see
tests/browser_support.py), and its last output, the explorer, is photographed
at a 1366 px wide viewport. Runs the notebooks one after the other: on a 2-core
CPU the six take about ten minutes. Prints each notebook's run time and any
cell or widget error, and every figure of the notebook that has text cut off or drawn over other
text (tests/figure_layout.py); exits 1 if any notebook had one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figure_layout import every_plot_problems  # noqa: E402
from browser_support import (NOTEBOOKS, ROOT, Lab, explorer_cell, launch_browser, missing_reason,  # noqa: E402
                             close_notebook, notebook_problems, open_notebook, run_all, wait_plots_rendered)

WIDTH, HEIGHT = 1366, 768


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook numbers, e.g. 06 or 06b (default: all)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--timeout", type=float, default=900, help="seconds per notebook")
    args = parser.parse_args(argv)
    reason = missing_reason()
    if reason:
        print(f"cannot take screenshots: {reason}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    paths = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")
                   if not args.notebooks or p.name.split("_")[0] in args.notebooks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="labsupport-shots-") as root, Lab(root) as lab, \
            sync_playwright() as pw:
        browser, page = launch_browser(pw, WIDTH, HEIGHT)
        try:
            for path in paths:
                shutil.copy(path, Path(root) / path.name)
                start = time.monotonic()
                open_notebook(page, lab, path.name)
                seconds = run_all(page, timeout_s=args.timeout)
                try:
                    explorer = explorer_cell(page)
                except LookupError:                      # notebook 09 has no explorer: its figures are checked
                    explorer = None
                if explorer is None:
                    page.wait_for_timeout(1500)
                    problems = notebook_problems(page) + [f"layout: {p}" for p in every_plot_problems(page)]
                    print(f"{path.name}: ran in {seconds:.0f} s, no explorer to photograph"
                          + "".join(f"\n    PROBLEM: {p}" for p in problems), flush=True)
                    failed += bool(problems)
                    close_notebook(page)
                    continue
                try:
                    wait_plots_rendered(page, explorer, timeout_s=30)
                except Exception:
                    print(f"{path.name}: no plotly plot rendered in the explorer")
                page.wait_for_timeout(1500)
                problems = notebook_problems(page)
                area = explorer.locator(".jp-OutputArea").last
                area.scroll_into_view_if_needed()
                box = area.bounding_box()
                # Tall enough to hold the whole explorer; the width stays a laptop's.
                page.set_viewport_size({"width": WIDTH, "height": max(HEIGHT, int(box["height"]) + 200)})
                page.wait_for_timeout(1000)
                area.scroll_into_view_if_needed()
                target = out / f"{path.name[:2]}_explorer.png"
                area.screenshot(path=str(target))
                page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
                problems += [f"layout: {p}" for p in every_plot_problems(page)]     # every figure of the notebook
                print(f"{path.name}: ran in {seconds:.0f} s (open + run {time.monotonic() - start:.0f} s) "
                      f"-> {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
                      + "".join(f"\n    PROBLEM: {p}" for p in problems), flush=True)
                failed += bool(problems)
                close_notebook(page)
        finally:
            browser.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
