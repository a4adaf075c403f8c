"""Notebook 05's section: speculative decoding against plain decoding and Hugging Face's
prompt-lookup decoding, on a grounded and a creative task.

Introduced in notebook 05 (speculative decoding); ``python -m labsupport bench --sections speculative``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..lab.busy import busy_reason
from ..errors import LabError
from ..engine.generation import generate
from ..weights.chat import chat_prompt
from ..lab.measure import (NOT_GRAPHED, WARMUP_TOKENS, mark_graphed, require_graphed, time_side_by_side,
                           timed_compile)
from ..engine.speculative import ModelDraft, PromptLookupDraft, SpeculativeResult, speculative_generate
from ..lab.speculative_math import expected_speedup, pass_costs
from .core import BenchContext, GraphCount, reported
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


@dataclass
class _Candidates:
    """What every task's candidates share, and their paths and compile seconds. Notebook 05 (speculative decoding)."""

    device: torch.device
    model: object                   # ours, fp32
    hf: object                      # Hugging Face's, the same weights
    lookup: PromptLookupDraft
    self_draft: ModelDraft | None   # None where the int4 variant could not be made
    k: int                          # tokens drafted per target pass
    graphed: bool                   # `measure.timed_compile`
    paths: dict                     # name -> the decode paths its runs took
    warmup_s: dict                  # name -> seconds spent compiling/recording
    hf_count: GraphCount = field(default_factory=GraphCount)   # torch's counts around HF's first (compiling) run


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
    new_tokens, k = options.new_tokens, options.k
    model, tok = ctx.model(torch.float32)
    hf = ctx.hf_model(torch.float32)
    lookup = PromptLookupDraft(ngram=3)
    self_draft, self_draft_note = _self_draft(ctx)
    tasks = {"grounded": GROUNDED_PROMPT, "creative": CREATIVE_PROMPT}
    candidates = _candidates(ctx, model, hf, lookup, self_draft, k)
    result = {"new_tokens": new_tokens, "k": k, "dtype": "float32", "batch": 1, "tasks": {},
              "hf_assisted_generation": "skipped: the only offline model is the target itself, and a "
                                        "model as its own assistant costs as much as it saves"}
    figures = []
    for task, message in tasks.items():
        ids = tok.encode(chat_prompt(tok, message))
        names, out, timings = _time_task(candidates, task, ids, options)
        busy = busy_reason(timings)                 # the load probe is the suite's (mark_busy)
        row = _task_row(tok, ids, names, out, timings, new_tokens)
        if task == "grounded":                      # one more run, untimed: what HF's passes were
            row["hf_lookup_passes"] = _hf_lookup_passes(candidates, ids, new_tokens)
        result["tasks"][task] = row
        figures += _task_figures(candidates, task, row, out, busy)
    if self_draft_note:
        result["int4_self_draft"] = self_draft_note
    figures += _acceptance_figures(result["tasks"])
    result["decode_paths"] = {name: sorted(p) for name, p in candidates.paths.items()}
    result["compile_s"] = candidates.warmup_s              # compiling/recording, apart from every timed second
    result["figures"] = figures
    return result


def _self_draft(ctx: BenchContext) -> tuple[ModelDraft | None, str]:
    """The run's int4 variant as a draft and "", or None and why not. Notebook 05 (speculative decoding)."""
    try:
        return ModelDraft(ctx.variants.get("float32", "int4", group_size=32), name="int4 self-draft"), ""
    except LabError as error:
        return None, f"int4 self-draft skipped: {error}"


def _candidates(ctx: BenchContext, model, hf, lookup: PromptLookupDraft, self_draft: ModelDraft | None,
                k: int) -> _Candidates:
    """The candidates' settings, with the decode paths known before any run. Notebook 05 (speculative decoding)."""
    # On a GPU plain decoding, our speculative loops (the draft's steps and the verify passes) and
    # Hugging Face's plain row are replayed CUDA graphs; HF's prompt lookup runs its own eager loop,
    # so its figures there are failed measurements, as is any of ours that could not be graphed.
    # HF's plain row says what torch counted around its first (compiling) run (`GraphCount`).
    graphed = timed_compile(ctx.device)
    own_loop = NOT_GRAPHED if graphed else "eager"
    paths = {"plain": set(), "lookup": set(), "int4 self-draft": set(), "hf": set(), "hf lookup": {own_loop}}
    return _Candidates(ctx.device, model, hf, lookup, self_draft, k, graphed, paths, {})


def _time_task(c: _Candidates, task: str, ids: list[int], options: SpeculativeOptions) -> tuple[list, dict, dict]:
    """One task's candidates side by side: (names, last outputs, timings). Notebook 05 (speculative decoding)."""
    out: dict = {}
    fns = _methods(c, task, ids, options.new_tokens, out)
    warmups = _methods(c, task, ids, WARMUP_TOKENS, out)
    timings = time_side_by_side(fns, c.device, warmup=1, repeats=options.repeats,
                                warmup_fns=warmups)   # the timed runs write `out` last
    return list(fns), out, timings


def _methods(c: _Candidates, task: str, ids: list[int], n: int, out: dict) -> dict:
    """Each method generating n tokens: n = new_tokens is timed, a few warm up. Notebook 05 (speculative decoding)."""
    hf_runs = {"hf": c.hf_count.first_call((hf_static_compiled_fn if c.graphed else hf_generate_fn)(c.hf, ids, n)),
               # prompt lookup: same k and n-gram
               "hf lookup": hf_generate_fn(c.hf, ids, n, prompt_lookup=c.k, lookup_ngram=c.lookup.ngram)}

    def plain():
        out["plain result"] = require_graphed(generate(c.model, ids, n, eos_token_ids=(), compile=c.graphed),
                                              "plain generate", c.device)
        c.paths["plain"].add(out["plain result"].decode_path)
        out["plain"] = out["plain result"].row(0)

    def run_draft(name, draft):
        def fn():
            out[name] = speculative_generate(c.model, draft, ids, n, k=c.k, eos_token_ids=(), compile=c.graphed)
            c.paths[name].add(out[name].decode_path)
            c.warmup_s[name] = c.warmup_s.get(name, 0.0) + out[name].warmup_seconds
        return fn

    def run_hf(name):
        def fn():
            out[name] = hf_runs[name]()[0, len(ids):].tolist()
            if name == "hf":
                c.paths[name] = {c.hf_count.hf_path(c.graphed)}
        return fn

    fns = {"plain": plain, "lookup": run_draft("lookup", c.lookup)}
    if c.self_draft is not None:
        fns["int4 self-draft"] = run_draft("int4 self-draft", c.self_draft)
    if task == "grounded":
        fns.update({"hf": run_hf("hf"), "hf lookup": run_hf("hf lookup")})
    return fns


def _task_row(tok, ids: list[int], names: list, out: dict, timings: dict, new_tokens: int) -> dict:
    """One task's row: speeds, same tokens as plain, stats, paths, costs. Notebook 05 (speculative decoding)."""
    speed = {name: new_tokens / t.median for name, t in timings.items()}
    plain_result = out["plain result"]
    plain_step = plain_result.decode_seconds / max(len(out["plain"]) - 1, 1)
    row = {"prompt_tokens": len(ids), "tokens_per_s": speed, "plain_step_s": plain_step,
           "timings_s": {name: t.to_dict() for name, t in timings.items()},
           "text": tok.decode(out["plain"], skip_special_tokens=True)}
    for name in names:
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
    return row


def _hf_lookup_passes(c: _Candidates, ids: list[int], new_tokens: int) -> dict:
    """Tokens fed and seconds of an untimed HF prompt-lookup run's passes. Notebook 05 (speculative decoding)."""
    with ForwardPasses(c.hf) as passes:
        hf_generate_fn(c.hf, ids, new_tokens, prompt_lookup=c.k, lookup_ngram=c.lookup.ngram)()
    return {"tokens_fed": passes.tokens, "seconds": passes.seconds}


def _task_figures(c: _Candidates, task: str, row: dict, out: dict, busy: str | None) -> list[dict]:
    """One task's figures: each draft over plain generate, ours over HF's lookup. Notebook 05 (speculative decoding)."""
    speed, grounded = row["tokens_per_s"], task == "grounded"

    def note(name):
        s = out[name].stats
        return (f"{speed[name]:.1f} vs {speed['plain']:.1f} tokens/s; acceptance {s.acceptance_rate:.2f}, "
                f"{s.tokens_per_call:.2f} tokens per target call (k={c.k}); same tokens as plain greedy: "
                f"{row['same_tokens_as_plain'][name]}")

    def checked(figure, *names):
        return mark_graphed(figure, [p for n in names for p in c.paths[n]], c.device)
    figures = [checked(reported(f"prompt lookup speedup over plain generate ({task} task)",
                                speed["lookup"] / speed["plain"], "x", target=1.5 if grounded else None,
                                busy=busy, note=note("lookup") + ("" if grounded else
                                                                  "; free text has little to copy from the "
                                                                  "prompt")), "lookup", "plain")]
    if c.self_draft is not None:
        figures.append(_self_draft_figure(c.k, task, row, out, busy, note("int4 self-draft")))
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
    return figures


def _self_draft_figure(k: int, task: str, row: dict, out: dict, busy: str | None, note: str) -> dict:
    """The int4 self-draft's speedup, costs and Leviathan et al.'s prediction. Notebook 05 (speculative decoding)."""
    speed = row["tokens_per_s"]
    # Leviathan et al.'s formula assumes a (k+1)-token target pass costs one plain step;
    # the note shows what it predicts and what the measured pass cost does to it
    s = out["int4 self-draft"].stats
    costs = pass_costs(s, row["plain_step_s"])
    alpha = min(max(s.alpha, 0.0), 1.0)
    free = expected_speedup(alpha, k, costs.draft_per_token)
    measured_pass = expected_speedup(alpha, k, costs.draft_per_token, costs.verify_per_pass)
    return reported(f"int4 self-draft speedup over plain generate ({task} task)",
                    speed["int4 self-draft"] / speed["plain"], "x",
                    target=1.2 if task == "grounded" else None, busy=busy,
                    note=note + f"; a drafted token costs "
                         f"{costs.draft_per_token:.2f} plain steps ({costs.draft_per_pass:.2f} "
                         f"per step) and a {k + 1}-token verify pass {costs.verify_per_pass:.2f}: "
                         f"the larger cost is {costs.larger}; Leviathan et al.'s formula predicts "
                         f"{free:.2f}x with a free pass, {measured_pass:.2f}x with the measured one")


def _acceptance_figures(tasks: dict) -> list[dict]:
    """The acceptance rate of every draft on every task. Notebook 05 (speculative decoding)."""
    figures = []
    for task in tasks:
        for name, stats in tasks[task].get("stats", {}).items():
            figures.append(reported(f"acceptance rate, {name} ({task} task)", stats["acceptance_rate"],
                                    "fraction", note=f"{stats['tokens_per_target_call']:.2f} tokens per target "
                                                     f"call; alpha {stats['alpha']:.2f}"))
    return figures
