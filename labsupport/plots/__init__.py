"""Figures: pure functions from measured data to plotly figures, one module per notebook.

They never measure anything themselves, so the notebooks, the explorers and the
tests can all draw the same data the same way. `sections` draws each benchmark section's
plots from its dict in the bench JSON (the report's figures; `bench.suite.SECTIONS` names them).
"""
