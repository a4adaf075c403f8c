"""Does a plotly figure read cleanly at a laptop's width? Rendered in headless Chromium, measured.

Used by tests/test_figure_layout.py and by tests/browser_screenshots.py (every explorer's
plots, as the notebook drew them). A figure is drawn into a page at a width like JupyterLab's
output area at 1366 px; then every piece of text plotly drew is located (its bounding box on
the page) and two rules are checked:

* nothing is cut: each title, subplot title, annotation, axis title, tick label and the legend
  lies inside the figure's own box;
* nothing sits on anything else: no two of them overlap (tick labels of one axis included, which
  is how labels that run together show), except text drawn inside a bar.

`problems(page, scope)` returns one sentence per breach (empty: the figure reads cleanly).
"""

from __future__ import annotations

# px, in JupyterLab at a 1366 px wide window: an explorer's FigureWidget is drawn 700 wide (its
# default), a figure shown as output fills the output area (about 960).
EXPLORER_WIDTH, OUTPUT_WIDTH = 700, 960

# The text plotly draws, by the SVG classes of plotly.js 2.x/3.x, each with a kind for the report.
_MEASURE = """(scope) => {
  const root = scope || document;
  const out = [];
  const plots = root.matches && root.matches('.js-plotly-plot') ? [root] : root.querySelectorAll('.js-plotly-plot');
  plots.forEach((plot, index) => {
    const box = plot.querySelector('.main-svg').getBoundingClientRect();
    const items = [];
    const add = (kind, el) => {
      const r = el.getBoundingClientRect();
      const text = (el.textContent || '').trim();
      if (r.width > 0 && r.height > 0 && (text || kind === 'legend'))
        items.push({kind, text: text.slice(0, 60), x0: r.left, y0: r.top, x1: r.right, y1: r.bottom});
    };
    plot.querySelectorAll('.infolayer .g-gtitle text.gtitle').forEach(el => add('title', el));
    plot.querySelectorAll('.infolayer .annotation .annotation-text-g').forEach(el => add('annotation', el));
    plot.querySelectorAll('.infolayer [class*="title"] > text[class$="title"]').forEach(el => {
      if (!el.classList.contains('gtitle')) add('axis title ' + el.getAttribute('class'), el);
    });
    plot.querySelectorAll('.infolayer .legend').forEach(el => add('legend', el.querySelector('.bg') || el));
    plot.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach(layer => {
      const first = layer.querySelector('g[class$="tick"]');
      const axis = first ? first.getAttribute('class') : 'tick';
      layer.querySelectorAll('g[class$="tick"] text').forEach(el => add('tick label of ' + axis, el));
    });
    out.push({index, box: {x0: box.left, y0: box.top, x1: box.right, y1: box.bottom}, items});
  });
  return out;
}"""

SLACK = 1.5          # px: antialiasing and rounding
# A text's box holds its line height, more than its glyphs: two boxes that share less than this
# fraction of the smaller one (two axes' "0" meeting at a corner) do not touch on the screen.
SHARED = 0.2


def _overlap(a: dict, b: dict) -> bool:
    w = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
    h = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
    if w <= SLACK or h <= SLACK:
        return False
    smaller = min((a["x1"] - a["x0"]) * (a["y1"] - a["y0"]), (b["x1"] - b["x0"]) * (b["y1"] - b["y0"]))
    return w * h >= SHARED * smaller


def problems(page, scope=None) -> list[str]:
    """One sentence per piece of text cut off or drawn over another, in every plot under `scope`
    (a Playwright element handle; None: the whole page)."""
    found = []
    for plot in page.evaluate(_MEASURE, scope):
        box, items = plot["box"], plot["items"]
        name = f"plot {plot['index']}"
        for item in items:
            if item["x0"] < box["x0"] - SLACK or item["x1"] > box["x1"] + SLACK or \
                    item["y0"] < box["y0"] - SLACK or item["y1"] > box["y1"] + SLACK:
                found.append(f"{name}: the {item['kind']} {item['text']!r} is cut off by the figure's edge")
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                if _overlap(a, b):
                    found.append(f"{name}: the {a['kind']} {a['text']!r} overlaps the {b['kind']} {b['text']!r}")
    return found


def every_plot_problems(page, settle_ms: int = 300) -> list[str]:
    """`problems` of every plot on the page (a notebook in JupyterLab), each scrolled into view
    first so that JupyterLab lays it out; each sentence names the plot's title."""
    found = []
    plots = page.locator(".js-plotly-plot")
    for i in range(plots.count()):
        plot = plots.nth(i)
        plot.scroll_into_view_if_needed()
        page.wait_for_timeout(settle_ms)
        title = plot.locator(".gtitle").first
        name = title.text_content() if title.count() else f"untitled plot {i}"
        found += [f"{name[:60]!r}: " + p.split(": ", 1)[1] for p in problems(page, plot.element_handle())]
    return found


def render(page, figure, width: int = OUTPUT_WIDTH) -> None:
    """Draw `figure` alone in `page`, `width` px wide (plotly.js inline: no network)."""
    html = figure.to_html(include_plotlyjs=True, full_html=True, default_width=f"{width}px",
                          config={"responsive": False})
    page.set_content(html, wait_until="load")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    page.wait_for_timeout(200)
