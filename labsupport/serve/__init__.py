"""An OpenAI-compatible HTTP server over the serving engine, streaming tokens as they come.

Introduced in notebook 09 (serving over HTTP); ``python -m labsupport serve``. Read the
modules in this order: protocol (the wire format) -> text (tokens to text, stop strings)
-> engine_loop (the one thread that steps the engine) -> logprobs (log-probabilities, echo,
n: checked and shaped) -> answer (each choice's tokens to a body or a stream) -> app (the
routes; vLLM's tokenizer routes are in tokenizer_api; precision and the API key in
precision) -> server
(uvicorn, in the foreground or a background thread). The load generator that measures it
(and any other OpenAI-compatible server) is `labsupport.lab.loadgen`.
"""

from .app import create_app
from .engine_loop import EngineThread
from .server import BackgroundServer, is_loopback, run_server

__all__ = ["create_app", "EngineThread", "BackgroundServer", "is_loopback", "run_server"]
