"""Checker for notebook 08's tiled attention exercise: FlashAttention's online softmax in plain torch.

Introduced in notebook 08 (long context). The learner's `tiled_attention(q, k, v, tile, causal)`
is compared with `F.scaled_dot_product_attention` (in float64) on shapes chosen so that each
usual slip gives another answer: lengths that are not a multiple of the tile, GQA and MQA, causal
and not, and keys whose scores grow along the sequence, so that the running max changes from
tile to tile and a missing rescale shows. Every call is recorded (`ScoreCount`, a
`long_context_prefill.LargestTensor` that also follows the scores by weak references): a tensor
of all the queries' scores against all the keys, a full T x T mask, a row of scores against every
key, each score computed twice, the scores of earlier tiles kept while later ones are made (a
two-pass softmax), or a call of scaled_dot_product_attention itself is refused, even with the
right numbers; the package's attention code is refused by reach (`TILED_EXERCISE`). A wrong
output is matched against the slips one by one (`_slipped`).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

from ..lab.long_context_prefill import LargestTensor
from . import call_learner, fail, grades_quietly, passed
from .grading import Exercise, graded

EXERCISE = "tiled attention with an online softmax"

# (batch, heads, kv_heads, Tq, Tk, head_dim, tile, causal): odd lengths, GQA (4 on 2), MQA (3 on 1),
# few queries on many keys (Tk unlike every other size, so a row over all keys is seen), causal and not
CASES = [(1, 2, 2, 37, 37, 16, 8, False), (2, 4, 2, 67, 67, 24, 16, True),
         (1, 3, 1, 5, 203, 24, 32, False), (1, 2, 2, 130, 130, 8, 16, True)]

SLIPS = {
    "no-sum-rescale": "the running sum was not rescaled when the max grew: row_sum = row_sum * exp(old_max - "
                      "new_max) + this tile's sum (the output needs the same factor).",
    "no-output-rescale": "the running output was not rescaled when the max grew: out = out * exp(old_max - "
                         "new_max) + weights @ v_tile (the running sum needs the same factor).",
    "inverted-rescale": "the rescale factor is upside down: exp(old_max - new_max), which is at most 1.",
    "no-scale": "the scores are not divided by sqrt(head_dim): q @ k_tile.transpose(-2, -1) / math.sqrt(d).",
    "scale-by-d": "divide the scores by sqrt(head_dim), not by head_dim.",
    "not-normalised": "after the last tile divide the output by the running sum: return out / row_sum.",
    "causal-strict": "the causal mask is off by one: query i sees keys 0..i, itself included (mask key > query, "
                     "not key >= query).",
    "causal-one-ahead": "the causal mask is off by one: query i sees keys 0..i, not i + 1 (mask key > query).",
    "ignores-causal": "with causal=True hide each query's future: scores of keys after the query are -inf.",
    "always-causal": "with causal=False every query sees every key: mask only when causal is True.",
    "gqa-modulo": "query head h reads kv-head h // (heads // kv_heads) (k.repeat_interleave(group, dim=1)), "
                  "not h % kv_heads (k.repeat(1, group, 1, 1)).",
    "drops-last-tile": "the last tile is shorter when Tk is not a multiple of tile: range(0, Tk, tile), and "
                       "k[:, :, start:start + tile] is simply shorter there.",
}


def _inputs(batch, heads, kv_heads, n_q, n_k, d, seed: int) -> tuple[torch.Tensor, ...]:
    """q (B, H, Tq, d), k and v (B, kv_heads, Tk, d); the keys grow along the sequence, so the
    largest score of a row moves to later tiles and every rescale matters."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_q, d, generator=generator)
    growth = torch.linspace(0.5, 2.5, n_k)[:, None]                                  # (Tk, 1)
    k = torch.randn(batch, kv_heads, n_k, d, generator=generator) * growth
    v = torch.randn(batch, kv_heads, n_k, d, generator=generator)
    return q, k, v


def _slipped(q, k, v, tile: int, causal: bool, slip: str = "") -> torch.Tensor:
    """The online softmax in float64 with one named slip (SLIPS) made on purpose."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, n_q, d = q.shape
    group = heads // k.shape[1]
    heads_kv = torch.arange(heads) % k.shape[1] if slip == "gqa-modulo" else torch.arange(heads) // group
    k, v = k[:, heads_kv], v[:, heads_kv]                                            # (B, H, Tk, d)
    scale = {"no-scale": 1.0, "scale-by-d": 1.0 / d}.get(slip, 1.0 / math.sqrt(d))
    masked = (causal and slip != "ignores-causal") or slip == "always-causal"
    ahead = {"causal-strict": -1, "causal-one-ahead": 1}.get(slip, 0)
    row_max = q.new_full((batch, heads, n_q, 1), float("-inf"))                      # (B, H, Tq, 1)
    row_sum, out = q.new_zeros(batch, heads, n_q, 1), q.new_zeros(batch, heads, n_q, d)
    rows = torch.arange(n_q)[:, None]                                                # (Tq, 1)
    n_k = k.shape[2] - k.shape[2] % tile if slip == "drops-last-tile" else k.shape[2]
    for start in range(0, n_k, tile):
        k_tile, v_tile = k[:, :, start:start + tile], v[:, :, start:start + tile]   # (B, H, t, d)
        scores = q @ k_tile.transpose(-2, -1) * scale                                # (B, H, Tq, t)
        if masked:
            columns = torch.arange(start, start + k_tile.shape[2])[None, :]          # (1, t)
            scores = scores.masked_fill(columns > rows + ahead, float("-inf"))
        new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
        safe = new_max.masked_fill(new_max == float("-inf"), 0.0)
        weights = torch.exp(scores - safe)                                           # (B, H, Tq, t)
        rescale = torch.exp(row_max - safe)
        if slip == "inverted-rescale":
            rescale = torch.exp(safe - row_max.masked_fill(row_max == float("-inf"), 0.0))
        row_sum = (row_sum if slip == "no-sum-rescale" else row_sum * rescale) + weights.sum(dim=-1, keepdim=True)
        out = (out if slip == "no-output-rescale" else out * rescale) + weights @ v_tile
        row_max = new_max
    return out if slip == "not-normalised" else out / row_sum


def _method_hint(record: LargestTensor, case, q, k) -> str | None:
    """A hint when the recorded calls show the whole score matrix, a row over all keys, or SDPA."""
    batch, heads, kv_heads, n_q, n_k, d, tile, _ = case
    if any("scaled_dot_product" in name for name in record.calls):
        return ("scaled_dot_product_attention is what this exercise rebuilds: compute each tile's scores "
                "with q @ k_tile.transpose(-2, -1) and combine them with the running max and sum.")
    limit = 2 * max(q.numel(), k.numel() * heads // kv_heads, batch * heads * n_q * tile)
    mask = (f"a {n_q} x {n_k} mask is as large as the score matrix: build each tile's mask from positions, "
            f"torch.arange(start, start + t)[None, :] > torch.arange(Tq)[:, None].")
    for shape, dtype in record.shapes:
        size = math.prod(shape)
        if size > limit and n_q in shape and n_k in shape:
            if dtype == torch.bool or len(shape) == 2:
                return mask
            return (f"a tensor of shape {shape} holds every query's score against every key: take the keys "
                    f"tile by tile (k[:, :, start:start + tile]) and keep only a running max, sum and output.")
        if size > limit:
            return (f"a tensor of shape {shape} is larger than one tile of scores needs: hold (queries x tile) "
                    f"scores at a time.")
    if n_k > tile and n_k not in (batch, heads, kv_heads, n_q, d, tile):
        for shape, dtype in record.shapes:
            if n_k in shape and d not in shape and (len(shape) > 1 or dtype.is_floating_point):
                if len(shape) == 2 and n_q in shape:
                    return mask
                return (f"a tensor of shape {shape} spans all {n_k} keys at once (a softmax over a whole row): "
                        f"walk the keys tile by tile with the online softmax instead.")
    return None


class ScoreCount(LargestTensor):
    """LargestTensor that also follows the learner's scores: a matmul whose left side ends in head_dim
    and whose right side has head_dim rows is q @ k_tile^T, one tile's scores; a tensor of the same shape
    made from scores (scaled, masked, exponentiated, cloned) is scores of that tile too. `scores` adds up
    the scores made (one pass makes each once); `most` is the most score elements alive when a tile's
    scores are made, and `kept` the most of them from tiles two or more before it (weak references:
    a tensor the learner's code lets go of is not counted). Notebook 08 (long context), exercise 1."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim, self.scores, self.tiles, self.most, self.kept = head_dim, 0, 0, 0, 0
        self.live: dict[int, tuple] = {}                          # id -> (weak reference, tile, shape)

    def _follow(self, tensor: torch.Tensor, tile: int) -> None:
        key = id(tensor)

        def gone(ref, key=key):
            if key in self.live and self.live[key][0] is ref:
                del self.live[key]
        self.live[key] = (weakref.ref(tensor, gone), tile, tuple(tensor.shape))

    def _tile_of(self, value) -> int | None:
        entry = self.live.get(id(value)) if isinstance(value, torch.Tensor) else None
        return entry[1] if entry is not None and entry[0]() is value else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs)
        if not isinstance(result, torch.Tensor):
            return result
        name = getattr(func, "__name__", "")
        if name in ("__matmul__", "matmul", "bmm") and len(args) == 2 and all(
                isinstance(a, torch.Tensor) and a.dim() >= 2 for a in args) and \
                args[0].shape[-1] == self.head_dim and args[1].shape[-2] == self.head_dim:
            self.scores += result.numel()
            alive = [(entry[1], math.prod(entry[2])) for entry in list(self.live.values()) if entry[0]() is not None]
            self.most = max(self.most, result.numel() + sum(n for _, n in alive))
            self.kept = max(self.kept, sum(n for tile, n in alive if tile < self.tiles - 1))
            self._follow(result, self.tiles)
            self.tiles += 1
            return result
        values = [*args, *(kwargs or {}).values()]
        values += [v for value in values if isinstance(value, (list, tuple)) for v in value]
        tiles = [t for t in (self._tile_of(v) for v in values) if t is not None]
        if tiles and self._tile_of(result) is None and any(
                tuple(v.shape) == tuple(result.shape) for v in values if self._tile_of(v) is not None):
            self._follow(result, max(tiles))
        return result


def _passes(record: ScoreCount, q, k) -> float:
    """How many times the learner computed each query's score against each key: 1 in one pass."""
    return record.scores / (q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])


TWO_PASS = ("that is a two-pass softmax (the max over every tile first, then the sum and output), which holds "
            "the scores of every tile, as many as the naive attention: fold each tile into the running max, sum "
            "and output as it comes, and keep no tile's scores once the next tile's are made.")


def _check_method(record: ScoreCount, case, q, k, where: str) -> None:
    """CheckFailed when the recorded calls show another method than tiles with an online softmax: the
    whole score matrix, a full mask or a row over all keys, each score computed twice, or the scores
    of earlier tiles kept while later ones are made (a two-pass softmax that stores them)."""
    method = _method_hint(record, case, q, k)
    if method is not None:
        fail(EXERCISE, f"keys taken one tile at a time ({where})", "the whole row of scores at once", method)
    passes = _passes(record, q, k)
    if passes > 1.5:
        fail(EXERCISE, f"one pass over the keys ({where})", f"each score computed {passes:.0f} times",
             "keep a running max and rescale the running sum and output when it grows, so that one walk "
             "over the tiles is enough.")
    batch, heads, _, n_q, _, _, tile, _ = case
    one_tile = batch * heads * n_q * tile
    if record.kept > one_tile:
        fail(EXERCISE, f"one tile of scores at a time ({where})",
             f"the scores of {record.most / one_tile:.0f} tiles alive at once", TWO_PASS)


def _value_hint(out: torch.Tensor, case, q, k, v) -> str:
    """The slip whose output the learner's matches, else the recipe."""
    *_, tile, causal = case
    for slip, hint in SLIPS.items():
        if (slip in ("causal-strict", "causal-one-ahead", "ignores-causal") and not causal) or \
                (slip == "always-causal" and causal):
            continue
        if torch.allclose(out.double(), _slipped(q, k, v, tile, causal, slip), rtol=1e-4, atol=1e-4, equal_nan=True):
            return hint
    if torch.isnan(out).any():
        return ("NaN in the output: a row whose keys are all masked so far has max -inf, and -inf - (-inf) is NaN; "
                "subtract a max of 0 there (new_max.masked_fill(new_max == float('-inf'), 0)).")
    return ("per tile: new_max = max(row_max, scores.amax(-1)); weights = exp(scores - new_max); rescale = "
            "exp(row_max - new_max); row_sum = row_sum * rescale + weights.sum(-1); out = out * rescale + "
            "weights @ v_tile; at the end out / row_sum.")


TILED_EXERCISE = Exercise(
    title=EXERCISE,
    teaches="attention taken one tile of keys at a time with an online softmax (a running max, sum and output)",
    computed_by=("labsupport.engine.models.transformer.Attention", "labsupport.engine.models.masks.causal_mask",
                 "labsupport.engine.models.masks.chunk_mask"))


@grades_quietly
@graded(TILED_EXERCISE)
def check_tiled_attention(tiled_fn) -> None:
    """Check a learner's `tiled_fn(q, k, v, tile, causal=...)` -> (batch, heads, Tq, d): q (batch,
    heads, Tq, d), k and v (batch, kv_heads, Tk, d), keys and values taken one tile of `tile`
    positions at a time with an online softmax; causal: query i sees keys 0..i (Tq == Tk).

    Introduced in notebook 08 (long context). The output must equal
    `F.scaled_dot_product_attention(..., is_causal=causal, enable_gqa=True)` in float64 to 1e-5 on
    four shapes (odd lengths, GQA, MQA, causal and not); the calls are recorded (`ScoreCount`),
    and an answer that builds all the scores at once, a full mask, a row over all keys, computes
    the scores twice or keeps every tile's scores (two-pass softmaxes: the max first, then the sum
    and output), or calls scaled_dot_product_attention or the package's attention
    (`long_context_prefill.tiled_attention`, ...) is refused with the right numbers too.
    """
    for number, case in enumerate(CASES, 1):
        batch, heads, kv_heads, n_q, n_k, d, tile, causal = case
        q, k, v = _inputs(batch, heads, kv_heads, n_q, n_k, d, seed=80 + number)
        where = (f"case {number}: q {tuple(q.shape)}, k and v {tuple(k.shape)}, tile {tile}, "
                 f"causal={causal}")
        with ScoreCount(d) as record:
            out = call_learner(EXERCISE, f"attention of shape {tuple(q.shape)} ({where})",
                               "slice the keys and values of each tile with k[:, :, start:start + tile] (the last "
                               "one may be shorter), and let each query head h read kv-head h // (heads // kv_heads).",
                               tiled_fn, q.clone(), k.clone(), v.clone(), tile, causal)
        if not isinstance(out, torch.Tensor):
            fail(EXERCISE, f"a tensor ({where})", type(out).__name__, "return the output, out / row_sum.")
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                  enable_gqa=True)                    # (B, H, Tq, d)
        if tuple(out.shape) != tuple(expected.shape):
            fail(EXERCISE, f"shape {tuple(expected.shape)} ({where})", f"shape {tuple(out.shape)}",
                 "one output row per query and query head: (batch, heads, Tq, head_dim), as q.")
        _check_method(record, case, q, k, where)
        error = (out.double() - expected).abs().max().item()
        if not error <= 1e-5 + 1e-5 * expected.abs().max().item():
            fail(EXERCISE, f"scaled_dot_product_attention's output to 1e-5 ({where})",
                 f"a difference of {error:.3g}", _value_hint(out, case, q, k, v))
    passed(EXERCISE, f"Equal to scaled_dot_product_attention on {len(CASES)} shapes (odd lengths, GQA, MQA, "
                     f"causal and not), in one pass over the keys, never more than one tile of scores at a time.")
