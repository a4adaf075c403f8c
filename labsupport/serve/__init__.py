"""An OpenAI-compatible HTTP server over the serving engine, streaming tokens as they come.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport serve``. Read the
modules in this order: protocol (the wire format) -> text (tokens to text, stop strings)
-> engine_loop (the one thread that steps the engine) -> logprobs (log-probabilities, echo,
n: checked and shaped) -> answer (each choice's tokens to a body or a stream) -> app (the
routes; vLLM's tokenizer routes are in tokenizer_api; precision and the API key in
precision) -> server
(uvicorn, in the foreground or a background thread). The load generator that measures it
(and any other OpenAI-compatible server) is `labsupport.lab.http_serving_loadgen`.
"""

import importlib

# Imported on first use (PEP 562): `serve.text` (tokens to text, `generate_text`) needs no web
# framework, so `import labsupport` works where FastAPI is not installed (the GPU check's machine).
_HOMES = {"create_app": ".app", "EngineThread": ".engine_loop", "BackgroundServer": ".server",
          "is_loopback": ".server", "run_server": ".server"}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
