"""Checker cases of notebook 08 (long context): the reference and each typical mistake."""

import torch

from labsupport.checks.long_context import check_crossover_context, check_kv_quantization

from checker_cases.common import accepts, refuses


# --- exercise 1 (warm-up): the crossover context -------------------------------------------------

def reference_crossover(weight_bytes, config, batch, bytes_per_value):
    per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim * bytes_per_value
    return weight_bytes / (batch * per_token)


def crossover_without_batch(weight_bytes, config, batch, bytes_per_value):
    return reference_crossover(weight_bytes, config, 1, bytes_per_value)


def crossover_keys_only(weight_bytes, config, batch, bytes_per_value):
    return 2 * reference_crossover(weight_bytes, config, batch, bytes_per_value)


def crossover_query_heads(weight_bytes, config, batch, bytes_per_value):
    per_token = config.num_layers * 2 * config.hidden_size * bytes_per_value
    return weight_bytes / (batch * per_token)


def crossover_one_layer(weight_bytes, config, batch, bytes_per_value):
    return config.num_layers * reference_crossover(weight_bytes, config, batch, bytes_per_value)


def crossover_times_batch(weight_bytes, config, batch, bytes_per_value):
    return reference_crossover(weight_bytes, config, 1, bytes_per_value) * batch


def crossover_as_text(weight_bytes, config, batch, bytes_per_value):
    return f"{reference_crossover(weight_bytes, config, batch, bytes_per_value):.0f}"


# --- exercise 2: int8 quantization per token per head -------------------------------------------

def reference_quantize(x):
    scales = x.abs().amax(dim=-1, keepdim=True) / 127                      # (B, H, T, 1)
    q = torch.round(x / scales.masked_fill(scales == 0, 1)).clamp(-127, 127).to(torch.int8)
    return q, scales


def reference_dequantize(q, scales):
    return q.float() * scales


def bf16_scales(x):                                                          # the package's own storage
    q, scales = reference_quantize(x)
    scales = scales.to(torch.bfloat16)
    q = torch.round(x / scales.float().masked_fill(scales == 0, 1)).clamp(-127, 127).to(torch.int8)
    return q, scales


def one_scale_for_all(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def scale_per_channel(x):
    scales = x.abs().amax(dim=2, keepdim=True) / 127                        # (B, H, 1, D)
    return torch.round(x / scales.masked_fill(scales == 0, 1)).clamp(-127, 127).to(torch.int8), scales


def no_keepdim(x):
    q, scales = reference_quantize(x)
    return q, scales[..., 0]


def divides_by_128(x):
    scales = x.abs().amax(dim=-1, keepdim=True) / 128
    return torch.round(x / scales.masked_fill(scales == 0, 1)).clamp(-127, 127).to(torch.int8), scales


def truncates(x):
    scales = x.abs().amax(dim=-1, keepdim=True) / 127
    return (x / scales.masked_fill(scales == 0, 1)).to(torch.int8), scales


def zero_token_nan(x):
    scales = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scales).clamp(-127, 127), scales                 # 0 / 0 = NaN, and still float


def keeps_float(x):
    q, scales = reference_quantize(x)
    return q.float(), scales


def dequantize_divides(q, scales):
    return q.float() / scales.masked_fill(scales == 0, 1)


def dequantize_stays_int(q, scales):
    return q


REAL_KEYS = torch.randn(1, 3, 7, 64, generator=torch.Generator().manual_seed(1)) * 3


NOTEBOOK_08 = [
    accepts(check_crossover_context, "reference", reference_crossover),
    refuses(check_crossover_context, "without-batch", "its own cache", crossover_without_batch),
    refuses(check_crossover_context, "keys-only", "AND a value", crossover_keys_only),
    refuses(check_crossover_context, "query-heads", "num_kv_heads", crossover_query_heads),
    refuses(check_crossover_context, "one-layer", "num_layers", crossover_one_layer),
    refuses(check_crossover_context, "times-batch", "not multiply", crossover_times_batch),
    refuses(check_crossover_context, "as-text", "return a number", crossover_as_text),
    accepts(check_kv_quantization, "reference", reference_quantize, reference_dequantize),
    accepts(check_kv_quantization, "bf16-scales", bf16_scales, reference_dequantize),
    accepts(check_kv_quantization, "with-real-keys", reference_quantize, reference_dequantize, REAL_KEYS),
    refuses(check_kv_quantization, "one-scale-for-all", "not one for the whole tensor", one_scale_for_all,
            reference_dequantize),
    refuses(check_kv_quantization, "scale-per-channel", "per channel", scale_per_channel, reference_dequantize),
    refuses(check_kv_quantization, "no-keepdim", "keepdim", no_keepdim, reference_dequantize),
    refuses(check_kv_quantization, "divides-by-128", "not 128", divides_by_128, reference_dequantize),
    refuses(check_kv_quantization, "truncates", "torch.round", truncates, reference_dequantize),
    refuses(check_kv_quantization, "zero-token-nan", "all-zero token", zero_token_nan, reference_dequantize),
    refuses(check_kv_quantization, "keeps-float", "int8", keeps_float, reference_dequantize),
    refuses(check_kv_quantization, "dequantize-divides", "multipl", reference_quantize, dequantize_divides),
    refuses(check_kv_quantization, "dequantize-stays-int", "float", reference_quantize, dequantize_stays_int),
]
