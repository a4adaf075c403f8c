"""Attention masks: which keys each query may attend to, built in one place.

Introduced in notebook 01 (KV cache); padding joins in notebook 02 (batching), the
paged decode in notebook 06 (continuous batching), the sliding window in notebook 08
(long context).

A mask is True where a query may see a key. `scaled_dot_product_attention` takes
it as a boolean tensor broadcast to (batch, heads, queries, keys), or no tensor at
all when plain causal attention (or none) is exact, which is faster. One rule in
several layouts, "a query sees the keys at or before its own position, never a
padding key, and (with a window W) none more than W - 1 positions back":

* `causal_mask`: T new queries after `start` cached keys, with optional left padding;
* `padded_key_mask`: which slots of a preallocated cache hold real tokens;
* `fixed_decode_mask`: one decode step (or a verify pass of k + 1 tokens, notebook 05)
  over the whole preallocated buffer (fixed shapes for torch.compile and CUDA graphs);
* `chunk_mask`: rows that each add a chunk of queries after their own cached context,
  and `packed_mask`: chunks of different lengths packed into one row (chunked prefill
  and decodes in one pass, notebook 06b).

Every builder that says which keys a query sees takes `window` (keyword, no default:
`model.config.attention_window`, None for every earlier key), so that no path can forget
the sliding window. The window is a mask over the full cache, which still holds every
position (lab/long_context.py measures what it saves and costs).
"""

from __future__ import annotations

import torch


def _in_window(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """key position <= query position, and (with a window) > query position - window.
    Both broadcast against each other; returns their broadcast boolean shape."""
    seen = key_positions <= query_positions
    if window is not None:
        seen = seen & (key_positions > query_positions - window)
    return seen


def causal_mask(T: int, start: int, key_mask: torch.Tensor | None, device, *,
                window: int | None) -> torch.Tensor | str | None:
    """Which keys each of T queries at slots [start, start + T) may see: a boolean
    (B or 1, 1, T, start + T) tensor, or "causal" / None when scaled_dot_product_attention
    can do without one. key_mask: (batch, start + T), False on padding keys, or None.
    window: each query sees at most the last `window` keys (None: all earlier keys).

    Notebook 01 (KV cache); the key mask is notebook 02's (batching), the window notebook 08's.
    """
    windowed = window is not None and window < start + T       # else the window hides nothing
    if key_mask is None and not windowed:
        if T == 1:
            return None                      # one new token sees every cached key
        if start == 0:
            return "causal"                  # a fresh prompt: plain causal attention
    query_pos = torch.arange(start, start + T, device=device)
    key_pos = torch.arange(start + T, device=device)
    mask = _in_window(query_pos[:, None], key_pos[None, :], window if windowed else None)[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        # padding keys are hidden; every query still sees itself, so that a padding
        # query has one key to attend to (else its softmax is 0/0 = NaN, and NaN
        # values would leak into real rows through the cache: 0 x NaN = NaN)
        is_self = key_pos[None, :] == query_pos[:, None]               # (T, S)
        mask = mask & (key_mask[:, None, None, :].bool() | is_self)    # (B, 1, T, S)
    return mask


def padded_key_mask(prompt_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Which of a preallocated cache's `max_len` slots hold real tokens, for a left-padded
    batch: (batch, max_len), False on the prompt's padding. prompt_mask: (batch, T), the
    prompt's attention mask; every slot after the prompt holds a generated token.

    Notebook 02 (batching).
    """
    batch, prompt_length = prompt_mask.shape
    key_mask = torch.ones((batch, max_len), dtype=torch.bool, device=prompt_mask.device)
    key_mask[:, :prompt_length] = prompt_mask                          # padding stays hidden for good
    return key_mask


def fixed_decode_mask(max_len: int, slot: torch.Tensor, key_mask: torch.Tensor | None, *,
                      window: int | None) -> torch.Tensor:
    """One step over a whole preallocated buffer of `max_len` slots: each query written at
    `slot` (T,) sees every slot up to its own (the last `window` of them, with a window);
    slots not written yet, and the later queries of the step, are hidden. Returns
    (1, 1, T, max_len), or (B, 1, T, max_len) with key_mask (B, max_len). A decode step has
    T = 1; speculative decoding's verify pass T = k + 1 (notebook 05).

    Notebook 01 (KV cache): the fixed shapes let torch.compile and CUDA graphs replay the step.
    A left-padded row's slots and positions differ by its padding, so distances (the window)
    are the same in both.
    """
    key_slots = torch.arange(max_len, device=slot.device)
    mask = _in_window(slot[:, None], key_slots[None, :], window)[None, None]   # (1, 1, T, max_len)
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :]                       # (B, 1, T, max_len)
    return mask


def chunk_mask(query_positions: torch.Tensor, *, window: int | None, num_keys: int | None = None) -> torch.Tensor:
    """Rows that each bring T new queries after their own cached context, in one pass:
    query t of row b sits at position query_positions[b, t] and sees every key at or
    before it (the last `window` of them, with a window): its row's cached context, then
    causally within its chunk. Keys past a row's newest query pad it to the longest row and
    stay hidden. query_positions: (B, T). Returns (B, 1, T, S), S = `num_keys`, or the largest
    position + 1 (which reads it from the device: a CUDA graph passes its fixed width instead).

    Notebook 06b (chunked prefill and prefix caching): chunked prefill; its decode graphs pass num_keys.
    """
    if num_keys is None:
        num_keys = int(query_positions.max()) + 1
    key_positions = torch.arange(num_keys, device=query_positions.device)                    # (S,)
    return _in_window(query_positions[:, :, None], key_positions[None, None, :], window)[:, None]  # (B, 1, T, S)


def packed_mask(query_rows: torch.Tensor, query_positions: torch.Tensor, num_rows: int,
                keys_per_row: int, *, window: int | None) -> torch.Tensor:
    """Chunks of different lengths packed into one row of N queries, their keys laid side by
    side (row r's positions 0 .. keys_per_row - 1 at keys r * keys_per_row + ...): a query of
    row query_rows[i] at position query_positions[i] sees the keys of its own row at or before
    its position (the last `window` of them, with a window), and no other row's.
    query_rows, query_positions: (N,). Returns (1, 1, N, num_rows * keys_per_row).

    Notebook 06b (chunked prefill and prefix caching): chunked prefill without padding.
    """
    keys = torch.arange(num_rows * keys_per_row, device=query_rows.device)                   # (K,)
    same_row = (keys // keys_per_row)[None, :] == query_rows[:, None]                        # (N, K)
    seen = _in_window(query_positions[:, None], (keys % keys_per_row)[None, :], window)     # (N, K)
    return (same_row & seen)[None, None]                                                     # (1, 1, N, K)
