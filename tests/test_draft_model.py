"""lab.speculative_draft_model (notebook 05): the embedded 135M drafting for a larger SmolLM2 where the hub is reachable.
The hub is never reachable here, so the measuring path runs with the loader patched to give the embedded
model as the target too (a draft equal to its target: every drafted token accepted, the same tokens)."""

import torch

from labsupport.lab import speculative_draft_model as D


def test_unreachable_hub_is_one_sentence_and_no_download(monkeypatch):
    monkeypatch.setattr(D, "_hub_reachable", lambda: False)
    monkeypatch.setattr(D, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no load")))
    out = D.draft_model_run(torch.device("cpu"), [1, 2, 3], 4, 2)
    assert set(out) == {"skipped"} and "hub cannot be reached" in out["skipped"] and "\n" not in out["skipped"]


def test_an_unknown_target_is_refused_in_one_sentence():
    out = D.draft_model_run(torch.device("cpu"), [1, 2, 3], 4, 2, target_name="gpt2")
    assert "not 'gpt2'" in out["skipped"]


def test_the_measuring_path_with_the_loader_patched(monkeypatch, smollm):
    model, tokenizer = smollm
    loaded = []
    monkeypatch.setattr(D, "_hub_reachable", lambda: True)
    monkeypatch.setattr(D, "load_model", lambda name, device=None: (loaded.append(name), (model, tokenizer))[1])
    ids = tokenizer.encode("The fox jumps over the lazy dog. The fox")
    out = D.draft_model_run(torch.device("cpu"), ids, 8, 3, repeats=1)
    assert loaded == ["smollm2-360m", D.EMBEDDED]
    assert out["same_tokens"] and out["acceptance"] == 1.0 and out["tokens_per_pass"] > 3
    assert out["plain_tokens_per_s"] > 0 and out["speedup"] > 0 and out["decode_path"]
