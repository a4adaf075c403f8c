"""Notebook 05's section: speculative decoding against plain decoding and Hugging Face's
prompt-lookup decoding, on a grounded and a creative task.

Introduced in notebook 05 (speculative decoding); ``python -m labsupport bench --sections speculative``.
"""

from __future__ import annotations

import torch

from ..errors import LabError
from ..generation import chat_prompt, generate
from ..measure import time_side_by_side
from ..speculative import (PromptLookupDraft, QuantizedSelfDraft, SpeculativeResult, expected_speedup,
                           expected_tokens_per_call, speculative_generate)
from .core import BenchContext, reported
from .options import BenchOptions
from .peers import hf_generate_fn

GROUNDED_TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at six. He trimmed the wick, "
    "polished the great lens with a soft cloth, and wrote the weather in a thick logbook: wind from "
    "the north-west, a grey sea, two fishing boats back before dark. In winter the storms kept him "
    "awake, and he counted the seconds between each flash and the thunder. In summer he painted the "
    "railings white and watched the ferries cross the bay. When the light was finally automated, he "
    "kept the logbook going for another year, out of habit, and then gave it to the village library."
)
GROUNDED_PROMPT = "Repeat the following text word for word, without any comment:\n\n" + GROUNDED_TEXT
CREATIVE_PROMPT = "Write a short original poem about a fox who learns to play the violin."


def section_speculative(ctx: BenchContext, options: BenchOptions) -> dict:
    """Speculative decoding on the embedded model, fp32, greedy, batch 1, side by side:
    plain `generate`, prompt lookup and the int4 self-draft (ours), and Hugging Face's
    plain and prompt-lookup generate(); on a grounded task (the answer repeats the
    prompt) and on creative free text, where prompt lookup has little to copy.
    Every speculative run must give the same tokens as plain greedy decoding.

    Introduced in notebook 05 (speculative decoding). Reads new_tokens, repeats and spec_k.
    """
    new_tokens, repeats = options.new_tokens, options.repeats
    k = options.spec_k
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    lookup = PromptLookupDraft(ngram=3)
    self_draft, self_draft_note = None, ""
    try:
        self_draft = QuantizedSelfDraft(model, "int4", group_size=32)
    except LabError as error:
        self_draft_note = f"int4 self-draft skipped: {error}"
    tasks = {"grounded": GROUNDED_PROMPT, "creative": CREATIVE_PROMPT}
    result = {"new_tokens": new_tokens, "k": k, "dtype": "float32", "batch": 1, "tasks": {},
              "hf_assisted_generation": "skipped: the only offline model is the target itself, and a "
                                        "model as its own assistant costs as much as it saves"}
    figures = []
    for task, message in tasks.items():
        ids = tok.encode(chat_prompt(tok, message))
        hf_runs = {"hf": hf_generate_fn(hf, ids, new_tokens),              # prompt lookup: same k as ours
                   "hf lookup": hf_generate_fn(hf, ids, new_tokens, prompt_lookup=k)}
        out: dict = {}

        def plain():
            out["plain"] = generate(model, ids, new_tokens, eos_token_ids=()).row(0)

        def run_draft(name, draft):
            def fn():
                out[name] = speculative_generate(model, draft, ids, new_tokens, k=k, eos_token_ids=())
            return fn

        def run_hf(name):
            def fn():
                out[name] = hf_runs[name]()[0, len(ids):].tolist()
            return fn

        fns = {"plain": plain, "lookup": run_draft("lookup", lookup)}
        if self_draft is not None:
            fns["int4 self-draft"] = run_draft("int4 self-draft", self_draft)
        if task == "grounded":
            fns.update({"hf": run_hf("hf"), "hf lookup": run_hf("hf lookup")})
        timings = time_side_by_side(fns, ctx.device, warmup=1, repeats=repeats)
        speed = {name: new_tokens / t.median for name, t in timings.items()}
        row = {"prompt_tokens": len(ids), "tokens_per_s": speed,
               "timings_s": {name: t.to_dict() for name, t in timings.items()},
               "text": tok.decode(out["plain"], skip_special_tokens=True)}
        for name in fns:
            if name == "plain":
                continue
            tokens = out[name].tokens if isinstance(out[name], SpeculativeResult) else out[name]
            row.setdefault("same_tokens_as_plain", {})[name] = tokens == out["plain"]
            if isinstance(out[name], SpeculativeResult):
                row.setdefault("stats", {})[name] = out[name].stats.to_dict()
        result["tasks"][task] = row

        def note(name):
            s = out[name].stats
            return (f"{speed[name]:.1f} vs {speed['plain']:.1f} tokens/s; acceptance {s.acceptance_rate:.2f}, "
                    f"{s.tokens_per_call:.2f} tokens per target call (k={k}); same tokens as plain greedy: "
                    f"{row['same_tokens_as_plain'][name]}")

        grounded = task == "grounded"
        figures.append(reported(f"prompt lookup speedup over plain generate ({task} task)",
                                speed["lookup"] / speed["plain"], "x", target=1.5 if grounded else None,
                                claim=None if grounded else "speculation pays only when drafts are accepted",
                                note=note("lookup") + ("" if grounded else
                                                       "; free text has little to copy from the prompt")))
        if self_draft is not None:
            # Leviathan et al.'s formula assumes a (k+1)-token target pass costs one plain step;
            # the note shows what it predicts and what the measured pass cost does to it
            s = out["int4 self-draft"].stats
            plain_step = timings["plain"].median / new_tokens
            c = s.draft_seconds / max(s.drafted, 1) / plain_step
            verify_cost = s.target_seconds / max(s.target_calls, 1) / plain_step
            predicted = expected_speedup(min(s.alpha, 1.0), k, c)
            with_verify = expected_tokens_per_call(min(s.alpha, 1.0), k) / (k * c + verify_cost)
            figures.append(reported(f"int4 self-draft speedup over plain generate ({task} task)",
                                    speed["int4 self-draft"] / speed["plain"], "x",
                                    target=1.2 if grounded else None,
                                    note=note("int4 self-draft") + f"; a draft step costs {c:.2f} plain steps and "
                                         f"a {k + 1}-token target pass {verify_cost:.2f}: Leviathan et al.'s "
                                         f"formula predicts {predicted:.2f}x with a free pass, {with_verify:.2f}x "
                                         f"with the measured one"))
        if grounded:
            figures.append(reported("labsupport prompt lookup / HF prompt-lookup generate (grounded task)",
                                    speed["lookup"] / speed["hf lookup"], "x",
                                    note=f"{speed['lookup']:.1f} vs {speed['hf lookup']:.1f} tokens/s; HF prompt "
                                         f"lookup over HF generate: {speed['hf lookup'] / speed['hf']:.2f}x; HF "
                                         f"same tokens as our plain greedy: {row['same_tokens_as_plain']['hf']}, "
                                         f"HF lookup: {row['same_tokens_as_plain']['hf lookup']}"))
    if self_draft_note:
        result["int4_self_draft"] = self_draft_note
    for task in tasks:
        for name, stats in result["tasks"][task].get("stats", {}).items():
            figures.append(reported(f"acceptance rate, {name} ({task} task)", stats["acceptance_rate"],
                                    "fraction", note=f"{stats['tokens_per_target_call']:.2f} tokens per target "
                                                     f"call; alpha {stats['alpha']:.2f}"))
    result["figures"] = figures
    return result
