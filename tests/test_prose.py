"""lab.prose and lab.roofline_hardware (notebooks 00-04): the sentences that depend on the model or the
device, on the embedded model's shapes and on a hub-shaped config (SmolLM2-1.7B's: 32 heads, 32 key/value
heads, 24 layers), and the data sheets' arithmetic."""

import math

import pytest
import torch

from labsupport.engine.config import PRESETS
from labsupport.lab import roofline_hardware as H
from labsupport.lab import prose
from labsupport.lab.roofline import decode_step_cost

SMALL, HUB = PRESETS["smollm2-135m"], PRESETS["smollm2-1.7b-shape"]


def test_the_shapes_come_from_the_config():
    assert "24 layers, 32 query heads and 32 key/value heads" in prose.shape_sentence(HUB)
    assert "30 layers, 9 query heads and 3 key/value heads" in prose.shape_sentence(SMALL)
    assert prose.operations_per_step(HUB).startswith("24 layers") and "240" in prose.operations_per_step(HUB)


def test_gqa_is_stated_only_where_the_model_has_it():
    assert "3x larger" in prose.gqa_sentence(SMALL) and "9 query heads but only 3" in prose.gqa_sentence(SMALL)
    hub = prose.gqa_sentence(HUB)
    assert "full multi-head attention" in hub and "saves nothing" in hub and "larger" not in hub


def test_the_4bit_origin_is_the_embedded_model_s_own(monkeypatch):
    monkeypatch.delenv("LABSUPPORT_GGUF", raising=False)
    embedded = prose.weights_origin("smollm2-135m")
    assert embedded.stored == "Q4_1" and embedded.block == 32 and embedded.was_4bit
    assert "Q4_1" in prose.origin_sentence("smollm2-135m")
    hub = prose.weights_origin("smollm2-1.7b")
    assert not hub.was_4bit and hub.block == 0
    assert "never 4-bit" in prose.origin_sentence("smollm2-1.7b") and "Q4_1" not in prose.origin_sentence("smollm2-1.7b")


def test_a_gguf_override_of_another_type_is_read_from_its_name(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_GGUF", "/somewhere/SmolLM2-135M-Instruct.Q8_0.gguf")
    origin = prose.weights_origin("smollm2-135m")
    assert origin.stored == "Q8_0" and not origin.was_4bit and "never 4-bit" in prose.origin_sentence("smollm2-135m")


def test_the_gpu_ridge_in_rows_depends_on_the_dtype():
    fp32 = prose.ridge_rows_sentence(HUB, torch.float32)
    assert "16-bit only" in fp32 and "NVIDIA H100 SXM 20 FLOP/byte" in fp32
    h100 = next(s for s in H.DATA_SHEETS if s.name == "NVIDIA H100 SXM")
    assert h100.ridge("float32") == pytest.approx(20, abs=0.1) and h100.ridge("bfloat16") == pytest.approx(295, abs=1)
    # an fp32 decode step at context 0 reaches an H100's ridge near 2 x 20 / ... = some 40 rows, bf16's near 300
    rows = {r["machine"]: r for r in H.hardware_rows(HUB)}["NVIDIA H100 SXM"]
    assert 30 < rows["ridge batch fp32"] < 60 and 250 < rows["ridge batch 16-bit"] < 350
    assert "16-bit only" not in prose.ridge_rows_sentence(HUB, torch.bfloat16)


def test_a_pure_roofline_halves_at_twice_the_ridge_batch():
    assert "batch 24.0" in prose.pure_roofline_stop(12.0) and "at the ridge (batch 12.0)" in prose.pure_roofline_stop(12.0)
    assert "never" in prose.pure_roofline_stop(math.inf)


def test_the_bf16_baseline_note_follows_the_switch(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_NO_BF16", "1")
    note = prose.bf16_baseline_note("cpu")
    assert "emulated" in note and "LABSUPPORT_NO_BF16" in note and "does not isolate" in note


def test_the_hardware_table_lists_every_sheet_with_a_source():
    table = H.markdown_hardware_table(H.hardware_rows(SMALL), SMALL.name)
    for sheet in H.DATA_SHEETS:
        assert sheet.name in table and sheet.source
    assert table.count("\n[") == len(H.DATA_SHEETS)


def test_mbu_and_mfu_of_a_row():
    cost = decode_step_cost(SMALL, 1, 0, torch.float32)
    profile = H.DATA_SHEETS[0].profile()
    seconds = cost.bytes / profile.bandwidth * 2            # half the bandwidth
    row = {"bytes": cost.bytes, "flops": cost.flops, "seconds": seconds, "dtype": "float32"}
    u = H.utilisation(row, profile)
    assert u["mbu"] == pytest.approx(0.5) and u["mfu"] == pytest.approx(cost.flops / seconds / profile.flops["float32"])
    assert u["mbu_copy"] == u["mbu"]                              # a data sheet: no read probe, the copy's
    profile.read_bandwidth = profile.bandwidth * 1.25            # a read probe faster than the copy
    u = H.utilisation(row, profile)
    assert u["mbu"] == pytest.approx(0.4) and u["mbu_copy"] == pytest.approx(0.5)
