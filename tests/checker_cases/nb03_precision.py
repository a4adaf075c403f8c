"""Checker cases of notebook 03 (mixed precision): the reference and each typical mistake."""

import torch

from labsupport import precision
from labsupport.checks.precision import check_first_overflow, check_footprint
from labsupport.precision import MIB

from checker_cases.common import accepts, refuses


# --- notebook 03 (mixed precision) --------------------------------------------------------

def square_in_fp16(values):                                # the square computed in fp16 itself
    bad = torch.isinf(values.half() * values.half()).nonzero()
    return int(bad[0, 0]) if len(bad) else None


def _first(mask):
    hits = mask.nonzero()
    return int(hits[0, 0]) if len(hits) else None


NOTEBOOK_03 = [
    accepts(check_footprint, "reference", precision.footprint_mib),
    refuses(check_footprint, "megabytes", "MiB", lambda config, dtype: config.num_parameters * dtype.itemsize / 1e6),
    refuses(check_footprint, "always-4-bytes", "bytes per value",
            lambda config, dtype: config.num_parameters * 4 / MIB),
    refuses(check_footprint, "bytes", "bytes; divide", lambda config, dtype: config.num_parameters * dtype.itemsize),
    refuses(check_footprint, "a-remembered-number", "used 4 bytes per value", lambda config, dtype: 474.7),
    refuses(check_footprint, "parameters", "multiply the parameter count",
            lambda config, dtype: config.num_parameters / MIB),
    refuses(check_footprint, "text", "a number", lambda config, dtype: "big"),
    accepts(check_first_overflow, "reference", precision.first_square_overflow),
    accepts(check_first_overflow, "square-in-fp16", square_in_fp16),
    refuses(check_first_overflow, "value-not-square", "square", lambda v: _first(v.abs() > 65504)),
    refuses(check_first_overflow, "positive-only", "negative", lambda v: _first(v > 256)),
    refuses(check_first_overflow, "index-plus-one", "index itself",
            lambda v: (lambda i: None if i is None else i + 1)(_first(v.abs() > 256))),
    refuses(check_first_overflow, "minus-one", "None rather than -1",
            lambda v: (lambda i: -1 if i is None else i)(_first(v.abs() > 256))),
]
