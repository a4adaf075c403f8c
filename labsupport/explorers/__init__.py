"""Live explorers: ipywidgets controls over plotly figures, one per notebook.

Each explorer is a thin layer over pure figure functions (data -> plotly figure)
and the package's measurements; `base.Explorer` holds the wiring they share.
"""

from .base import Explorer, LiveFigure

__all__ = ["Explorer", "LiveFigure"]
