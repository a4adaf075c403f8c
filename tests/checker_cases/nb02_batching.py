"""Checker cases of notebook 02 (batching): the reference and each typical mistake."""

import torch

import labsupport as ls
from labsupport.lab import batching
from labsupport.engine import padding
from labsupport.checks import batching as batching_checks
from labsupport.checks.batching import check_batched_generation, check_left_pad, check_padding_waste
from labsupport.engine.generation import prefill
from labsupport.engine.kv_cache import StaticKVCache

from checker_cases.common import accepts, refuses


def padding_waste_in_batches(lengths, group_size):
    # the notebook's solution: all padding slots over all slots, each batch padded to its own longest
    batches = [lengths[i:i + group_size] for i in range(0, len(lengths), group_size)]
    slots = sum(len(b) * max(b) for b in batches)
    return (slots - sum(lengths)) / slots


# --- notebook 02 (batching): left padding (exercise 1) --------------------------------------

def reference_left_pad(prompts, pad_id):
    # the notebook's solution, by hand (the checker refuses a call of padding.left_pad)
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, longest - len(prompt):] = torch.tensor(prompt)
        mask[row, longest - len(prompt):] = True
    return tokens, mask, (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def a_padded_batch(prompts, pad_id):
    tokens, mask, positions = reference_left_pad(prompts, pad_id)
    return padding.PaddedBatch(tokens, mask, positions, [len(p) for p in prompts])


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


def mask_from_pad_id(prompts, pad_id):
    tokens, _, positions = reference_left_pad(prompts, pad_id)
    return tokens, tokens != pad_id, positions


def positions_from_pad_id(prompts, pad_id):
    tokens, mask, _ = reference_left_pad(prompts, pad_id)
    return tokens, mask, ((tokens != pad_id).long().cumsum(dim=1) - 1).clamp(min=0)


def positions_from_1(prompts, pad_id):
    tokens, mask, _ = reference_left_pad(prompts, pad_id)
    return tokens, mask, mask.long().cumsum(dim=1)


def negative_padding_positions(prompts, pad_id):
    tokens, mask, _ = reference_left_pad(prompts, pad_id)
    return tokens, mask, mask.long().cumsum(dim=1) - 1


# Ways of holding the package's left padding, each refused (grading by reach: labsupport/checks/grading.py).

def left_pad_by_default(prompts, pad_id, _pad=padding.left_pad):          # the hole the instructor's trial found
    return _pad(prompts, pad_id)


def _left_pad_in_a_closure():
    pad = padding.left_pad
    return lambda prompts, pad_id: pad(prompts, pad_id)


def left_pad_through_a_helper(prompts, pad_id):
    return left_pad_by_default(prompts, pad_id)


def left_pad_by_a_built_name(prompts, pad_id):                         # what no walk sees: refused while it runs
    return getattr(padding, "left" + "_pad".strip())(prompts, pad_id)


def width_of_the_first_prompt(prompts, pad_id):
    width = len(prompts[0])
    tokens = torch.full((len(prompts), width), pad_id)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt):] = torch.tensor(prompt)
    return tokens, tokens != pad_id


# --- batched greedy generation (exercise 2) --------------------------------------------------

@torch.inference_mode()
def recomputing_loop(model, prompts, new_tokens, end_id):
    """The right rows, one batch, but the whole padded sequence run again at every step (no cache)."""
    padded = padding.left_pad(prompts, pad_id=end_id, device=model.device)
    tokens, mask, positions = padded.tokens, padded.attention_mask, padded.positions     # (batch, T)
    rows = [[] for _ in prompts]
    finished = [False] * len(prompts)
    for _ in range(new_tokens):
        cache = StaticKVCache.for_model(model, len(prompts), tokens.shape[1])
        logits = prefill(model, tokens, cache, positions=positions, key_mask=mask)
        next_tokens = logits.argmax(dim=-1)
        for i, t in enumerate(next_tokens.tolist()):
            if not finished[i]:
                rows[i].append(t)
                finished[i] = t == end_id
        if all(finished):
            break
        next_tokens = torch.where(torch.tensor(finished, device=model.device), end_id, next_tokens)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
    return rows


def trim_after_end(row, end_id):
    return row[: row.index(end_id) + 1] if end_id in row else row


def generate_02(model, prompts, new_tokens, end_id):
    result = ls.generate(model, prompts, new_tokens, eos_token_ids=(end_id,))
    return [trim_after_end(row, end_id) for row in result.tokens.tolist()]


def generate_by_default(model, prompts, new_tokens, end_id, _generate=ls.generate):
    result = _generate(model, prompts, new_tokens, eos_token_ids=(end_id,))
    return [trim_after_end(row, end_id) for row in result.tokens.tolist()]


def _generate_in_a_closure():
    run = ls.generate
    return lambda model, prompts, new_tokens, end_id: [
        trim_after_end(row, end_id) for row in run(model, prompts, new_tokens, eos_token_ids=(end_id,)).tokens.tolist()]


def generate_through_a_helper(model, prompts, new_tokens, end_id):
    return generate_02(model, prompts, new_tokens, end_id)


def batched_loop(model, prompts, new_tokens, end_id, right_padding=False, mask=True, mask_from_tokens=False,
                 prefill_positions=True, decode_positions="own", decode_mask=True, trim=True,
                 stop_at_first=False, run_on=False):
    """The reference solution, with switches that each introduce one typical mistake."""
    padded = padding.left_pad(prompts, pad_id=end_id, device=model.device)
    tokens, attention_mask, positions = padded.tokens, padded.attention_mask, padded.positions
    if right_padding:
        width = tokens.shape[1]
        tokens = torch.tensor([p + [end_id] * (width - len(p)) for p in prompts], device=model.device)
        attention_mask = torch.tensor([[True] * len(p) + [False] * (width - len(p)) for p in prompts])
        positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    if mask_from_tokens:
        attention_mask = tokens != end_id
    batch, prompt_length = tokens.shape
    cache = ls.StaticKVCache(model.config, batch, prompt_length + new_tokens, device=model.device, dtype=model.dtype)
    key_mask = torch.ones(batch, cache.max_len, dtype=torch.bool, device=model.device)
    key_mask[:, :prompt_length] = attention_mask
    logits = ls.prefill(model, tokens, cache, positions=positions if prefill_positions else None,
                        key_mask=key_mask[:, :prompt_length] if mask else None)
    positions = positions[:, -1:]
    finished = torch.zeros(batch, dtype=torch.bool, device=model.device)
    steps = []
    for step in range(new_tokens):
        next_tokens = torch.where(finished, end_id, logits.argmax(dim=-1))
        steps.append(next_tokens)
        finished |= next_tokens == end_id
        if (bool(finished.all()) and not run_on) or (stop_at_first and bool(finished.any())) or step == new_tokens - 1:
            break
        if decode_positions == "own":
            positions = positions + 1
        logits = ls.decode_step(model, cache, next_tokens,
                                positions=None if decode_positions is None else positions,
                                key_mask=key_mask[:, : cache.length + 1] if decode_mask and mask else None)
    rows = torch.stack(steps, dim=1).tolist()
    return [trim_after_end(row, end_id) if trim else row for row in rows]


def waste_by_hand(lengths):
    """One batch's padding share, counted (not the engine's padding_waste, which the checker refuses)."""
    return 1 - sum(lengths) / (len(lengths) * max(lengths))


OWN_CODE = "expected your own code, got a call of the package's"

NOTEBOOK_02 = [
    accepts(check_left_pad, "reference", reference_left_pad),
    refuses(check_left_pad, "no-positions", "return the positions too",
            lambda prompts, pad_id: reference_left_pad(prompts, pad_id)[:2]),
    accepts(check_left_pad, "a-padded-batch", a_padded_batch),
    refuses(check_left_pad, "the-packages-own-answer", OWN_CODE,
            lambda prompts, pad_id: padding.left_pad(prompts, pad_id)),
    refuses(check_left_pad, "the-packages-own-function", OWN_CODE, padding.left_pad),
    refuses(check_left_pad, "the-package-as-a-default-argument", "default argument", left_pad_by_default),
    refuses(check_left_pad, "the-package-in-a-closure", "closure", _left_pad_in_a_closure()),
    refuses(check_left_pad, "the-package-through-a-helper", "left_pad_through_a_helper", left_pad_through_a_helper),
    refuses(check_left_pad, "the-package-by-a-built-name", "padding.left_pad", left_pad_by_a_built_name),
    refuses(check_left_pad, "the-checkers-own-slips", "checks.batching.slipped_rows",
            lambda prompts, pad_id: batching_checks.slipped_rows(None, prompts, 1, pad_id)),
    accepts(check_left_pad, "a-0-1-mask", lambda prompts, pad_id: (reference_left_pad(prompts, pad_id)[0],
                                                                  reference_left_pad(prompts, pad_id)[1].long(),
                                                                  reference_left_pad(prompts, pad_id)[2])),
    accepts(check_left_pad, "with-the-notebooks-own-batch", reference_left_pad, [[1, 2, 7, 2, 9], [1, 2, 4]], 2),
    refuses(check_left_pad, "right-padding", "padding on the right", right_pad),
    refuses(check_left_pad, "inverted-mask", "mask inverted", inverted_mask),
    refuses(check_left_pad, "positions-counting-padding", "positions count the padding", positions_counting_padding),
    refuses(check_left_pad, "wrong-shape", "shape", lambda prompts, pad_id: (torch.zeros(1, 1), torch.zeros(1, 1))),
    refuses(check_left_pad, "mask-from-the-pad-id", "not from token != pad_id", mask_from_pad_id),
    refuses(check_left_pad, "positions-from-the-pad-id", "count positions from the mask", positions_from_pad_id),
    refuses(check_left_pad, "positions-from-1", "subtract 1", positions_from_1),
    refuses(check_left_pad, "negative-positions-on-the-padding", "clamp them at 0", negative_padding_positions),
    refuses(check_left_pad, "equal-lengths-only", "as wide as the longest prompt", width_of_the_first_prompt),
    accepts(check_batched_generation, "reference", batched_loop),
    refuses(check_batched_generation, "no-mask", "padding is not hidden",
            lambda *args: batched_loop(*args, mask=False)),
    refuses(check_batched_generation, "mask-from-the-end-id", "mask hides a real token",
            lambda *args: batched_loop(*args, mask_from_tokens=True)),
    refuses(check_batched_generation, "right-padding", "pad on the left",
            lambda *args: batched_loop(*args, right_padding=True)),
    refuses(check_batched_generation, "positions-count-the-padding", "positions count the padding",
            lambda *args: batched_loop(*args, prefill_positions=False, decode_positions=None)),
    refuses(check_batched_generation, "decode-positions-from-the-cache", "counts from the cache slot",
            lambda *args: batched_loop(*args, decode_positions=None)),
    refuses(check_batched_generation, "positions-stand-still", "move each row's position on by one at every step",
            lambda *args: batched_loop(*args, decode_positions="frozen")),
    refuses(check_batched_generation, "decode-without-the-mask", "decode steps must keep the padding hidden",
            lambda *args: batched_loop(*args, decode_mask=False)),
    refuses(check_batched_generation, "no-trim", "cut it after end_id", lambda *args: batched_loop(*args, trim=False)),
    refuses(check_batched_generation, "stops-at-the-first-finished-row", "every row has finished",
            lambda *args: batched_loop(*args, stop_at_first=True)),
    refuses(check_batched_generation, "a-tensor", "one list of new token ids per prompt",
            lambda *args: torch.zeros(3)),
    accepts(check_padding_waste, "reference", padding_waste_in_batches),
    refuses(check_padding_waste, "via-the-package", OWN_CODE,
            lambda ls, g: batching.combined_waste([ls[i:i + g] for i in range(0, len(ls), g)])),
    refuses(check_padding_waste, "the-engines-waste-of-one-batch", "padding.padding_waste",
            lambda ls, g: sum(padding.padding_waste(ls[i:i + g]) * len(ls[i:i + g]) * max(ls[i:i + g])
                              for i in range(0, len(ls), g)) / sum(len(ls[i:i + g]) * max(ls[i:i + g])
                                                                   for i in range(0, len(ls), g))),
    refuses(check_padding_waste, "a-padded-batchs-fraction", "engine.padding.PaddedBatch",
            lambda ls, g: padding.PaddedBatch(None, None, None, ls).padding_fraction if g >= len(ls) else
            padding_waste_in_batches(ls, g)),
    refuses(check_padding_waste, "the-checkers-own-helpers", "checks.batching._(padding|groups)",
            lambda ls, g: batching_checks._padding(batching_checks._groups(ls, g))
            / sum(len(b) * max(b) for b in batching_checks._groups(ls, g))),
    refuses(check_padding_waste, "mean-of-the-batches-fractions", "mean of the batches' fractions",
            lambda ls, g: sum(waste_by_hand(ls[i:i + g]) for i in range(0, len(ls), g))
            / len(range(0, len(ls), g))),
    refuses(check_padding_waste, "one-batch-of-all", "its own longest", lambda ls, g: waste_by_hand(ls)),
    refuses(check_padding_waste, "sorted-first", "unsorted", lambda ls, g: padding_waste_in_batches(sorted(ls), g)),
    refuses(check_padding_waste, "real-fraction", "fraction of real tokens",
            lambda ls, g: 1 - padding_waste_in_batches(ls, g)),
    refuses(check_padding_waste, "percentage", "percentage", lambda ls, g: 100 * padding_waste_in_batches(ls, g)),
    refuses(check_padding_waste, "last-batch-full", "missing rows are not slots",
            lambda ls, g: padding_waste_in_batches(ls + [0] * (-len(ls) % g), g)),
    refuses(check_padding_waste, "not-a-number", "return a float", lambda ls, g: "a lot"),
    refuses(check_padding_waste, "old-signature", "group_size", lambda lengths: waste_by_hand(lengths)),
    refuses(check_batched_generation, "one-prompt-at-a-time", "a loop over the prompts is plain decoding",
            lambda model, prompts, new_tokens, end_id: [batched_loop(model, [p], new_tokens, end_id)[0]
                                                        for p in prompts]),
    refuses(check_batched_generation, "recomputes-the-sequence-every-step", "throws the cache away",
            lambda model, prompts, new_tokens, end_id: recomputing_loop(model, prompts, new_tokens, end_id)),
    refuses(check_batched_generation, "the-packages-generate", "generation.generate", generate_02),
    refuses(check_batched_generation, "the-packages-generate-as-a-default-argument", "default argument",
            generate_by_default),
    refuses(check_batched_generation, "the-packages-generate-in-a-closure", "closure", _generate_in_a_closure()),
    refuses(check_batched_generation, "the-packages-generate-through-a-helper", "generate_through_a_helper",
            generate_through_a_helper),
    refuses(check_batched_generation, "the-checkers-own-slips", "checks.batching.slipped_rows",
            lambda model, prompts, new_tokens, end_id: batching_checks.slipped_rows(model, prompts, new_tokens, end_id)),
    refuses(check_batched_generation, "runs-on-after-every-row-finished", "stop once every row has finished",
            lambda *args: batched_loop(*args, run_on=True)),
]


# --- mutation testing (scripts/checker_mutants.py) --------------------------------------------------

_CUT_BY_PREFILL = ("ls.prefill cuts the key mask to the prompt's positions itself (generation._mask takes "
                   "key_mask[:, :start + T]), so a mask over more cache slots gives the same mask")
_CUT_BY_DECODE_STEP = ("ls.decode_step cuts the key mask to cache.length + 1 slots itself (generation._mask), so "
                       "a mask over more cache slots gives the same mask")
EQUIVALENT_MUTANTS = {
    "ex2_batched_greedy": {
        "23:40:unary:drop-USub": "logits.argmax(dim=1) for dim=-1: ls.prefill and ls.decode_step return (batch, "
                                 "vocab) logits, and dim 1 of a 2-D tensor is its last",
        "18:45:slice:upper+1": _CUT_BY_PREFILL,
        "18:45:slice:drop-upper": _CUT_BY_PREFILL,
        "31:53:slice:upper+1": _CUT_BY_DECODE_STEP,
        "31:53:slice:drop-upper": _CUT_BY_DECODE_STEP,
        "31:70:constant:1+1": _CUT_BY_DECODE_STEP,
    },
}
