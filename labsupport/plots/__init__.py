"""Figures: pure functions from measured data to plotly figures, named by each notebook's stem.

They never measure anything themselves, so the notebooks, the explorers and the
tests can all draw the same data the same way. Shared: layout, sections, engines. (`layout` holds
the house style; `sections` draws each benchmark section's plots from its dict in the bench JSON,
the report's figures, `bench.suite.SECTIONS` names them; `engines` draws the course-wide engines
section.)
"""
