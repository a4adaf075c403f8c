"""Shared fixtures. The embedded model is loaded once per session (about 3 s once
its converted weights are cached; the first run ever converts them, about 20 s)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm():
    """labsupport's model and tokenizer for the embedded SmolLM2-135M-Instruct (fp32, CPU)."""
    from labsupport.models.loading import load_model
    return load_model("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm_hf():
    """The Hugging Face model with the same weights."""
    from labsupport.models.loading import load_hf_model
    return load_hf_model("smollm2-135m", device="cpu", dtype=torch.float32)
