"""Checker cases of notebook 03 (mixed precision): the reference and each typical mistake."""

import torch

import labsupport as ls
from labsupport.lab import precision
from labsupport.checks import precision as precision_checks
from labsupport.checks.precision import check_accumulation, check_first_overflow, check_footprint
from labsupport.engine.models.transformer import Transformer
from labsupport.lab.precision import MIB, block_parameters

from checker_cases.common import accepts, refuses


# --- notebook 03 (mixed precision) --------------------------------------------------------

def blocks(config, norms=True, biases=True):
    """Every block's parameters and the final norm, counted from the fields (the notebook's solution)."""
    h, i = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    attention = h * (q_size + 2 * kv_size) + q_size * h
    if config.family == "llama":
        block, final = attention + 3 * h * i + (2 * h if norms else 0), (h if norms else 0)
    else:
        block = attention + 2 * h * i + (4 * h + i + h if biases else 0) + (4 * h if norms else 0)
        final = 2 * h if norms else 0
    return config.num_layers * block + final


def counted(config, dtype, positions=True, own_head=True, tied_twice=False, rope=False, norms=True, biases=True):
    """The exercise's count from the config's shapes, with each slip switchable."""
    params = blocks(config, norms, biases) + config.vocab_size * config.hidden_size
    if config.family == "gpt2" and positions:
        params += config.max_position * config.hidden_size
    if (not config.tie_embeddings and own_head) or (config.tie_embeddings and tied_twice):
        params += config.vocab_size * config.hidden_size
    if rope and config.family == "llama":
        params += 2 * config.max_position * config.head_dim
    return params * dtype.itemsize / MIB


def footprint_by_default(config, dtype, _mib=precision.footprint_mib):
    return _mib(config, dtype)


def _footprint_in_a_closure():
    mib = precision.footprint_mib
    return lambda config, dtype: mib(config, dtype)


def footprint_through_a_helper(config, dtype):
    return footprint_by_default(config, dtype)


def the_notebooks_old_solution(config, dtype):       # the blocks from the package: part of the count
    parameters = block_parameters(config) + config.vocab_size * config.hidden_size
    if config.family == "gpt2":
        parameters += config.max_position * config.hidden_size
    if not config.tie_embeddings:
        parameters += config.vocab_size * config.hidden_size
    return parameters * dtype.itemsize / 2**20


def counted_from_a_model(config, dtype):              # a model built from the config holds the parameters
    with torch.device("meta"):
        model = Transformer(config)
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize / MIB


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


def first_by_default(values, _first=precision.first_square_overflow):
    return _first(values)


def _first_in_a_closure():
    first = precision.first_square_overflow
    return lambda values: first(values)


def first_through_a_helper(values):
    return first_by_default(values)


def first_fp16_overflow_of_the_values(values):      # the lab's other overflow test, on the squares
    return precision.first_overflow(values.double() ** 2)


OWN_CODE = "expected your own code, got a call of the package's"

NOTEBOOK_03 = [
    refuses(check_footprint, "reference", OWN_CODE, precision.footprint_mib),
    refuses(check_footprint, "the-package-as-a-default-argument", "default argument", footprint_by_default),
    refuses(check_footprint, "the-package-in-a-closure", "closure", _footprint_in_a_closure()),
    refuses(check_footprint, "the-package-through-a-helper", "footprint_through_a_helper", footprint_through_a_helper),
    refuses(check_footprint, "the-configs-parameter-count", "ModelConfig.num_parameters",
            lambda config, dtype: config.num_parameters * dtype.itemsize / MIB),
    refuses(check_footprint, "the-configs-parameters-read", "ModelConfig.params_read_per_step",
            lambda config, dtype: counted(config, dtype) - config.params_read_per_step * 0),
    refuses(check_footprint, "the-block-parameters-of-the-lab", "lab.precision.block_parameters",
            the_notebooks_old_solution),
    refuses(check_footprint, "the-lab-modules-table-count", "lab.precision.table_parameters",
            lambda config, dtype: (blocks(config) + precision.table_parameters(config)) * dtype.itemsize / MIB),
    refuses(check_footprint, "a-model-built-from-the-config", "Transformer", counted_from_a_model),
    refuses(check_footprint, "the-checkers-own-slips", "checks.precision._footprint_slips",
            lambda config, dtype: precision_checks._footprint_slips(config, dtype)[0][0] * 1e6 / MIB),
    accepts(check_footprint, "counted-from-the-shapes", counted),
    refuses(check_footprint, "norms-left-out", "count every norm and bias",
            lambda config, dtype: counted(config, dtype, norms=False)),
    refuses(check_footprint, "gpt2-biases-left-out", "count every norm and bias",
            lambda config, dtype: counted(config, dtype, biases=False)),
    refuses(check_footprint, "a-norms-weights-left-out", r"off by -768 parameters",
            lambda config, dtype: counted(config, dtype) - config.hidden_size * dtype.itemsize / MIB),
    refuses(check_footprint, "megabytes", "MiB", lambda config, dtype: counted(config, dtype) * MIB / 1e6),
    refuses(check_footprint, "always-4-bytes", "bytes per value",
            lambda config, dtype: counted(config, dtype) * 4 / dtype.itemsize),
    refuses(check_footprint, "bytes", "bytes; divide", lambda config, dtype: counted(config, dtype) * MIB),
    refuses(check_footprint, "a-remembered-number", "not a rounded figure", lambda config, dtype: 474.7),
    refuses(check_footprint, "parameters", "multiply the parameter count",
            lambda config, dtype: counted(config, dtype) / dtype.itemsize),
    refuses(check_footprint, "text", "a number", lambda config, dtype: "big"),
    refuses(check_footprint, "gpt2-positions-forgotten", "position table",
            lambda config, dtype: counted(config, dtype, positions=False)),
    refuses(check_footprint, "tied-output-layer-counted-twice", "tied",
            lambda config, dtype: counted(config, dtype, tied_twice=True)),
    refuses(check_footprint, "untied-output-layer-forgotten", "its own output layer",
            lambda config, dtype: counted(config, dtype, own_head=False)),
    refuses(check_footprint, "rope-buffers-counted", "buffers",
            lambda config, dtype: counted(config, dtype, rope=True)),
    refuses(check_first_overflow, "reference", OWN_CODE, precision.first_square_overflow),
    refuses(check_first_overflow, "the-package-as-a-default-argument", "default argument", first_by_default),
    refuses(check_first_overflow, "the-package-in-a-closure", "closure", _first_in_a_closure()),
    refuses(check_first_overflow, "the-package-through-a-helper", "first_through_a_helper", first_through_a_helper),
    refuses(check_first_overflow, "the-lab-modules-other-overflow-test", "lab.precision.first_overflow",
            first_fp16_overflow_of_the_values),
    refuses(check_first_overflow, "the-lab-modules-squares", "lab.precision.squares_by_dtype",
            lambda v: _first(torch.isinf(torch.tensor(precision.squares_by_dtype(v)["float16"])))),
    refuses(check_first_overflow, "the-checkers-own-cases", "checks.precision._first_index",
            lambda v: precision_checks._first_index(v.double() ** 2 > 65504)),
    accepts(check_first_overflow, "counted", lambda v: _first(v.double() ** 2 > torch.finfo(torch.float16).max)),
    accepts(check_first_overflow, "square-in-fp16", square_in_fp16),
    refuses(check_first_overflow, "threshold-256", "not \\|x\\| with 256", lambda v: _first(v.abs() > 256)),
    refuses(check_first_overflow, "threshold-256-or-more", "not \\|x\\| with 256", lambda v: _first(v.abs() >= 256)),
    refuses(check_first_overflow, "square-at-least-65504", "None|first|square",
            lambda v: _first(v.double() ** 2 >= 65504)),
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
    refuses(check_accumulation, "the-packages-own-function", OWN_CODE, precision.matmul_accumulate),
    refuses(check_accumulation, "the-packages-own-answer", OWN_CODE,
            lambda a, b, dtype: precision.matmul_accumulate(a, b, dtype)),
    refuses(check_accumulation, "the-package-as-a-default-argument", "default argument",
            lambda a, b, dtype, _matmul=precision.matmul_accumulate: _matmul(a, b, dtype)),
    refuses(check_accumulation, "the-checkers-own-cases", "checks.precision._accumulation_cases",
            lambda a, b, dtype: reference_accumulate(a, b, dtype) + 0 * len(precision_checks._accumulation_cases())),
    refuses(check_accumulation, "through-ls", "lab.precision.matmul_accumulate",
            lambda a, b, dtype: ls.lab.precision.matmul_accumulate(a, b, dtype)),
    accepts(check_accumulation, "fused-multiply-add", accumulate_fused_multiply_add),
    refuses(check_accumulation, "fp32-running-sum-always", "float32", accumulate_fp32_always),
    refuses(check_accumulation, "plain-matmul", "a @ b", accumulate_plain_matmul),
    refuses(check_accumulation, "fp32-result-not-rounded-back", "a.dtype", accumulate_fp32_result),
    refuses(check_accumulation, "16-bit-products", "each product was rounded", accumulate_rounded_products),
    refuses(check_accumulation, "rows-of-a", r"a\[:, k, None\]", accumulate_rows_of_a),
]
