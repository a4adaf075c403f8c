"""The exercise checkers (labsupport/checks/, one module per notebook): each accepts the
reference solution and refuses each typical mistake with a hint that names it.

One table, `CASES`, in notebook order: for each checker, the answers it must accept and
the mistakes it must refuse, each with a regular expression its message must match (a
word of the hint). One parametrised test runs the table; ids read
`check_int4_pack-accepts-reference`, `check_int4_pack-refuses-swapped-nibbles`. A last
test fails for any `check_*` function of labsupport.checks that the table leaves out.
"""

import importlib
import inspect
import math
import pkgutil
from typing import Callable, NamedTuple

import pytest
import torch

import labsupport.checks
from labsupport import batching, precision, roofline
from labsupport.checks import CheckFailed
from labsupport.checks.batching import check_left_pad, check_padding_waste
from labsupport.checks.kv_cache import check_cache_size, check_cache_update
from labsupport.checks.precision import check_first_overflow, check_footprint
from labsupport.checks.quantize import check_int4_pack, check_int8_absmax
from labsupport.checks.roofline import check_decode_step_cost, check_ridge_batch
from labsupport.checks.serving import (check_blocks_for, check_schedule_step, reference_blocks_for,
                                       reference_schedule_step)
from labsupport.checks.speculative import check_accept_step, check_expected_tokens, reference_accept_step
from labsupport.checks.stack import check_ceiling, check_cumulative, reference_ceiling, reference_cumulative
from labsupport.measure import HardwareProfile
from labsupport.models.config import PRESETS
from labsupport.precision import MIB
from labsupport.quantize import dequantize_int8, pack_int4, quantize_int8_absmax, unpack_int4
from labsupport.speculative import expected_tokens_per_call


class Case(NamedTuple):
    """One call of a checker and what it must say."""
    checker: Callable
    name: str                 # the answer in a few words: "reference", or the mistake it makes
    args: tuple               # what the checker is called with (the learner's functions, or an answer)
    hint: str | None = None   # None: accepted; else a regular expression its CheckFailed message matches


def accepts(checker, name, *args):
    return Case(checker, name, args)


def refuses(checker, name, hint, *args):
    return Case(checker, name, args, hint)


# --- notebook 00 (where the time goes) ----------------------------------------------------

TINY = PRESETS["tiny-llama"]
FAKE_PROFILE = HardwareProfile(device="cpu", name="fake CPU", bandwidth=10e9, flops={"float32": 100e9})


def decode_cost(config, batch, context, bytes_per_value):
    cost = roofline.decode_step_cost(config, batch, context, bytes_per_value)
    return cost.flops, cost.bytes


def no_lm_head(config, batch, context, size):
    flops, nbytes = decode_cost(config, batch, context, size)
    return flops - 2 * config.vocab_size * config.hidden_size * batch, nbytes


def no_cache(config, batch, context, size):
    cost = roofline.decode_step_cost(config, batch, context, size)
    return cost.flops, cost.weight_bytes


def flops_of_one_row(config, batch, context, size):
    flops, nbytes = decode_cost(config, batch, context, size)
    return flops / batch, nbytes


def weights_read_per_row(config, batch, context, size):
    cost = roofline.decode_step_cost(config, batch, context, size)
    return cost.flops, cost.weight_bytes * batch + cost.kv_bytes


RIDGE = FAKE_PROFILE.ridge("float32")
WEIGHT_BYTES_PER_FLOP = roofline.decode_step_cost(TINY, 1, 0).weight_bytes / (2 * roofline.matmul_params(TINY))

NOTEBOOK_00 = [
    accepts(check_decode_step_cost, "reference", decode_cost),
    refuses(check_decode_step_cost, "missing-lm-head", "lm_head", no_lm_head),
    refuses(check_decode_step_cost, "missing-kv-bytes", "KV cache", no_cache),
    refuses(check_decode_step_cost, "flops-of-one-row", "multiply by batch", flops_of_one_row),
    refuses(check_decode_step_cost, "weights-read-per-row", "shared by all rows", weights_read_per_row),
    accepts(check_ridge_batch, "reference", roofline.ridge_batch(FAKE_PROFILE, TINY, torch.float32),
            FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "the-ridge-point", "ridge point", RIDGE, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "multiplied-not-divided", "multiplied where you should divide",
            RIDGE / WEIGHT_BYTES_PER_FLOP, FAKE_PROFILE, TINY, torch.float32),
    refuses(check_ridge_batch, "not-a-number", "a number", "many", FAKE_PROFILE, TINY, torch.float32),
]


# --- notebook 01 (KV cache) ---------------------------------------------------------------

def reference_update(key_buffer, value_buffer, new_keys, new_values, length):
    end = length + new_keys.shape[2]
    key_buffer[:, :, length:end] = new_keys
    value_buffer[:, :, length:end] = new_values
    return key_buffer[:, :, :end], value_buffer[:, :, :end]


def not_in_place(key_buffer, value_buffer, new_keys, new_values, length):
    return (torch.cat([key_buffer[:, :, :length], new_keys], dim=2),
            torch.cat([value_buffer[:, :, :length], new_values], dim=2))


def wrong_position(key_buffer, value_buffer, new_keys, new_values, length):
    end = length + new_keys.shape[2]
    key_buffer[:, :, length + 1:end + 1] = new_keys
    value_buffer[:, :, length + 1:end + 1] = new_values
    return key_buffer[:, :, :end], value_buffer[:, :, :end]


def whole_buffer(key_buffer, value_buffer, new_keys, new_values, length):
    reference_update(key_buffer, value_buffer, new_keys, new_values, length)
    return key_buffer, value_buffer


def swapped(key_buffer, value_buffer, new_keys, new_values, length):
    keys, values = reference_update(key_buffer, value_buffer, new_keys, new_values, length)
    return values, keys


def size_formula(config, length, batch, bytes_per_value):
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * length * batch * bytes_per_value


NOTEBOOK_01 = [
    accepts(check_cache_update, "reference", reference_update),
    refuses(check_cache_update, "not-in-place", "in place", not_in_place),
    refuses(check_cache_update, "one-position-late", "position", wrong_position),
    refuses(check_cache_update, "the-whole-buffer", "shape", whole_buffer),
    refuses(check_cache_update, "values-first", "swapped", swapped),
    refuses(check_cache_update, "no-pair", "pair", lambda *args: None),
    accepts(check_cache_size, "reference", size_formula),
    refuses(check_cache_size, "keys-only", "multiply by 2", lambda c, n, b, by: size_formula(c, n, b, by) // 2),
    refuses(check_cache_size, "query-heads", "num_kv_heads",
            lambda c, n, b, by: size_formula(c, n, b, by) * c.num_heads // c.num_kv_heads),
    refuses(check_cache_size, "one-layer", "num_layers",
            lambda c, n, b, by: size_formula(c, n, b, by) // c.num_layers),
    refuses(check_cache_size, "values-not-bytes", "bytes_per_value", lambda c, n, b, by: size_formula(c, n, b, 1)),
    refuses(check_cache_size, "one-sequence", "multiply by batch", lambda c, n, b, by: size_formula(c, n, 1, by)),
    refuses(check_cache_size, "bits", "not bits", lambda c, n, b, by: 8 * size_formula(c, n, b, by)),
    refuses(check_cache_size, "negative", "positive", lambda c, n, b, by: -1),
]


# --- notebook 02 (batching) ---------------------------------------------------------------

def reference_left_pad(prompts, pad_id):
    batch = batching.left_pad(prompts, pad_id)
    return batch.tokens, batch.attention_mask, batch.positions


def right_pad(prompts, pad_id):
    width = max(map(len, prompts))
    tokens = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    return tokens, mask


def inverted_mask(prompts, pad_id):
    tokens, mask, _ = reference_left_pad(prompts, pad_id)
    return tokens, ~mask


def positions_counting_padding(prompts, pad_id):
    tokens, mask, _ = reference_left_pad(prompts, pad_id)
    return tokens, mask, torch.arange(tokens.shape[1]).expand_as(tokens)


NOTEBOOK_02 = [
    accepts(check_left_pad, "reference", reference_left_pad),
    accepts(check_left_pad, "no-positions", lambda prompts, pad_id: reference_left_pad(prompts, pad_id)[:2]),
    accepts(check_left_pad, "a-padded-batch", lambda prompts, pad_id: batching.left_pad(prompts, pad_id)),
    accepts(check_left_pad, "a-0-1-mask", lambda prompts, pad_id: (reference_left_pad(prompts, pad_id)[0],
                                                                  reference_left_pad(prompts, pad_id)[1].long())),
    refuses(check_left_pad, "right-padding", "padding on the right", right_pad),
    refuses(check_left_pad, "inverted-mask", "mask inverted", inverted_mask),
    refuses(check_left_pad, "positions-counting-padding", "positions count the padding", positions_counting_padding),
    refuses(check_left_pad, "wrong-shape", "shape", lambda prompts, pad_id: (torch.zeros(1, 1), torch.zeros(1, 1))),
    accepts(check_padding_waste, "reference", batching.padding_waste),
    refuses(check_padding_waste, "real-fraction", "fraction of real tokens",
            lambda lengths: sum(lengths) / (len(lengths) * max(lengths))),
    refuses(check_padding_waste, "percentage", "percentage", lambda lengths: 100 * batching.padding_waste(lengths)),
    refuses(check_padding_waste, "over-real-tokens", "not by the real tokens",
            lambda lengths: (len(lengths) * max(lengths) - sum(lengths)) / sum(lengths)),
    refuses(check_padding_waste, "padding-slots-count", "divide by all slots",
            lambda lengths: len(lengths) * max(lengths) - sum(lengths)),
]


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


# --- notebook 04 (quantization) -----------------------------------------------------------

def per_tensor(w):
    scale = w.abs().max() / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def scale_over_128(w):
    scale = w.abs().amax(dim=1) / 128
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def scale_over_255(w):
    scale = w.abs().amax(dim=1) / 255
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def no_round(w):
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]), scale


def swapped_nibbles(q):
    q = q.to(torch.uint8)
    return q[:, 1::2] | (q[:, 0::2] << 4)


NOTEBOOK_04 = [
    accepts(check_int8_absmax, "reference", quantize_int8_absmax, dequantize_int8),
    refuses(check_int8_absmax, "per-tensor-scale", "per row", per_tensor, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-128", "127", scale_over_128, dequantize_int8),
    refuses(check_int8_absmax, "scale-over-255", "signed", scale_over_255, dequantize_int8),
    refuses(check_int8_absmax, "no-rounding", "round", no_round, dequantize_int8),
    refuses(check_int8_absmax, "one-scale-to-dequantize", "round trip",
            quantize_int8_absmax, lambda q, scale: q.float() * scale.mean()),
    accepts(check_int4_pack, "reference", pack_int4, unpack_int4),
    refuses(check_int4_pack, "swapped-nibbles", "swapped", swapped_nibbles, unpack_int4),
    refuses(check_int4_pack, "int32-bytes", "uint8", lambda q: pack_int4(q).to(torch.int32), unpack_int4),
    refuses(check_int4_pack, "halves-not-interleaved", "interleave",
            pack_int4, lambda packed: torch.cat([packed & 0x0F, packed >> 4], dim=1)),
    refuses(check_int4_pack, "unpacked-high-first", "low and high are swapped",
            pack_int4, lambda packed: torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(packed.shape[0], -1)),
    refuses(check_int4_pack, "unpacked-without-reshape", "wrong shape",
            pack_int4, lambda packed: torch.stack([packed & 0x0F, packed >> 4], dim=-1)),
]


# --- notebook 05 (speculative decoding) ---------------------------------------------------

def always_accept(p, q, x, u):
    return True, None


def no_min(p, q, x, u):                        # compares u with p alone
    if u < float(p[x]):
        return True, None
    r = (p - q).clamp_min(0)
    return False, r / r.sum()


def unnormalized(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, (p - q).clamp_min(0)


def resample_target(p, q, x, u):
    if u < min(1.0, float(p[x] / q[x])):
        return True, None
    return False, p


NOTEBOOK_05 = [
    accepts(check_accept_step, "reference", reference_accept_step),
    refuses(check_accept_step, "always-accept", "accepted", always_accept),
    refuses(check_accept_step, "no-min", "min", no_min),
    refuses(check_accept_step, "unnormalized-residual", "sum", unnormalized),
    refuses(check_accept_step, "resample-the-target", "double-counts", resample_target),
    accepts(check_expected_tokens, "reference", expected_tokens_per_call),
    refuses(check_expected_tokens, "sum-to-k-minus-1", "k \\+ 1",
            lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k),
    refuses(check_expected_tokens, "divides-at-alpha-1", "alpha = 1", lambda a, k: (1 - a ** (k + 1)) / (1 - a)),
    refuses(check_expected_tokens, "independent-drafts", "all before it", lambda a, k: a * k + 1),
]


# --- notebook 06 (continuous batching) ----------------------------------------------------

def too_many(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    if policy == "static" and len(leaving) < len(running):
        return [], []
    return leaving, [sid for sid, _ in waiting][:max_slots]          # ignores the ones that stay


def jumps_queue(running, waiting, max_slots, free_blocks, policy):
    leaving, _ = reference_schedule_step(running, waiting, max_slots, free_blocks, policy)
    if policy == "static" and len(leaving) < len(running):
        return [], []
    slots = max_slots - (len(running) - len(leaving) if policy == "continuous" else 0)
    joining = []
    for sid, need in waiting:                                        # skips what does not fit
        if len(joining) < slots and need <= free_blocks:
            joining.append(sid)
            free_blocks -= need
    return leaving, joining


def static_refills(running, waiting, max_slots, free_blocks, policy):
    return reference_schedule_step(running, waiting, max_slots, free_blocks, "continuous")


def no_blocks(running, waiting, max_slots, free_blocks, policy):
    return reference_schedule_step(running, waiting, max_slots, 10**9, policy)


NOTEBOOK_06 = [
    accepts(check_schedule_step, "reference", reference_schedule_step),
    refuses(check_schedule_step, "too-many-join", "only \\d+ slots are free", too_many),
    refuses(check_schedule_step, "jumps-the-queue", "jump the queue", jumps_queue),
    refuses(check_schedule_step, "static-refills", "keeps its slot", static_refills),
    refuses(check_schedule_step, "blocks-ignored", "free blocks", no_blocks),
    refuses(check_schedule_step, "no-pair", "pair", lambda *a: None),
    accepts(check_blocks_for, "reference", reference_blocks_for),
    refuses(check_blocks_for, "ceiling-of-the-total", "round up for each sequence",
            lambda lengths, b: math.ceil(sum(lengths) / b)),
    refuses(check_blocks_for, "rounds-down", "round up, not down", lambda lengths, b: sum(n // b for n in lengths)),
    refuses(check_blocks_for, "one-block-too-many", "ceil", lambda lengths, b: sum(n // b + 1 for n in lengths)),
    refuses(check_blocks_for, "text", "integer", lambda lengths, b: "many"),
]


# --- notebook 07 (putting it together) ----------------------------------------------------

def multiply_in_order(rows):                   # compounds the side branch too
    out, total = {}, 1.0
    for r in rows:
        total *= r["gain"] or 1.0
        out[r["stage"]] = total
    return out


NOTEBOOK_07 = [
    accepts(check_cumulative, "reference", reference_cumulative),
    refuses(check_cumulative, "side-branch-compounded", "builds on B", multiply_in_order),
    refuses(check_cumulative, "a-list", "one entry per stage",
            lambda rows: list(reference_cumulative(rows).values())),
    accepts(check_ceiling, "reference", reference_ceiling),
    refuses(check_ceiling, "one-row", "multiply by the batch size", lambda bw, w, b: bw / w),
    refuses(check_ceiling, "bits", "no factor of 8", lambda bw, w, b: b * bw / (8 * w)),
]

CASES = NOTEBOOK_00 + NOTEBOOK_01 + NOTEBOOK_02 + NOTEBOOK_03 + NOTEBOOK_04 + NOTEBOOK_05 + NOTEBOOK_06 + NOTEBOOK_07


def case_id(case: Case) -> str:
    return f"{case.checker.__name__}-{'accepts' if case.hint is None else 'refuses'}-{case.name}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_checker_accepts_the_reference_and_refuses_each_mistake(case, capsys):
    if case.hint is None:
        case.checker(*case.args)
        assert "Correct" in capsys.readouterr().out
    else:
        with pytest.raises(CheckFailed, match=case.hint):
            case.checker(*case.args)


def test_the_table_ids_are_unique():
    ids = [case_id(case) for case in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def checkers_in_the_package() -> list[Callable]:
    """Every `check_*` function defined in a module of labsupport.checks."""
    found = []
    for info in pkgutil.iter_modules(labsupport.checks.__path__):
        module = importlib.import_module(f"labsupport.checks.{info.name}")
        found += [fn for name, fn in inspect.getmembers(module, inspect.isfunction)
                  if name.startswith("check_") and fn.__module__ == module.__name__]
    return found


def test_every_checker_accepts_a_reference_and_refuses_a_mistake_in_the_table():
    checkers = checkers_in_the_package()
    assert len(checkers) >= 16
    accepted = {case.checker for case in CASES if case.hint is None}
    refused = {case.checker for case in CASES if case.hint is not None}
    missing = [f"{fn.__module__}.{fn.__name__}" for fn in checkers if fn not in accepted or fn not in refused]
    assert not missing, f"add to CASES in tests/test_checkers.py the reference and a mistake of: {missing}"
