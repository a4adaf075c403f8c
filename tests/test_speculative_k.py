"""Notebook 05's extras: v(k) and the best k, the prose on the model's origin (embedded Q4_1 or a
hub checkpoint, with a hub-shaped config), and the "where it loses here" ledger."""

from types import SimpleNamespace

import pytest

from labsupport.weights.hf_config import config_from_hf
from labsupport.engine.speculative import SpeculativeStats
from labsupport.errors import LabError
from labsupport.lab.speculative_k import (k_curve, self_draft_origin_note, summary_origin_line,
                                          verify_pass_seconds, weights_were_4bit, where_it_loses)


def hub_config():
    """A config shaped like SmolLM2-360M-Instruct's config.json, as config_from_hf reads it."""
    from transformers import LlamaConfig
    hf = LlamaConfig(vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                     num_attention_heads=15, num_key_value_heads=5, max_position_embeddings=8192,
                     rope_theta=100000, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    return config_from_hf(hf, name="smollm2-360m")


def test_the_origin_prose_follows_the_model():
    embedded = SimpleNamespace(name="smollm2-135m")
    hub = hub_config()
    assert weights_were_4bit(embedded) and not weights_were_4bit(hub)
    note = self_draft_origin_note(embedded, 0.001, 0.09)
    assert "Q4_1" in note and "special case" in note and "0.10%" in note
    note = self_draft_origin_note(hub, 0.08, 0.09)
    assert "Q4_1" not in note and "smollm2-360m" in note and "approximation" in note
    assert "4-bit before" in summary_origin_line(embedded) and "4-bit before" not in summary_origin_line(hub)


def test_the_best_k_follows_the_costs():
    verify = {k: 1.0 + 0.1 * k for k in range(9)}            # seconds: plain step 1 s
    cheap = k_curve(0.9, 0.0, verify, 1.0)
    dear = k_curve(0.5, 1.0, verify, 1.0)
    assert cheap.best_k > 2 and dear.best_k == 0
    assert dear.speedup[0] == pytest.approx(1.0)
    with pytest.raises(LabError):
        k_curve(0.5, 0.1, verify, 0.0)


def test_verify_pass_seconds_times_every_k(tiny_llama):
    seconds = verify_pass_seconds(tiny_llama, list(range(10, 20)), ks=[1, 3], repeats=1)
    assert sorted(seconds) == [0, 1, 3] and all(t > 0 for t in seconds.values())


def test_the_ledger_names_what_lost_and_why():
    timing = lambda s: SimpleNamespace(median=s)                                       # noqa: E731
    slow = SpeculativeStats(drafted=40, accepted=4, rejected=10, replaced=10, bonus=0, target_calls=10,
                            draft_seconds=8.0, target_seconds=20.0)
    fast = SpeculativeStats(drafted=40, accepted=36, rejected=1, replaced=1, bonus=9, target_calls=10,
                            draft_seconds=0.1, target_seconds=10.0)
    runs = {"creative": {"timings": {"plain": timing(10.0), "lookup": timing(5.0), "int4": timing(30.0)},
                         "stats": {"lookup": fast, "int4": slow}, "plain_step_s": 1.0}}
    lines = where_it_loses(runs, ["lookup", "int4"], 4, hf_ratio=0.8)
    assert len(lines) == 2 and lines[0].startswith("int4, creative task: 0.33x")
    assert "Few drafts were accepted" in lines[0] and "verify pass" in lines[0] and "Drafting cost" in lines[0]
    from test_prose_length import sl                  # short sentences (issue 52): none over 25 words here
    assert max(sl.words(sentence) for sentence in sl.sentences(lines[0])) <= 25
    assert "Hugging Face" in lines[1]


def test_the_origin_prose_follows_the_gguf_file_not_the_name(monkeypatch):
    embedded = SimpleNamespace(name="smollm2-135m")
    monkeypatch.setenv("LABSUPPORT_GGUF", "/models/SmolLM2-135M-Instruct-Q8_0.gguf")
    assert not weights_were_4bit(embedded)
    assert "Q8_0" in self_draft_origin_note(embedded, 0.08, 0.09) and "special case" not in summary_origin_line(embedded)
    monkeypatch.setenv("LABSUPPORT_GGUF", "/models/SmolLM2-135M-Instruct-Q4_0.gguf")
    assert weights_were_4bit(embedded) and "Q4_0" in summary_origin_line(embedded)
