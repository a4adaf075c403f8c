"""Live explorers: ipywidgets controls over plotly figures, one module per notebook stem
(06 and 06b share `serving`; 09 has none).

Each explorer is a thin layer over pure figure functions (data -> plotly figure)
and the package's measurements. Shared: base. (`base.Explorer` holds the wiring they share.)
"""

from .base import Explorer, LiveFigure

__all__ = ["Explorer", "LiveFigure"]
