"""Notebook 05's section: speculative decoding against plain decoding and Hugging Face's
prompt-lookup decoding, on a grounded and a creative task.

Introduced in notebook 05 (speculative decoding); ``python -m labsupport bench --sections speculative``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.busy import busy_reason
from ..errors import LabError
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..lab.measure import (HF_GRAPHED, NOT_GRAPHED, WARMUP_TOKENS, mark_graphed, require_graphed, time_side_by_side,
                           timed_compile)
from ..engine.speculative import ModelDraft, PromptLookupDraft, SpeculativeResult, speculative_generate
from ..lab.speculative_math import expected_speedup, pass_costs
from .core import BenchContext, reported
from .options import SectionOptions, count
from ..lab.workloads import CREATIVE_PROMPT, GROUNDED_PROMPT
from .peers.huggingface import ForwardPasses, hf_generate_fn, hf_static_compiled_fn



@dataclass(frozen=True)
class SpeculativeOptions(SectionOptions):
    """The speculative section's options (the same on a CPU and a GPU). Introduced in notebook 05.

    new_tokens: new tokens per generation (fp32, greedy, batch 1); repeats: timed repeats of
    each candidate, interleaved; k: tokens drafted per target pass (ours and Hugging Face's
    prompt lookup)."""

    SECTION = "speculative"
    new_tokens: int = count(128)
    repeats: int = count(3)
    k: int = count(4)


def section_speculative(ctx: BenchContext, options: SpeculativeOptions) -> dict:
    """Speculative decoding on the embedded model, fp32, greedy, batch 1, side by side:
    plain `generate`, prompt lookup and the int4 self-draft (ours), and Hugging Face's
    plain and prompt-lookup generate(); on a grounded task (the answer repeats the
    prompt) and on creative free text, where prompt lookup has little to copy.
    Every speculative run must give the same tokens as plain greedy decoding.
    Each draft's costs are reported in plain decode steps (`pass_costs`): a drafted token
    (c) and the target's verify pass (v), with Leviathan et al.'s prediction for a free
    pass (v = 1) and for the measured one.

    Introduced in notebook 05 (speculative decoding). The int4 self-draft is the run's int4
    variant (`BenchContext.variants`, groups of 32), the same model the quantization and
    engines sections time. Its claims: `claims.speculative.speculative_section_claims`.
    """
    new_tokens, repeats, k = options.new_tokens, options.repeats, options.k
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    lookup = PromptLookupDraft(ngram=3)
    self_draft, self_draft_note = None, ""
    try:
        self_draft = ModelDraft(ctx.variants.get("float32", "int4", group_size=32), name="int4 self-draft")
    except LabError as error:
        self_draft_note = f"int4 self-draft skipped: {error}"
    tasks = {"grounded": GROUNDED_PROMPT, "creative": CREATIVE_PROMPT}
    # On a GPU plain decoding, our speculative loops (the draft's steps and the verify passes) and
    # Hugging Face's plain row are replayed CUDA graphs; HF's prompt lookup runs its own eager loop,
    # so its figures there are failed measurements, as is any of ours that could not be graphed.
    graphed = timed_compile(ctx.device)
    own_loop = NOT_GRAPHED if graphed else "eager"
    paths = {"plain": set(), "lookup": set(), "int4 self-draft": set(),
             "hf": {HF_GRAPHED if graphed else "eager"}, "hf lookup": {own_loop}}
    warmup_s: dict = {}
    result = {"new_tokens": new_tokens, "k": k, "dtype": "float32", "batch": 1, "tasks": {},
              "hf_assisted_generation": "skipped: the only offline model is the target itself, and a "
                                        "model as its own assistant costs as much as it saves"}
    figures = []
    for task, message in tasks.items():
        ids = tok.encode(chat_prompt(tok, message))
        out: dict = {}

        def methods(n: int) -> dict:
            """Each method generating n tokens: n = new_tokens is timed, a few tokens warm up."""
            hf_runs = {"hf": (hf_static_compiled_fn if graphed else hf_generate_fn)(hf, ids, n),
                       # prompt lookup: same k and n-gram
                       "hf lookup": hf_generate_fn(hf, ids, n, prompt_lookup=k, lookup_ngram=lookup.ngram)}

            def plain():
                out["plain result"] = require_graphed(generate(model, ids, n, eos_token_ids=(), compile=graphed),
                                                      "plain generate", ctx.device)
                paths["plain"].add(out["plain result"].decode_path)
                out["plain"] = out["plain result"].row(0)

            def run_draft(name, draft):
                def fn():
                    out[name] = speculative_generate(model, draft, ids, n, k=k, eos_token_ids=(), compile=graphed)
                    paths[name].add(out[name].decode_path)
                    warmup_s[name] = warmup_s.get(name, 0.0) + out[name].warmup_seconds
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
            return fns

        fns = methods(new_tokens)
        timings = time_side_by_side(fns, ctx.device, warmup=1, repeats=repeats,
                                    warmup_fns=methods(WARMUP_TOKENS))   # the timed runs write `out` last
        busy = busy_reason(timings)                 # the load probe is the suite's (mark_busy)
        speed = {name: new_tokens / t.median for name, t in timings.items()}
        plain_result = out["plain result"]
        plain_step = plain_result.decode_seconds / max(len(out["plain"]) - 1, 1)
        row = {"prompt_tokens": len(ids), "tokens_per_s": speed, "plain_step_s": plain_step,
               "timings_s": {name: t.to_dict() for name, t in timings.items()},
               "text": tok.decode(out["plain"], skip_special_tokens=True)}
        for name in fns:
            if name == "plain":
                continue
            tokens = out[name].tokens if isinstance(out[name], SpeculativeResult) else out[name]
            row.setdefault("same_tokens_as_plain", {})[name] = tokens == out["plain"]
            if isinstance(out[name], SpeculativeResult):
                row.setdefault("stats", {})[name] = out[name].stats.to_dict()
                r = out[name]
                row.setdefault("paths", {})[name] = {"decode_path": r.decode_path, "verify_path": r.verify_path,
                                                     "draft_path": r.draft_path, "decode_note": r.decode_note}
                row.setdefault("costs_in_plain_steps", {})[name] = pass_costs(out[name].stats,
                                                                              plain_step).__dict__
        if task == "grounded":                      # one more run, untimed: what HF's passes were
            with ForwardPasses(hf) as passes:
                hf_generate_fn(hf, ids, new_tokens, prompt_lookup=k, lookup_ngram=lookup.ngram)()
            row["hf_lookup_passes"] = {"tokens_fed": passes.tokens, "seconds": passes.seconds}
        result["tasks"][task] = row

        def note(name):
            s = out[name].stats
            return (f"{speed[name]:.1f} vs {speed['plain']:.1f} tokens/s; acceptance {s.acceptance_rate:.2f}, "
                    f"{s.tokens_per_call:.2f} tokens per target call (k={k}); same tokens as plain greedy: "
                    f"{row['same_tokens_as_plain'][name]}")

        grounded = task == "grounded"

        def checked(figure, *names):
            return mark_graphed(figure, [p for n in names for p in paths[n]], ctx.device)
        figures.append(checked(reported(f"prompt lookup speedup over plain generate ({task} task)",
                                        speed["lookup"] / speed["plain"], "x", target=1.5 if grounded else None,
                                        busy=busy, note=note("lookup") + ("" if grounded else
                                                                          "; free text has little to copy from the "
                                                                          "prompt")), "lookup", "plain"))
        if self_draft is not None:
            # Leviathan et al.'s formula assumes a (k+1)-token target pass costs one plain step;
            # the note shows what it predicts and what the measured pass cost does to it
            s = out["int4 self-draft"].stats
            costs = pass_costs(s, plain_step)
            alpha = min(max(s.alpha, 0.0), 1.0)
            free = expected_speedup(alpha, k, costs.draft_per_token)
            measured_pass = expected_speedup(alpha, k, costs.draft_per_token, costs.verify_per_pass)
            figures.append(reported(f"int4 self-draft speedup over plain generate ({task} task)",
                                    speed["int4 self-draft"] / speed["plain"], "x",
                                    target=1.2 if grounded else None, busy=busy,
                                    note=note("int4 self-draft") + f"; a drafted token costs "
                                         f"{costs.draft_per_token:.2f} plain steps ({costs.draft_per_pass:.2f} "
                                         f"per step) and a {k + 1}-token verify pass {costs.verify_per_pass:.2f}: "
                                         f"the larger cost is {costs.larger}; Leviathan et al.'s formula predicts "
                                         f"{free:.2f}x with a free pass, {measured_pass:.2f}x with the measured one"))
            checked(figures[-1], "int4 self-draft", "plain")
        if grounded:
            hf_passes = row["hf_lookup_passes"]["tokens_fed"]
            ours_passes = out["lookup"].stats.target_calls + 1
            figures.append(reported("labsupport prompt lookup / HF prompt-lookup generate (grounded task)",
                                    speed["lookup"] / speed["hf lookup"], "x", busy=busy,
                                    note=f"{speed['lookup']:.1f} vs {speed['hf lookup']:.1f} tokens/s; HF prompt "
                                         f"lookup over HF generate: {speed['hf lookup'] / speed['hf']:.2f}x; HF "
                                         f"same tokens as our plain greedy: {row['same_tokens_as_plain']['hf']}, "
                                         f"HF lookup: {row['same_tokens_as_plain']['hf lookup']}; forward passes "
                                         f"with the prompt's: HF {len(hf_passes)} (its first also checks drafts), "
                                         f"ours {ours_passes} (a separate prefill)"))
            checked(figures[-1], "lookup", "hf lookup")
    if self_draft_note:
        result["int4_self_draft"] = self_draft_note
    for task in tasks:
        for name, stats in result["tasks"][task].get("stats", {}).items():
            figures.append(reported(f"acceptance rate, {name} ({task} task)", stats["acceptance_rate"],
                                    "fraction", note=f"{stats['tokens_per_target_call']:.2f} tokens per target "
                                                     f"call; alpha {stats['alpha']:.2f}"))
    result["decode_paths"] = {name: sorted(p) for name, p in paths.items()}
    result["compile_s"] = warmup_s              # compiling/recording, apart from every timed second
    result["figures"] = figures
    return result
