"""The wiring every explorer shares: controls, live figures, a status line.

Introduced in notebook 00 (where the time goes).

An explorer is a dict of ipywidgets controls and a `render(values) -> list of
plotly figures` function. When a control is released (sliders use
``continuous_update=False``) or the Run button is pressed, `render` runs again
and the figures are redrawn in place. Heavy work therefore happens only on a
released control, with a status line that says what is running.

Figures are shown as plotly ``FigureWidget`` where the front end can render it
(JupyterLab, Notebook 7, VS Code). Colab's widget manager cannot, so there each
figure is a static plotly figure redrawn inside an ``Output`` widget; the
explorer detects this, the learner configures nothing.

Tests drive an explorer without a browser: set ``explorer.controls[name].value``
(or call `refresh`) and read ``explorer.figures[i].figure``.
"""

from __future__ import annotations

import sys
from typing import Callable

import ipywidgets as widgets
import plotly.graph_objects as go

from ..errors import LabError


def figure_widgets_render() -> bool:
    """False where plotly's FigureWidget is known not to render (Colab).
    Notebook 00 (where the time goes); shared by the explorers of notebooks 00-07."""
    return "google.colab" not in sys.modules


class LiveFigure:
    """A plotly figure that can be redrawn in place, as a FigureWidget or in an Output.
    Notebook 00 (where the time goes); shared by the explorers of notebooks 00-07."""

    def __init__(self, figure: go.Figure, use_widget: bool | None = None):
        self.use_widget = figure_widgets_render() if use_widget is None else use_widget
        if self.use_widget:
            self._widget = go.FigureWidget(figure)
        else:
            self._figure = go.Figure(figure)
            self._widget = widgets.Output()
            self._redraw_output()

    @property
    def figure(self):
        """The figure as it is now (a FigureWidget or a Figure)."""
        return self._widget if self.use_widget else self._figure

    @property
    def widget(self) -> widgets.Widget:
        return self._widget

    def update(self, new: go.Figure) -> None:
        """Replace the data and layout with those of `new`, in one redraw."""
        if not self.use_widget:
            self._figure = go.Figure(new)
            self._redraw_output()
            return
        fig = self._widget
        with fig.batch_update():
            if len(fig.data) == len(new.data) and all(
                    a.type == b.type for a, b in zip(fig.data, new.data)):
                for old_trace, new_trace in zip(fig.data, new.data):
                    old_trace.update(new_trace.to_plotly_json(), overwrite=True)
            else:
                fig.data = []
                fig.add_traces(list(new.data))
            fig.layout = new.layout

    def _redraw_output(self) -> None:
        self._widget.clear_output(wait=True)
        with self._widget:
            self._figure.show()


class Explorer:
    """Controls + live figures + a status line; `render(values)` draws the figures.
    Notebook 00 (where the time goes); shared by the explorers of notebooks 00-07."""

    def __init__(self, controls: dict[str, widgets.ValueWidget],
                 render: Callable[[dict], list[go.Figure]], title: str = "",
                 run_button: bool = False, use_widget: bool | None = None):
        self.controls = controls
        self.render = render
        self.title = title
        self.status = widgets.HTML()
        self.figures = [LiveFigure(f, use_widget) for f in self._render_safely(self.values()) or []]
        self.button = widgets.Button(description="Run", button_style="primary") if run_button else None
        if self.button is not None:
            self.button.on_click(lambda _: self.refresh())
        else:
            for control in controls.values():
                control.observe(lambda change: self.refresh(), names="value")

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _render_safely(self, values: dict):
        """render(values), with a learner's mistake or an out-of-memory shown as one sentence."""
        import torch

        self.status.value = "<i>measuring...</i>"
        try:
            figures = self.render(values)
        except LabError as error:
            self.status.value = f"<b>Cannot do that:</b> {error}"
            return None
        except torch.OutOfMemoryError:
            self.status.value = ("<b>Out of memory:</b> this setting does not fit on the device; "
                                 "choose a smaller batch or sequence length.")
            return None
        self.status.value = ""
        return figures

    def refresh(self) -> None:
        """Render again with the controls' current values and redraw the figures."""
        figures = self._render_safely(self.values())
        if figures is not None:
            for live, new in zip(self.figures, figures):
                live.update(new)

    @property
    def widget(self) -> widgets.Widget:
        controls = list(self.controls.values()) + ([self.button] if self.button else [])
        header = [widgets.HTML(f"<b>{self.title}</b>")] if self.title else []
        return widgets.VBox(header + [widgets.HBox(controls, layout=widgets.Layout(flex_flow="row wrap")),
                                      self.status] + [f.widget for f in self.figures])

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)
