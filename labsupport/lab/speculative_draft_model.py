"""A real draft model: SmolLM2-135M drafting for a larger SmolLM2, where the hub can be reached.

Introduced in notebook 05 (speculative decoding). The notebook's drafts need nothing beyond the
embedded model (prompt lookup, the int4 self-draft). The classic setting, from Leviathan et al.
and Chen et al., is a small model of the same family drafting for a large one: they share a
tokenizer, and the small one agrees with the large one often enough. SmolLM2 comes in 135M, 360M
and 1.7B, so the embedded 135M can draft for the 360M or the 1.7B, both from the Hugging Face hub.

`draft_model_run` times plain decoding of the target against speculative decoding with the 135M
draft, side by side, and checks that greedy output is the same. Where the hub is out of reach
(CI, Binder, this course's build machine) it says so in one sentence and measures nothing.
"""

from __future__ import annotations

from ..engine.generation import generate
from ..engine.speculative import ModelDraft, speculative_generate
from ..weights.loading import EMBEDDED, HUB_ALIASES, _hub_reachable, load_model
from .measure import require_graphed, time_side_by_side, timed_compile

TARGETS = ("smollm2-360m", "smollm2-1.7b")


def draft_model_run(device, prompt_ids: list[int], new_tokens: int, k: int, target_name: str = "smollm2-360m",
                    repeats: int = 3) -> dict:
    """Plain decoding of `target_name` against speculative decoding with the embedded 135M as its draft,
    timed side by side on `prompt_ids` (greedy, `new_tokens` tokens, `k` drafts per pass).

    Notebook 05 (speculative decoding). Returns {"skipped": a sentence} where the hub cannot be
    reached, else {"target", "draft", "plain_tokens_per_s", "speculative_tokens_per_s", "speedup",
    "acceptance", "tokens_per_pass", "same_tokens", "decode_path"}."""
    if target_name not in TARGETS:
        return {"skipped": f"A draft model is measured for {' or '.join(TARGETS)} only, not {target_name!r}."}
    if not _hub_reachable():
        return {"skipped": f"The Hugging Face hub cannot be reached from here, so {HUB_ALIASES[target_name]} "
                           f"cannot be downloaded; run this cell where the hub is reachable (Colab, a laptop) "
                           f"to see the embedded 135M draft for it."}
    target, _ = load_model(target_name, device=device)
    draft_model, _ = load_model(EMBEDDED, device=device)
    draft, graphed, out = ModelDraft(draft_model), timed_compile(device), {}

    def plain():
        out["plain"] = require_graphed(generate(target, prompt_ids, new_tokens, eos_token_ids=(), compile=graphed),
                                       "plain decoding of the target", device)

    def speculative():
        out["spec"] = require_graphed(speculative_generate(target, draft, prompt_ids, new_tokens, k=k,
                                                           eos_token_ids=(), compile=graphed),
                                      "the 135M draft", device)

    timings = time_side_by_side({"plain": plain, "spec": speculative}, device, warmup=1, repeats=repeats)
    stats = out["spec"].stats
    return {"target": target.config.name, "draft": draft_model.config.name,
            "plain_tokens_per_s": new_tokens / timings["plain"].median,
            "speculative_tokens_per_s": new_tokens / timings["spec"].median,
            "speedup": timings["plain"].median / timings["spec"].median,
            "acceptance": stats.acceptance_rate, "tokens_per_pass": stats.tokens_per_call,
            "same_tokens": out["spec"].tokens == out["plain"].row(0),
            "decode_path": out["plain"].decode_path}
