"""The checker table of tests/test_checkers.py, one module per notebook: the answers each
checker must accept and the typical mistakes it must refuse."""
