"""Checker cases of notebook 00 (where the time goes): the reference and each typical mistake."""

import torch

from labsupport import roofline
from labsupport.checks.roofline import check_decode_step_cost, check_ridge_batch
from labsupport.measure import HardwareProfile
from labsupport.models.config import PRESETS

from checker_cases.common import accepts, refuses


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
