"""Shared fixtures.

The tiny random-weight models (`labsupport.weights.fixtures.random_model`: the presets
"tiny-llama" and "tiny-gpt2", seed 0, built in milliseconds) come from these fixtures:
`tiny_llama`, `tiny_gpt2`, `tiny_model` (both presets, parametrised), `tiny_model_f64` (both in
float64) and `fresh_tiny_llama` (a new one for each test). The shared ones are built
once per test module; a test that changes a model in place (quantizes it, swaps its
layers) takes `fresh_tiny_llama`. A test about seeds, dtypes or devices calls
`random_model` itself.

The embedded model is loaded once per session (about 3 s once its converted
weights are cached; the first run ever converts them, about 20 s).
"""

import contextlib
import logging
import re

import pytest
import torch

try:   # the property-based passes (tests/test_properties_*.py); not on the lent GPU machine
    from hypothesis import settings as _hypothesis_settings
except ImportError:
    _hypothesis_settings = None
else:
    # hypothesis's default budget (100 examples a test), with no per-example deadline (a first call
    # may build a model or a kernel) and no example database written into the working tree
    _hypothesis_settings.register_profile("course", deadline=None, database=None)
    _hypothesis_settings.load_profile("course")

# test ids are the preset names; never "gpu" (a test whose keywords hold it is skipped without CUDA)
TINY_PRESETS = ("tiny-llama", "tiny-gpt2")


# Packages only the notebooks and the serving code need. The lent GPU machine has none of them
# (README, "On a GPU"), so there `pytest -m gpu tests` meets test modules that cannot import;
# when only gpu-marked tests are selected, such a module is reported as skipped instead of
# stopping the run with a collection error. Anywhere else a missing package stays an error.
NOTEBOOK_ONLY = ("plotly", "ipywidgets", "anywidget", "nbformat", "nbval", "nbclient", "fastapi", "uvicorn",
                 "gguf", "bitsandbytes", "openai", "playwright", "hypothesis")


def _missing_notebook_package(report) -> str | None:
    match = re.search(r"No module named '([\w.]+)'", str(report.longrepr))
    name = match and match.group(1).split(".")[0]
    return name if name in NOTEBOOK_ONLY else None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.failed and isinstance(collector, pytest.Module) and "gpu" in (collector.config.option.markexpr or ""):
        missing = _missing_notebook_package(report)
        if missing:
            report.outcome = "skipped"
            report.longrepr = (str(collector.path), None, f"Skipped: {missing} is not installed (notebook-only)")
    return report


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
    from labsupport.weights.loading import load_model
    return load_model("smollm2-135m", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm_hf():
    """The Hugging Face model with the same weights."""
    from labsupport.weights.loading import load_hf_model
    return load_hf_model("smollm2-135m", device="cpu", dtype=torch.float32)


def _tiny(name: str, dtype=torch.float32):
    from labsupport.weights.fixtures import random_model
    return random_model(name, seed=0, dtype=dtype)


@pytest.fixture(scope="module")
def tiny_llama():
    """The "tiny-llama" preset (2 layers, hidden 64, 4 query / 2 key-value heads, vocabulary
    260, context 256) with seeded random weights (seed 0), float32 on the CPU.

    Module scope: the tests of one module share it, so they must not change it."""
    return _tiny("tiny-llama")


@pytest.fixture(scope="module")
def tiny_gpt2():
    """The "tiny-gpt2" preset (learned positions, LayerNorm, GELU; 2 layers, hidden 64,
    vocabulary 260) with seeded random weights (seed 0), float32 on the CPU.

    Module scope: the tests of one module share it, so they must not change it."""
    return _tiny("tiny-gpt2")


@pytest.fixture(scope="module", params=TINY_PRESETS)
def tiny_model(request):
    """Each tiny preset in turn ("tiny-llama", then "tiny-gpt2": the test ids), seed 0,
    float32 on the CPU, for tests that must hold for both families.

    Module scope: shared by the tests of one module, never to be changed."""
    return _tiny(request.param)


@pytest.fixture(scope="module", params=TINY_PRESETS)
def tiny_model_f64(request):
    """Each tiny preset in turn, seed 0, in float64: there batching cannot flip an argmax
    by rounding, so token equality between batched and lone runs is exact (the serving
    tests). Module scope: shared, never to be changed."""
    return _tiny(request.param, torch.float64)


@pytest.fixture
def fresh_tiny_llama():
    """A new "tiny-llama" (seed 0, float32, CPU) for each test (function scope): for a
    test that changes the model in place, even when it undoes the change."""
    return _tiny("tiny-llama")


@pytest.fixture
def guard_writes(monkeypatch):
    """Every paged write fails if it touches a block the prefix cache holds; append each engine
    to watch to the list this yields (tests/serving_reference.py: `watch_shared_writes`)."""
    from serving_reference import watch_shared_writes
    return watch_shared_writes(monkeypatch)


class _Captured(logging.Handler):
    """Every record logged while a test runs, and its message as text."""
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records, self.lines = [], []

    def emit(self, record):
        self.records.append(record)
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _server_log(level):
    """uvicorn's error log (where the server's refusals, cut requests and warnings go) at `level`."""
    logger, handler = logging.getLogger("uvicorn.error"), _Captured()
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


@pytest.fixture
def log_lines():
    """The lines the server logs at INFO and above during a test."""
    with _server_log(logging.INFO) as handler:
        yield handler.lines


@pytest.fixture
def log_records():
    """The records the server logs during a test (with their levels), DEBUG and above."""
    with _server_log(logging.DEBUG) as handler:
        yield handler.records
