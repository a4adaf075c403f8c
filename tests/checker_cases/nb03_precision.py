"""Checker cases of notebook 03 (mixed precision): the reference and each typical mistake."""

import torch

from labsupport.lab import precision
from labsupport.checks.precision import check_accumulation, check_first_overflow, check_footprint
from labsupport.lab.precision import MIB, block_parameters

from checker_cases.common import accepts, refuses


# --- notebook 03 (mixed precision) --------------------------------------------------------

def counted(config, dtype, positions=True, own_head=True, tied_twice=False, rope=False):
    """The exercise's count from the config's shapes, with each slip switchable."""
    params = block_parameters(config) + config.vocab_size * config.hidden_size
    if config.family == "gpt2" and positions:
        params += config.max_position * config.hidden_size
    if (not config.tie_embeddings and own_head) or (config.tie_embeddings and tied_twice):
        params += config.vocab_size * config.hidden_size
    if rope and config.family == "llama":
        params += 2 * config.max_position * config.head_dim
    return params * dtype.itemsize / MIB


def square_in_fp16(values):                                # the square computed in fp16 itself
    bad = torch.isinf(values.half() * values.half()).nonzero()
    return int(bad[0, 0]) if len(bad) else None


def _first(mask):
    hits = mask.nonzero()
    return int(hits[0, 0]) if len(hits) else None


def _last(mask):
    hits = mask.nonzero()
    return int(hits[-1, 0]) if len(hits) else None


def fp16_limit_of_bf16(values):                            # bf16's largest number instead of fp16's
    return _first(values.double() ** 2 > torch.finfo(torch.bfloat16).max)


def accumulate_fp32_always(a, b, accumulate_dtype):        # torch.zeros is float32: the dtype is ignored
    total = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        total = total + a[:, k, None].float() * b[None, k, :].float()
    return total.to(a.dtype)


def accumulate_plain_matmul(a, b, accumulate_dtype):       # a @ b: PyTorch's kernel accumulates in fp32
    return a @ b


def accumulate_fp32_result(a, b, accumulate_dtype):        # the fp32 sum returned as it is
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype)
    for k in range(a.shape[1]):
        total = total + a[:, k, None].to(accumulate_dtype) * b[None, k, :].to(accumulate_dtype)
    return total


def accumulate_rounded_products(a, b, accumulate_dtype):   # each product rounded to 16 bits first
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype)
    for k in range(a.shape[1]):
        total = total + (a[:, k, None] * b[None, k, :]).to(accumulate_dtype)
    return total.to(a.dtype)


def accumulate_rows_of_a(a, b, accumulate_dtype):          # row k of a instead of column k
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype)
    for k in range(a.shape[1]):
        total = total + a[k, :, None].to(accumulate_dtype) * b[None, k, :].to(accumulate_dtype)
    return total.to(a.dtype)


def accumulate_fused_multiply_add(a, b, accumulate_dtype):  # one rounding per step (an FMA): also right
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype)
    for k in range(a.shape[1]):
        total = (total.float() + a[:, k, None].float() * b[None, k, :].float()).to(accumulate_dtype)
    return total.to(a.dtype)


def reference_accumulate(a, b, accumulate_dtype):          # the notebook's solution
    total = torch.zeros(a.shape[0], b.shape[1], dtype=accumulate_dtype, device=a.device)
    for k in range(a.shape[1]):
        total = total + a[:, k, None].to(accumulate_dtype) * b[None, k, :].to(accumulate_dtype)
    return total.to(a.dtype)


NOTEBOOK_03 = [
    accepts(check_footprint, "reference", precision.footprint_mib),
    accepts(check_footprint, "counted-from-the-shapes", counted),
    refuses(check_footprint, "megabytes", "MiB", lambda config, dtype: config.num_parameters * dtype.itemsize / 1e6),
    refuses(check_footprint, "always-4-bytes", "bytes per value",
            lambda config, dtype: config.num_parameters * 4 / MIB),
    refuses(check_footprint, "bytes", "bytes; divide", lambda config, dtype: config.num_parameters * dtype.itemsize),
    refuses(check_footprint, "a-remembered-number", "used 4 bytes per value", lambda config, dtype: 474.7),
    refuses(check_footprint, "parameters", "multiply the parameter count",
            lambda config, dtype: config.num_parameters / MIB),
    refuses(check_footprint, "text", "a number", lambda config, dtype: "big"),
    refuses(check_footprint, "gpt2-positions-forgotten", "position table",
            lambda config, dtype: counted(config, dtype, positions=False)),
    refuses(check_footprint, "tied-output-layer-counted-twice", "tied",
            lambda config, dtype: counted(config, dtype, tied_twice=True)),
    refuses(check_footprint, "untied-output-layer-forgotten", "its own output layer",
            lambda config, dtype: counted(config, dtype, own_head=False)),
    refuses(check_footprint, "rope-buffers-counted", "buffers",
            lambda config, dtype: counted(config, dtype, rope=True)),
    accepts(check_first_overflow, "reference", precision.first_square_overflow),
    accepts(check_first_overflow, "square-in-fp16", square_in_fp16),
    refuses(check_first_overflow, "value-not-square", "square", lambda v: _first(v.abs() > 65504)),
    refuses(check_first_overflow, "positive-only", "negative", lambda v: _first(v > 256)),
    refuses(check_first_overflow, "index-plus-one", "index itself",
            lambda v: (lambda i: None if i is None else i + 1)(_first(v.abs() > 256))),
    refuses(check_first_overflow, "minus-one", "None rather than -1",
            lambda v: (lambda i: -1 if i is None else i)(_first(v.abs() > 256))),
    refuses(check_first_overflow, "last-not-first", "first one", lambda v: _last(v.abs() > 256)),
    refuses(check_first_overflow, "bf16-limit", "float16", fp16_limit_of_bf16),
    refuses(check_first_overflow, "the-value-not-its-index", "not the value",
            lambda v: (lambda i: None if i is None else float(v[i]))(_first(v.abs() > 256))),
    refuses(check_first_overflow, "every-index", "not a list", lambda v: (v.abs() > 256).nonzero().flatten()),
    accepts(check_accumulation, "reference", reference_accumulate),
    refuses(check_accumulation, "the-packages-own-function", "write the steps yourself", precision.matmul_accumulate),
    refuses(check_accumulation, "the-packages-own-answer", "write the steps yourself",
            lambda a, b, dtype: precision.matmul_accumulate(a, b, dtype)),
    accepts(check_accumulation, "fused-multiply-add", accumulate_fused_multiply_add),
    refuses(check_accumulation, "fp32-running-sum-always", "float32", accumulate_fp32_always),
    refuses(check_accumulation, "plain-matmul", "a @ b", accumulate_plain_matmul),
    refuses(check_accumulation, "fp32-result-not-rounded-back", "a.dtype", accumulate_fp32_result),
    refuses(check_accumulation, "16-bit-products", "each product was rounded", accumulate_rounded_products),
    refuses(check_accumulation, "rows-of-a", r"a\[:, k, None\]", accumulate_rows_of_a),
]
