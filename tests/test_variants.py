"""`variants.ModelVariants`: one model per precision and weight format, each built once through
`precision.cast_model` (so with its layout), under canonical dtype names; shared by notebook 03's
lab, notebook 00's explorer, notebook 07's stack and the benchmark."""

import pytest
import torch
import torch.nn as nn

from labsupport.lab import variants as variants_module
from labsupport.errors import LabError
from labsupport.engine.models import layout
from labsupport.weights.fixtures import random_model
from labsupport.engine.precision import cast_model
from labsupport.lab.variants import ModelVariants

pytestmark = pytest.mark.platform    # a torch version or a CPU feature can break these (tests/test_platform_marker.py)


@pytest.fixture()
def model():
    return random_model("tiny-llama")


def test_each_variant_is_built_once_under_its_canonical_name(model, monkeypatch):
    casts = []

    def counting_cast(m, dtype):
        casts.append(dtype)
        return cast_model(m, dtype)

    monkeypatch.setattr(variants_module, "cast_model", counting_cast)
    variants = ModelVariants(model)
    assert variants.get("fp32") is model and variants.get(torch.float32) is model       # no copy of the base
    half = variants.get("bf16")
    assert variants.get("bfloat16") is half and variants.get(torch.bfloat16) is half
    assert variants.get("torch.bfloat16") is half and half.dtype == torch.bfloat16
    assert casts == ["bfloat16"]
    assert variants.names() == ["float32", "bfloat16"]


def test_the_bf16_variant_has_the_layout_cast_model_gives(model, monkeypatch):
    # make the two dtypes prefer different layouts, so that a plain .to(dtype) would keep the wrong one
    monkeypatch.setattr(layout, "preferred_layout",
                        lambda device, dtype, shape=None: "column" if dtype == torch.bfloat16 else "row")
    expected = cast_model(model, "bfloat16")
    half = ModelVariants(model).get("bfloat16")
    linears = [(n, m.weight) for n, m in half.named_modules() if isinstance(m, nn.Linear)]
    assert linears
    for name, weight in linears:
        assert weight.stride() == expected.get_submodule(name).weight.stride(), name
        assert weight.stride() == (1, weight.shape[0]), name                   # column-major (out, in)

    # notebook 00's explorer builds its other precisions the same way (it used to skip the layout)
    from labsupport.explorers.roofline import model_variants
    from_explorer = model_variants(model).get("bfloat16")
    for name, weight in linears:
        assert from_explorer.get_submodule(name).weight.stride() == weight.stride(), name


def test_given_models_are_kept_and_a_missing_one_is_one_sentence(model):
    given = cast_model(model, "float16")
    variants = ModelVariants(models={torch.float16: given})
    assert variants.get("fp16") is given and variants.get("half") is given
    assert variants.names() == ["float16"]
    with pytest.raises(LabError, match="No float32 model was given"):
        variants.get("float32")
    built = ModelVariants(factory=lambda dtype: cast_model(model, dtype))
    assert built.get("bf16") is built.get("bfloat16") and built.get("bf16").dtype == torch.bfloat16


def test_quantized_variants_are_built_once_from_their_precision(model):
    variants = ModelVariants(model)
    int4 = variants.get("fp32", "int4")
    assert variants.get("float32", "int4") is int4 and int4 is not model
    assert sum(variants.handle("fp32", "int4").kernels.values()) > 0       # how many layers each kernel runs
    assert not hasattr(int4, "kernels")                                     # nothing set on the model from outside
    g128 = variants.get("fp32", "int4", group_size=128)
    assert g128 is not int4 and variants.handle("fp32", "int4", group_size=128).group_size == 128
    assert variants.get("fp32", "int8", group_size=128) is variants.get("fp32", "int8")   # int8 takes no group size
    with pytest.raises(LabError, match="Unknown quantization method"):
        variants.get("fp32", "int3")
    with pytest.raises(LabError, match="no quantization handle"):
        variants.handle("fp32", "float")
    assert isinstance(model.blocks[0].mlp.down, nn.Linear)                  # the base model is untouched
    assert variants.names() == ["float32"]                                  # names: the float variants only
