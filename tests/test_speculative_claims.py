"""Notebook 05's verdicts and cost arithmetic: `claims.speculative_claims` on synthetic
measurements that should hold and ones that should not, `pass_costs`, the exact token
distribution of one speculative position, and the Hugging Face peer's exact length."""

import pytest
import torch

from labsupport.lab.busy import BUSY_VERDICT
from labsupport.claims import speculative_claims
from labsupport.errors import LabError
from labsupport.lab.measure import Timing
from labsupport.lab.speculative_math import PassCosts, pass_costs, speculative_token_distribution
from labsupport.engine.speculative import SpeculativeStats


def stats(acceptance: float, draft_seconds: float = 0.0, target_seconds: float = 1.0, calls: int = 10):
    """Stats of 40 drafted tokens with the given acceptance rate."""
    accepted = round(40 * acceptance)
    return SpeculativeStats(drafted=40, accepted=accepted, rejected=min(calls, 40 - accepted),
                            replaced=min(calls, 40 - accepted), bonus=0, target_calls=calls,
                            draft_seconds=draft_seconds, target_seconds=target_seconds)


def timing(seconds: float, spread: float = 0.0) -> Timing:
    return Timing([seconds - spread / 2, seconds + spread / 2])


def task(plain: float, drafts: dict, spread: float = 0.0) -> dict:
    """drafts: name -> (seconds, SpeculativeStats); a plain decode step of 0.05 s."""
    return {"timings": {"plain": timing(plain), **{n: timing(t, spread) for n, (t, _) in drafts.items()}},
            "stats": {n: s for n, (_, s) in drafts.items()}, "plain_step_s": 0.05}


EXACT_SAMPLING = {"n": 1500, "tv_target": 0.03, "tv_draft": 0.4, "tv_noise": 0.05,
                  "tv_resample_target": 0.12, "tv_resample_residual": 0.0}


def verdicts(rows):
    return {row["claim"].split(":")[0][:30]: row["verdict"] for row in rows}


def test_claims_that_hold():
    grounded = task(2.0, {"prompt lookup": (0.8, stats(0.9, 0.001, 1.0)), "int4 self-draft": (1.5, stats(1.0, 0.2, 1.0))})
    creative = task(2.0, {"prompt lookup": (2.1, stats(0.3, 0.001, 1.5)), "int4 self-draft": (1.6, stats(0.8, 0.2, 1.0))})
    rows = speculative_claims(grounded, creative, True, EXACT_SAMPLING, load=None)
    assert [r["verdict"] for r in rows] == [
        "holds",                                                        # 2.5x
        "holds",                                                        # creative acceptance lower for both
        "holds: slower than the target alone",                          # lookup at 0.3: 0.95x
        "partly: the larger cost is the target's verify pass, not the draft",
        "holds",
        "holds (within sampling noise)",
        "imprecise: the replacement comes from normalize(max(0, p - q)); from p itself it is biased"]
    assert "prompt lookup, 2.50x" in rows[0]["measured"]
    assert "prompt lookup: drafting 0.00, verify pass 2.00" in rows[3]["measured"]


def test_claims_that_do_not_hold():
    grounded = task(2.0, {"prompt lookup": (1.95, stats(0.5, 0.001, 1.0)), "int4 self-draft": (1.9, stats(0.6, 3.0, 1.0))})
    creative = task(2.0, {"prompt lookup": (1.2, stats(0.4, 0.001, 1.0)), "int4 self-draft": (1.9, stats(0.7, 3.0, 1.0))})
    sampling = {**EXACT_SAMPLING, "tv_target": 0.2}
    rows = speculative_claims(grounded, creative, False, sampling, load=None)
    got = [r["verdict"] for r in rows]
    assert got[0] == "not here: no real gain"                          # 1.05x
    assert got[1] == "partly: lower for prompt lookup only"
    assert got[2] == "not here: prompt lookup still helped"              # acceptance 0.4 but 1.67x
    assert got[3] == "depends on the draft: prompt lookup: the verify pass; int4 self-draft: the draft"
    assert got[4] == "does not hold here"
    assert got[5] == "does not hold here"


def test_claims_in_between():
    grounded = task(2.0, {"prompt lookup": (1.5, stats(0.9, 0.001, 1.0))})
    creative = task(2.0, {"prompt lookup": (1.9, stats(0.6, 0.001, 1.0))})
    close_draft = {**EXACT_SAMPLING, "tv_draft": 0.04}
    rows = speculative_claims(grounded, creative, True, close_draft, load=None)
    assert rows[0]["verdict"] == "partly: faster, but less than 2x"     # 1.33x
    assert rows[2]["verdict"] == "not tested here"                      # no draft below 0.5 acceptance
    assert "lowest acceptance: prompt lookup, 0.60" in rows[2]["measured"]
    assert rows[5]["verdict"].startswith("inconclusive")
    more = speculative_claims(task(2.0, {"prompt lookup": (0.4, stats(0.95))}), creative, True, EXACT_SAMPLING)
    assert more[0]["verdict"] == "holds (more than 4x)"


def test_a_busy_machine_gets_no_timing_verdict():
    grounded = task(2.0, {"prompt lookup": (0.8, stats(0.9, 0.001, 1.0))}, spread=0.5)
    creative = task(2.0, {"prompt lookup": (2.1, stats(0.3, 0.001, 1.5))}, spread=0.9)
    rows = speculative_claims(grounded, creative, True, EXACT_SAMPLING, load=None)
    timing_rows = [rows[0], rows[2], rows[3]]
    assert all(r["verdict"].startswith(BUSY_VERDICT) and "disagree" in r["verdict"] for r in timing_rows)
    assert rows[1]["verdict"] == "holds" and rows[4]["verdict"] == "holds"     # counts, not times
    quiet = task(2.0, {"prompt lookup": (0.8, stats(0.9, 0.001, 1.0))})
    loaded = speculative_claims(quiet, task(2.0, {"prompt lookup": (2.1, stats(0.3))}), True, EXACT_SAMPLING, load=3.0)
    assert loaded[0]["verdict"].startswith(BUSY_VERDICT) and "load average" in loaded[0]["verdict"]


def test_pass_costs_in_plain_steps():
    s = SpeculativeStats(drafted=8, accepted=6, rejected=1, replaced=1, bonus=1, target_calls=2,
                         draft_seconds=0.4, target_seconds=0.8)
    costs = pass_costs(s, 0.2)
    assert costs == PassCosts(draft_per_token=0.25, draft_per_pass=1.0, verify_per_pass=2.0)
    assert costs.larger == "the verify pass"
    assert pass_costs(SpeculativeStats(drafted=8, target_calls=2, draft_seconds=1.0, target_seconds=0.4),
                      0.2).larger == "the draft"
    assert pass_costs(SpeculativeStats(target_calls=3, target_seconds=0.3), 0.1).draft_per_token == 0.0
    with pytest.raises(LabError, match="plain_step_seconds"):
        pass_costs(s, 0.0)
    with pytest.raises(LabError, match="no target pass"):
        pass_costs(SpeculativeStats(), 0.1)


def test_the_residual_gives_back_the_target_and_resampling_from_it_does_not():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64) * 2, 0)
    exact = speculative_token_distribution(p, q)
    assert torch.allclose(exact, p, atol=1e-12)
    biased = speculative_token_distribution(p, q, resample_from="target")
    assert float(biased.sum()) == pytest.approx(1.0)
    assert 0.5 * float((biased - p).abs().sum()) > 0.05            # pulled towards q's favourites
    assert torch.allclose(speculative_token_distribution(p, p), p)  # nothing is ever rejected
    with pytest.raises(LabError, match="resample_from"):
        speculative_token_distribution(p, q, resample_from="draft")


def test_the_hf_peer_generates_every_token_even_past_its_end_token():
    """transformers 5 reads eos_token_id=None as unset and stops at the model's end token;
    the peer must run for exactly the requested tokens, like labsupport (and so must its prompt lookup)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from labsupport.bench.peers.huggingface import ForwardPasses, hf_generate_fn

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = LlamaForCausalLM(config).eval()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    with torch.inference_mode():
        first = int(hf(torch.tensor([prompt])).logits[0, -1].argmax())
    hf.generation_config.eos_token_id = first         # the model's end token is its very next choice
    plain = hf_generate_fn(hf, prompt, 6)()[0, len(prompt):].tolist()
    assert len(plain) == 6 and plain[0] == first
    with ForwardPasses(hf) as passes:
        lookup = hf_generate_fn(hf, prompt, 6, prompt_lookup=3)()[0, len(prompt):].tolist()
    assert lookup == plain
    assert passes.tokens[0] >= len(prompt) and len(passes.seconds) == len(passes.tokens) >= 2
    assert all(s > 0 for s in passes.seconds)


def test_the_bench_sections_claims_come_from_its_dict():
    """`speculative_section_claims` rebuilds the timings and stats from the section's JSON and
    judges them as the notebook does; the bench decodes greedily, so sampling is not measured."""
    import json

    from labsupport.claims import speculative_section_claims
    grounded = task(1.0, {"lookup": (0.4, stats(0.8))})
    creative = task(1.0, {"lookup": (1.1, stats(0.3))})

    def as_json(run):
        return {"timings_s": {n: t.to_dict() for n, t in run["timings"].items()},
                "stats": {n: s.to_dict() for n, s in run["stats"].items()}, "plain_step_s": run["plain_step_s"],
                "same_tokens_as_plain": {"lookup": True, "hf": False}}      # HF's tokens are not our draft's
    section = json.loads(json.dumps({"tasks": {"grounded": as_json(grounded), "creative": as_json(creative)},
                                     "load_per_core": 0.5}))
    rows = speculative_section_claims(section)
    expected = speculative_claims(grounded, creative, True, EXACT_SAMPLING, load=0.5)
    assert rows[:5] == expected[:5] and verdicts(rows)["when draft and target agree, s"] == "holds"
    assert [r["verdict"] for r in rows[5:]] == ["not measured here"] * 2
    section["tasks"]["creative"]["same_tokens_as_plain"]["lookup"] = False
    assert speculative_section_claims(section)[4]["verdict"] == "does not hold here"
