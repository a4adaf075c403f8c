"""Checkers for notebook 02 (batching). Each compares a learner's answer with `padding.left_pad`, `generate`
and `lab.batching` and raises `CheckFailed` with a hint that names the mistake:

* `check_left_pad`: right padding, an inverted mask, a mask from ``token == pad_id`` (wrong once the pad id
  occurs inside a prompt, as the chat model's end token does), positions that count the padding or start at
  1, negative positions on the padding, code for equal lengths only;
* `check_batched_generation`: every row of a left-padded batch must give the tokens its prompt gives alone
  (rotary and learned positions), in one batch, one pass per step, stopping once every row has finished;
* `check_padding_waste`: the real fraction, a percentage, the wrong denominator, one batch of all.

Introduced in notebook 02 (batching). Each grades by reach (`grading.graded`, its `Exercise`).
"""

from __future__ import annotations

import torch

from ..engine.padding import PaddedBatch, left_pad, padding_waste
from ..engine.generation import decode_step, generate, prefill
from ..engine.kv_cache import StaticKVCache
from . import call_learner, close_enough, fail, grades_quietly, passed
from .grading import Exercise, graded
from .kv_cache import ENGINE, MODEL, CountingModel, tiny_test_model
from ..lab.batching import combined_waste

# (prompts, pad_id): the longest prompt not first; a pad id that also occurs inside prompts
# (a chat prompt ends every turn with the end token that pads it); equal lengths; one prompt
LEFT_PAD_CASES = (
    ([[5, 6], [8, 9, 10, 11], [9]], 0),
    ([[11, 12, 13, 14], [15, 16, 17, 18, 19, 20], [21]], 0),
    ([[1, 9, 2, 1, 7, 2], [1, 4, 2], [2, 8]], 2),
    ([[3, 4], [5, 6]], 0),
    ([[42]], 0),
)
WASTE_CASES = (([3, 1], 2), ([10, 10, 10], 2), ([100, 5, 5, 5, 6], 2), ([7], 4),
               ([64, 8, 48, 16, 32, 4, 2, 1, 40], 4), ([5, 50, 6, 60, 7], 3))


def _as_tensor(value, name: str, exercise: str, expected_shape) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(value)
    except Exception:
        fail(exercise, f"{name} as a tensor or nested list", type(value).__name__,
             f"return {name} as a (batch, T) tensor.")
    if tuple(tensor.shape) != tuple(expected_shape):
        fail(exercise, f"{name} of shape {tuple(expected_shape)} (batch, longest prompt)",
             f"shape {tuple(tensor.shape)}", "one row per prompt, as wide as the longest prompt (not the first).")
    return tensor


def _unpack(answer, exercise: str):
    """(tokens, mask, positions or None) from a PaddedBatch, a tuple of 2 or 3, or a dict."""
    if isinstance(answer, PaddedBatch):
        return answer.tokens, answer.attention_mask, answer.positions
    if isinstance(answer, dict):
        return answer.get("tokens"), answer.get("attention_mask"), answer.get("positions")
    if isinstance(answer, (tuple, list)) and len(answer) in (2, 3):
        return answer[0], answer[1], answer[2] if len(answer) == 3 else None
    fail(exercise, "(tokens, attention_mask) or (tokens, attention_mask, positions)",
         type(answer).__name__, "return the tensors as a tuple.")


def _mask_hint(mask: torch.Tensor, expected: PaddedBatch, pad_id: int) -> str:
    want = expected.attention_mask
    if mask.unique().numel() > 2 or mask.min() < 0 or mask.max() > 1:
        return "the mask holds only True/False (or 1/0), one per token slot."
    mask = mask.bool()
    if torch.equal(mask, ~want):
        return "mask inverted: True (or 1) marks the real tokens, False (0) the padding."
    if torch.equal(mask, expected.tokens != pad_id):
        return (f"the mask comes from each prompt's length, not from token != pad_id: the pad id {pad_id} also "
                "occurs inside a prompt (a chat prompt ends every turn with the end token that pads it).")
    return "True where the row holds a prompt token, False on its padding, same shape as tokens."


def _positions_hint(positions: torch.Tensor, expected: PaddedBatch, pad_id: int) -> str | None:
    """None when the positions are right on the real tokens and valid on the padding, else a hint."""
    real = expected.attention_mask
    if not torch.equal(positions[real], expected.positions[real]):
        width = positions.shape[1]
        if torch.equal(positions, torch.arange(width).expand_as(positions)):
            return ("positions count the padding: each row's first real token is position 0, so subtract the "
                    "row's padding (a cumulative sum of the mask, minus 1, does it).")
        if torch.equal(positions[real], expected.positions[real] + 1):
            return "positions start at 0: the cumulative sum of the mask counts from 1, so subtract 1."
        from_tokens = ((expected.tokens != pad_id).long().cumsum(dim=1) - 1).clamp(min=0)
        if torch.equal(positions[real], from_tokens[real]):
            return (f"count positions from the mask, not from token != pad_id: the pad id {pad_id} also occurs "
                    "inside a prompt.")
        return "positions run 0, 1, 2, ... along each row's real tokens."
    if positions.min() < 0:
        return ("a position id indexes a table (GPT-2 learns one vector per position), so the padding needs "
                "valid ids too: clamp them at 0.")
    return None


LEFT_PAD = Exercise("left padding", "the left-padded tokens, attention mask and positions of a batch of prompts",
                    computed_by=(ENGINE + "padding.left_pad",))


@grades_quietly
@graded(LEFT_PAD)
def check_left_pad(fn, prompts=None, pad_id: int | None = None) -> None:
    """Check `fn(prompts, pad_id) -> (tokens, attention_mask, positions)` against `padding.left_pad`.
    Introduced in notebook 02 (batching). The mask may be bool or 0/1 integers; positions on the padding any
    valid id (>= 0); an answer without positions is refused (a padded row would start at the wrong position).
    `prompts`, `pad_id`: the notebook's own batch (its chat prompts contain the end token that pads them),
    checked after the built-in cases. Graded by reach (`LEFT_PAD`).
    """
    exercise = LEFT_PAD.title
    cases = list(LEFT_PAD_CASES) + ([(prompts, pad_id)] if prompts is not None else [])
    for batch, pad in cases:
        expected = left_pad(batch, pad)
        shape = expected.tokens.shape
        answer = call_learner(exercise, f"a padded batch for prompts {batch}",
                              "prompts differ in length: make every row as wide as the longest prompt, pad_id "
                              "in front.", fn, [list(p) for p in batch], pad)
        tokens, mask, positions = _unpack(answer, exercise)
        tokens = _as_tensor(tokens, "tokens", exercise, shape).long().cpu()
        mask = _as_tensor(mask, "attention_mask", exercise, shape).cpu()
        if not torch.equal(tokens, expected.tokens):
            right = torch.tensor([list(p) + [pad] * (shape[1] - len(p)) for p in batch])
            hint = ("padding on the right: put the pad ids before each prompt, so that every prompt ends in the "
                    "last column, where the next token is appended." if torch.equal(tokens, right) else
                    f"row i is [pad_id] x (longest - len(prompt i)) followed by prompt i, pad_id={pad}.")
            fail(exercise, f"tokens {expected.tokens.tolist()} for prompts {batch}", tokens.tolist(), hint)
        if not torch.equal(mask.bool(), expected.attention_mask) or mask.unique().numel() > 2:
            fail(exercise, f"attention_mask {expected.attention_mask.int().tolist()} for prompts {batch}",
                 mask.int().tolist() if mask.dtype == torch.bool else mask.tolist(), _mask_hint(mask, expected, pad))
        if positions is None:
            fail(exercise, "(tokens, attention_mask, positions): three tensors", "two (no positions)",
                 "return the positions too: 0, 1, 2, ... along each row's real tokens (the mask's cumsum - 1), "
                 "so that a padded row's first real token is position 0, as in its prompt alone.")
        positions = _as_tensor(positions, "positions", exercise, shape).long().cpu()
        hint = _positions_hint(positions, expected, pad)
        if hint is not None:
            fail(exercise, f"positions {expected.positions.tolist()} for prompts {batch}", positions.tolist(), hint)
    passed(exercise, f"{len(cases)} batches padded on the left: tokens, masks and positions right.")


# --- batched greedy generation ---------------------------------------------------------------

GENERATION = "batched greedy generation"
NEW_TOKENS = 8
# (model, end id, prompts): on these seeded models one short, padded row meets the end id early
# while others run on; the longest prompt holds the end id inside it (it pads the others too)
GENERATION_CASES = (
    ("tiny-llama", 141, [[7, 3, 9], [11, 141, 4, 20, 31, 8, 5, 12], [40, 41, 42, 43, 44], [99]]),
    ("tiny-gpt2", 82, [[7, 3, 9], [11, 82, 4, 20, 31, 8, 5, 12], [40, 41, 42, 43, 44], [99]]),
)
# every row finishes (after 3, 2 and 5 tokens): a loop that runs on after the last one shows
EARLY_FINISH_CASE = ("tiny-llama", 207, [[98, 194, 227, 107, 10, 66, 247], [35, 193, 24], [247, 141]])

# The typical slips of a batched loop, each as the switch that makes `slipped_rows` commit it,
# with its hint. A wrong answer is run against each: the one that gives the same rows is named.
SLIPS = {
    "no_mask": "the padding is not hidden: give the prefill key_mask=padded.attention_mask, and every decode "
               "step key_mask[:, :cache.length + 1] of a mask over all cache slots.",
    "mask_from_tokens": "the mask hides a real token: the end id also occurs inside a prompt, so build the mask "
                        "from the prompts' lengths (padding.left_pad), not from token == end_id.",
    "right_padding": "pad on the left: every prompt must end in the last column, where the next token goes.",
    "positions_count_padding": "positions count the padding: GPT-2 adds a learned vector per position, so a "
                               "row's first real token is position 0 (padded.positions), in the prefill and after.",
    "decode_positions_from_cache": "positions in the decode steps: without `positions` the model counts from the "
                                   "cache slot, padding included; move each row on by one from its own last one.",
    "frozen_positions": "positions in the decode steps: move each row's position on by one at every step.",
    "no_decode_mask": "the decode steps must keep the padding hidden too: key_mask[:, :cache.length + 1] of a mask "
                      "over all cache slots.",
}


@torch.inference_mode()
def slipped_rows(model, prompts, new_tokens: int, end_id: int, slip: str | None = None) -> list[list[int]]:
    """Batched greedy rows, each cut after its end id, made with one of the `SLIPS` (None: none). Introduced in
    notebook 02 (batching): `check_batched_generation` replays a wrong answer's prompts with each slip to name it."""
    padded = left_pad(prompts, pad_id=end_id, device=model.device)
    tokens, mask, positions = padded.tokens, padded.attention_mask, padded.positions   # each (batch, T)
    if slip == "right_padding":                                         # each prompt first, then its padding
        tokens, mask = torch.full_like(tokens, end_id), torch.zeros_like(mask)
        for row, prompt in enumerate(prompts):
            tokens[row, :len(prompt)] = torch.tensor(prompt, device=model.device)
            mask[row, :len(prompt)] = True
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    if slip == "mask_from_tokens":
        mask = tokens != end_id
    batch, width = tokens.shape
    cache = StaticKVCache.for_model(model, batch, width + new_tokens)
    key_mask = torch.ones(batch, cache.max_len, dtype=torch.bool, device=model.device)   # (batch, slots)
    key_mask[:, :width] = mask
    logits = prefill(model, tokens, cache, positions=None if slip == "positions_count_padding" else positions,
                     key_mask=None if slip == "no_mask" else key_mask[:, :width])
    positions = positions[:, -1:]                                       # (batch, 1)
    own_positions = slip not in ("positions_count_padding", "decode_positions_from_cache")
    decode_mask = slip not in ("no_mask", "no_decode_mask")
    finished = torch.zeros(batch, dtype=torch.bool, device=model.device)
    steps = []
    for step in range(new_tokens):
        next_tokens = torch.where(finished, end_id, logits.argmax(dim=-1))   # (batch,)
        steps.append(next_tokens)
        finished |= next_tokens == end_id
        if bool(finished.all()) or step == new_tokens - 1:
            break
        positions = positions if slip == "frozen_positions" else positions + 1
        logits = decode_step(model, cache, next_tokens, positions=positions if own_positions else None,
                             key_mask=key_mask[:, :cache.length + 1] if decode_mask else None)
    rows = torch.stack(steps, dim=1).tolist()                           # (batch, steps)
    return [row[:row.index(end_id) + 1] if end_id in row else row for row in rows]


def _row_hint(got: list[int], want: list[int], end_id: int) -> str | None:
    """A hint for the two slips that are about how a row ends, or None."""
    if len(got) > len(want) and got[:len(want)] == want and want[-1] == end_id:
        return "a row ends at its end token: cut it after end_id (trim_after_end)."
    if len(got) < len(want) and want[:len(got)] == got and (not got or got[-1] != end_id):
        return ("stop when every row has finished (or after new_tokens), not when the first one does: a "
                "finished row repeats end_id while the others go on.")
    return None


def _generation_hint(failures: list[dict]) -> str:
    """Name the slip: how the rows end, else the slip whose rows the answer reproduces on every
    failing tiny case, else a hint from the step that went wrong first."""
    for failure in failures:
        hint = _row_hint(failure["got"], failure["want"], failure["end_id"])
        if hint:
            return hint
    cases = [f["case"] for f in failures if f["case"] is not None]
    cases = list({id(c): c for c in cases}.values())                    # each failing case once
    for slip, hint in SLIPS.items():
        if cases and all(slipped_rows(*c["inputs"], slip=slip) == c["rows"] for c in cases):
            return hint
    if any(f["step"] == 0 for f in failures):
        return ("a padded row's first new token differs from its prompt alone: pad on the left and give the "
                "prefill key_mask=padded.attention_mask and positions=padded.positions.")
    return ("the decode steps: keep the padding hidden (key_mask over every cache slot so far, "
            "key_mask[:, :cache.length + 1]), feed each row's new token, and move each row's position on by one.")


def _require_one_batch(calls: list[dict], prompts, new_tokens: int, name: str, rows, end_id: int) -> None:
    """The model must have been called on all the prompts together: one prefill of every row, then one call
    of every row per step, at most `new_tokens` calls, none once every row of `rows`
    has finished. A loop over the prompts one at a time gives the right rows, and is the handbook chapter's
    1.0x mistake: refused."""
    batch = len(prompts)
    if not calls:
        fail(GENERATION, f"the model called on the batch of {batch} prompts", "no call of the model",
             "run the prefill and the decode steps through the model (ls.prefill, ls.decode_step).")
    single = [c for c in calls if c["rows"] != batch]
    if single:
        fail(GENERATION, f"every call of the model on all {batch} rows at once (on {name})",
             f"{len(single)} of {len(calls)} calls on {single[0]['rows']} row(s)",
             "one batch: pad the prompts into one (batch, longest) tensor and prefill it once, then decode "
             "every row together each step; a loop over the prompts is plain decoding, one row at a time.")
    if (calls[0]["tokens"] != max(len(p) for p in prompts) or len(calls) > new_tokens
            or any(c["tokens"] != 1 for c in calls[1:])):
        fail(GENERATION, f"one prefill of the padded prompts ({max(len(p) for p in prompts)} positions), then one "
                         f"call per new token: at most {new_tokens} calls (on {name})",
             f"{len(calls)} calls, on {[c['tokens'] for c in calls][:6]} positions",
             "prefill the whole padded batch once, then feed only each step's new tokens (batch, 1): "
             "recomputing the sequence every step throws the cache away.")
    if all(row and row[-1] == end_id for row in rows) and len(calls) > max(map(len, rows)):   # one call a step
        fail(GENERATION, f"the loop to stop once every row has finished: {max(map(len, rows))} calls (on {name})",
             f"{len(calls)} calls", "mark a row finished when it picks end_id (finished |= next_tokens == end_id) "
             "and stop when finished.all(): the steps after that only repeat end_id.")


def _run_case(fn, model, name: str, prompts, end_id: int, new_tokens: int, tiny: bool = True) -> list[dict]:
    """The learner's rows against each prompt alone (and the package's batch); the failing rows. A tiny case
    keeps its inputs and rows, for `_generation_hint` to replay the slips on. The model is handed over inside
    a `CountingModel`, so the calls are counted (`_require_one_batch`)."""
    counting = CountingModel(model)
    with torch.inference_mode():
        rows = call_learner(GENERATION, f"token rows for {len(prompts)} prompts on {name}",
                            "pad with padding.left_pad, make the cache with StaticKVCache(model.config, batch, "
                            "prompt length + new_tokens, device=model.device, dtype=model.dtype), then ls.prefill "
                            "and ls.decode_step.", fn, counting, [list(p) for p in prompts], new_tokens, end_id)
    if not isinstance(rows, (list, tuple)) or len(rows) != len(prompts):
        fail(GENERATION, f"a list of {len(prompts)} rows (one list of token ids per prompt)",
             type(rows).__name__, "return one list of new token ids per prompt, in the prompts' order.")
    try:
        rows = [[int(t) for t in row] for row in rows]
    except (TypeError, ValueError):
        fail(GENERATION, "one list of token ids per prompt", repr(rows)[:80],
             "return one list of new token ids per prompt, in the prompts' order.")
    _require_one_batch(counting.calls, prompts, new_tokens, name, rows, end_id)
    alone = [generate(model, p, new_tokens, eos_token_ids=[end_id]).row(0) for p in prompts]
    batched = None                                                      # the package's batch: rounding may differ
    case = {"inputs": (model, prompts, new_tokens, end_id), "rows": rows} if tiny else None
    failures = []
    for i, (got, want) in enumerate(zip(rows, alone)):
        if got == want:
            continue
        if batched is None:
            batched = generate(model, prompts, new_tokens, eos_token_ids=[end_id])
        if got == batched.row(i):
            continue
        step = next((t for t, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        failures.append({"model": name, "row": i, "got": got, "want": want, "end_id": end_id, "step": step,
                         "case": case})
    return failures


# the engine's whole loops (its prefill and decode steps, and left_pad, are exercise 1's and notebook 01's)
BATCHED_GREEDY = Exercise(
    GENERATION, "greedy generation for a left-padded batch: the masks, each row's positions and the finished rows, "
                "step by step", computed_by=tuple(ENGINE + path for path in (
                    "generation.generate", "generation.generate_naive", "speculative.speculative_generate",
                    "drafts.ModelDraft.propose", "serving.engine.Engine.run", "serving.engine.Engine.step")),
    receives=(MODEL,), allowed=tuple(f"{MODEL}.{name}" for name in ("forward", "logits", "device", "dtype")))


@grades_quietly
@graded(BATCHED_GREEDY)
def check_batched_generation(fn, model=None, prompts=None, end_id: int | None = None,
                             new_tokens: int = NEW_TOKENS) -> None:
    """Check `fn(model, prompts, new_tokens, end_id) -> rows`: greedy generation for prompts of different
    lengths in one left-padded batch; row i, cut after its first end_id, must equal prompt i alone.

    Introduced in notebook 02 (batching). Runs on two seeded tiny models in float64 (rotary and GPT-2's
    learned positions, where a wrong position shows), prompts holding the end id, a padded row that ends
    early, and a batch whose rows all finish early; then on the notebook's model and prompts if given (a row
    may also match the package's own batch, which float rounding can set apart from the prompt alone).
    The method is graded (`_require_one_batch`), and by reach (`BATCHED_GREEDY`).
    """
    failures = []
    for name, case_end, case_prompts in GENERATION_CASES + (EARLY_FINISH_CASE,):
        failures += _run_case(fn, tiny_test_model(name), name, case_prompts, case_end, NEW_TOKENS)
    if model is not None:
        failures += _run_case(fn, model, model.config.name, prompts, end_id, new_tokens, tiny=False)
    if failures:
        fail(GENERATION, f"row {failures[0]['row']} on {failures[0]['model']} = its prompt alone: "
                         f"{failures[0]['want']}", failures[0]["got"], _generation_hint(failures))
    names = [case[0] for case in GENERATION_CASES] + ([model.config.name] if model is not None else [])
    passed(GENERATION, f"every row equals its prompt alone on {', '.join(names)}.")


# --- padding waste ---------------------------------------------------------------------------

def _groups(lengths: list[int], size: int) -> list[list[int]]:
    return [lengths[i:i + size] for i in range(0, len(lengths), size)]     # in arrival order


def _padding(batches) -> int:
    return sum(len(b) * max(b) - sum(b) for b in batches)


# The typical slips, each as the number it computes: their answers differ from each other on WASTE_CASES.
WASTE_MISTAKES = [
    (lambda ls, g: sum(padding_waste(b) for b in _groups(ls, g)) / len(_groups(ls, g)),
     "the mean of the batches' fractions weighs a small batch like a big one: add up the padding slots of "
     "all batches and divide by all their slots."),
    (lambda ls, g: padding_waste(ls), "each batch is padded to its own longest prompt, not to the longest of all."),
    (lambda ls, g: combined_waste(_groups(sorted(ls), g)), "cut the batches in the order the prompts come, unsorted."),
    (lambda ls, g: 1 - combined_waste(_groups(ls, g)), "that is the fraction of real tokens; the waste is 1 minus it."),
    (lambda ls, g: 100 * combined_waste(_groups(ls, g)), "return a fraction between 0 and 1, not a percentage."),
    (lambda ls, g: float(_padding(_groups(ls, g))), "that is the number of padding slots; divide by all slots."),
    (lambda ls, g: (_padding(_groups(ls, g)) + (-len(ls) % g) * max(_groups(ls, g)[-1])) / (
        sum(g * max(b) for b in _groups(ls, g))),
     "the last batch holds only the prompts that are left: its missing rows are not slots."),
]
PADDING_WASTE = Exercise("padding waste", "the share of padding among the slots of batches cut in arrival order, "
                                          "each padded to its own longest prompt",
                         computed_by=tuple(ENGINE + path for path in ("padding.padding_waste", "padding.PaddedBatch",
                                                                      "padding.PaddedBatch.padding_fraction")))


@grades_quietly
@graded(PADDING_WASTE)
def check_padding_waste(fn) -> None:
    """Check `fn(lengths, group_size) -> the padding share of all slots` when the prompts, in the order they
    come, are cut into batches of `group_size` (the last holds what is left), each padded to its own longest.
    Introduced in notebook 02 (batching), exercise 3. The reference is `batching.combined_waste`; a wrong
    answer is matched against every slip of `WASTE_MISTAKES` on all the cases, to name the one it makes.
    Graded by reach (`PADDING_WASTE`): the engine's padding_waste of one batch is refused too.
    """
    exercise = PADDING_WASTE.title
    answers, first_wrong = [], None
    for lengths, group in WASTE_CASES:
        answer = call_learner(exercise, f"a fraction for lengths {lengths} in batches of {group}",
                              "cut the list into batches of group_size in order; pad each to its own longest.",
                              fn, list(lengths), group)
        try:
            got = float(answer)
        except (TypeError, ValueError):
            fail(exercise, "a number between 0 and 1", repr(answer)[:80], "return a float.")
        answers.append(got)
        expected = combined_waste(_groups(list(lengths), group))
        if not (close_enough(got, expected, 1e-6) or abs(got - expected) < 1e-9) and first_wrong is None:
            first_wrong = (lengths, group, expected, got)
    if first_wrong is None:
        return passed(exercise, f"{len(WASTE_CASES)} arrivals, from no padding to mostly padding.")
    lengths, group, expected, got = first_wrong
    hint = next((hint for formula, hint in WASTE_MISTAKES
                 if all(abs(a - formula(list(ls), g)) <= 1e-6 * max(1.0, abs(a)) for a, (ls, g) in zip(answers, WASTE_CASES))),
                "padding of all batches / slots of all batches, each batch padded to its own longest prompt.")
    fail(exercise, f"{expected:.4f} for lengths {lengths} in batches of {group}", f"{got:.4f}", hint)
