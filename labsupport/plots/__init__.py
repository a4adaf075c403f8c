"""Figures: pure functions from measured data to plotly figures, one module per notebook.

They never measure anything themselves, so the notebooks, the explorers and the
tests can all draw the same data the same way.
"""
