"""Checker cases of notebook 02 (batching): the reference and each typical mistake."""

import torch

from labsupport import batching
from labsupport.checks.batching import check_left_pad, check_padding_waste

from checker_cases.common import accepts, refuses


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
