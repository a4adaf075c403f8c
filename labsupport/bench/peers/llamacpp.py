"""The llama.cpp peer: the engine a CPU user would pick, on the embedded model's own GGUF file.

Introduced in notebook 00 (where the time goes). llama.cpp runs the very file the course's
model comes from (`SmolLM2-135M-Instruct.Q4_1.gguf`: 4-bit weights in blocks of 32), in
C++ with hand-written SIMD kernels that multiply 8-bit activations by 4-bit weights with
integer dot products. It is the bar a PyTorch engine's int4 path is measured against.

It comes through `llama-cpp-python`, an optional extra (``pip install -e ".[peers]"``),
never a core dependency: pip compiles llama.cpp from source for the machine it runs on,
which takes several minutes and a C++ compiler. README.md lists the `CMAKE_ARGS` for each
CPU family. Where it is missing, `llamacpp_unavailable` says why in one sentence and the
bench's row carries that sentence instead of a figure.

The peer feeds llama.cpp the same token ids as labsupport (the GGUF's tokenizer is the one
the course's tokenizer was read from) and picks each next token greedily from its logits,
for exactly the requested number of tokens (end-of-sequence ignored), so the work matches.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ...errors import LabError


def llamacpp_unavailable(gguf: Path | None) -> str | None:
    """Why the llama.cpp peer cannot run here, in one sentence, or None when it can.

    Introduced in notebook 00 (where the time goes)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama-cpp-python is not installed (an optional extra: pip install -e \".[peers]\", "
                "which compiles llama.cpp for this CPU; see the README's CMAKE_ARGS).")
    if gguf is None or not Path(gguf).is_file():
        return "the embedded model's GGUF file was not found (it is fetched with the embedded model)."
    return None


class LlamaCppGreedy:
    """llama.cpp on one GGUF file, greedy, batch 1: `prefill(ids)` then `generate(ids, n)`.

    Introduced in notebook 00 (where the time goes). threads: the CPU threads llama.cpp
    uses for prefill and decode (the bench passes torch's thread count, so both engines
    get the same cores). context: positions its KV cache holds.
    """

    def __init__(self, gguf: Path, threads: int, context: int = 1024):
        reason = llamacpp_unavailable(gguf)
        if reason is not None:
            raise LabError(f"The llama.cpp peer cannot run: {reason}")
        from llama_cpp import Llama

        # Llama(model_path, n_ctx, n_batch, n_threads, n_threads_batch, logits_all=False, verbose):
        # the prompt goes through in batches of n_batch tokens; only the last position's logits
        # are kept unless logits_all.
        self.llm = Llama(model_path=str(gguf), n_ctx=context, n_batch=min(512, context), n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)
        self.context, self.vocab = context, self.llm.n_vocab()

    def _next_token(self) -> int:
        """The greedy token after everything evaluated so far: the argmax of the last position's
        logits, read from llama.cpp's own buffer (`llama_get_logits`; without logits_all,
        llama-cpp-python 0.3 no longer copies them into `Llama.scores`)."""
        import llama_cpp

        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.llm.ctx), shape=(self.vocab,))
        return int(np.argmax(logits))

    def prefill(self, prompt_ids: list[int]) -> int:
        """Forget the last run, read the prompt, return the first new token."""
        self.llm.reset()                      # n_tokens = 0; eval() drops cache entries past it
        self.llm.eval(list(prompt_ids))
        return self._next_token()

    def generate(self, prompt_ids: list[int], new_tokens: int) -> list[int]:
        """Exactly `new_tokens` greedy tokens after the prompt (end-of-sequence ignored)."""
        if len(prompt_ids) + new_tokens > self.context:
            raise LabError(f"The llama.cpp peer holds {self.context} positions; the prompt "
                           f"({len(prompt_ids)}) plus {new_tokens} new tokens does not fit.")
        tokens = [self.prefill(prompt_ids)]
        while len(tokens) < new_tokens:
            self.llm.eval([tokens[-1]])       # one decode step
            tokens.append(self._next_token())
        return tokens


class LlamaCppBatchedGreedy:
    """llama.cpp decoding `rows` sequences at once, greedy: each step is one `llama_decode` of a
    batch holding one token per sequence (sequence id = row), as llama-batched-bench does.

    Introduced in notebook 00 (where the time goes); issue 40's batched int4 decode is timed
    against it. threads: CPU threads, as `LlamaCppGreedy`; context: positions each row holds.
    Drives llama.cpp's C API through llama-cpp-python's bindings: its high-level `Llama` keeps
    one sequence per context.
    """

    def __init__(self, gguf: Path, rows: int, threads: int, context: int = 1024):
        import llama_cpp

        self.single = LlamaCppGreedy(gguf, threads, context=8)    # loads the model (its checks, its sentence)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_seq_max = rows * context, rows      # the cache, split evenly between the rows
        params.n_batch = params.n_ubatch = max(512, rows * context)  # a whole prefill is one batch
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.single.llm.model, params)
        if not self.ctx:
            raise LabError(f"llama.cpp could not make a context for {rows} sequences of {context} positions.")
        self.rows, self.context, self.vocab = rows, context, self.single.vocab
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)

    def close(self) -> None:
        import llama_cpp

        if self.ctx:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()

    def _decode(self, tokens: list[tuple[int, int, int, bool]]) -> list[int]:
        """One llama_decode of (token, position, sequence, wants logits) entries; the greedy
        next token of each entry that wants logits, in order."""
        import llama_cpp

        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (token, position, sequence, logits) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, 1, logits
            batch.seq_id[i][0] = sequence
        if llama_cpp.llama_decode(self.ctx, batch) != 0:
            raise LabError("llama.cpp's llama_decode failed on the batch (its cache may be too small).")
        return [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,))))
                for i, entry in enumerate(tokens) if entry[3]]

    def generate(self, prompt_ids: list[int], new_tokens: int) -> list[list[int]]:
        """Exactly `new_tokens` greedy tokens after the prompt, for each of the `rows` sequences
        (all start from the same prompt; end-of-sequence ignored). The prompts go in one batch."""
        import llama_cpp

        n = len(prompt_ids)
        if n + new_tokens > self.context:
            raise LabError(f"The llama.cpp peer holds {self.context} positions a row; the prompt ({n}) plus "
                           f"{new_tokens} new tokens does not fit.")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        last = self._decode([(t, p, row, p == n - 1) for row in range(self.rows) for p, t in enumerate(prompt_ids)])
        out = [[token] for token in last]
        for step in range(1, new_tokens):
            last = self._decode([(out[row][-1], n + step - 1, row, True) for row in range(self.rows)])
            for row, token in enumerate(last):
                out[row].append(token)
        return out
