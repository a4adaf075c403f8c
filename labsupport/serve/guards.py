"""What every request passes before it reaches a route: the API key and the body's size.

Introduced in notebook 09 (serving over HTTP). Both are checked from the request's headers
alone, before a byte of its body is read, so that no client, keyed or not, can make the
server read, parse or tokenize a body it would refuse:

* ``--api-key KEY`` (as vLLM and llama.cpp take it): every route but /health then needs the
  header ``Authorization: Bearer KEY`` (the tokenizer routes, /metrics, /docs and
  /openapi.json too), and answers 401 in one sentence with ``WWW-Authenticate: Bearer``
  without it. /health stays open: load balancers probe it. A key must be printable ASCII,
  since an HTTP header cannot carry anything else.
* A body longer than ``max_body_bytes`` (by its Content-Length) is a 413; a body sent without
  a Content-Length (chunked) is a 411, since its size could not be known before reading it.
"""

from __future__ import annotations

import hmac
import logging

from fastapi.responses import JSONResponse
from starlette.requests import Request

from ..errors import LabError
from ..inputs import whole_number
from .protocol import error_body

OPEN_PATHS = ("/health",)                      # what a load balancer probes: never behind the key
MAX_BODY_BYTES = 2**21                         # 2 MiB: a full context of text is a few hundred KB
LOG = logging.getLogger("uvicorn.error")


def require_api_key(api_key) -> str | None:
    """The key, if it is one a client can send (printable ASCII, no space at its ends), or None;
    else one sentence. Notebook 09 (serving over HTTP)."""
    if api_key is None:
        return None
    if not isinstance(api_key, str) or not api_key.strip():
        raise LabError("The API key must be a non-empty string (or None for no key).")
    if not (api_key.isascii() and api_key.isprintable()) or api_key != api_key.strip():
        raise LabError("The API key must be printable ASCII without spaces at its ends (an HTTP header carries "
                       "nothing else, so no client could send it); choose another.")
    return api_key


def add_guards(app, api_key: str | None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Check the key (when one is set) and the body's size on every request, from its headers
    alone: a 401, 411 or 413 in one sentence, logged. Notebook 09 (serving over HTTP)."""
    api_key = require_api_key(api_key)
    max_body_bytes = whole_number(max_body_bytes, "max_body_bytes (the largest request body accepted)", minimum=1)
    app.state.api_key = api_key
    expected = None if api_key is None else f"Bearer {api_key}".encode()
    app.add_middleware(Guards, expected=expected, max_body_bytes=max_body_bytes)


class Guards:
    """The check as plain ASGI middleware: it reads the headers and either passes the request on
    untouched (its body, and its client's disconnect, reach the route as they would without it)
    or answers it. Notebook 09 (serving over HTTP)."""

    def __init__(self, app, expected: bytes | None, max_body_bytes: int):
        self.app, self.expected, self.max_body_bytes = app, expected, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)                                 # the headers only: no body is read
        refusal = _refusal(request, self.expected, self.max_body_bytes)
        if refusal is None:
            return await self.app(scope, receive, send)
        status, message, code = refusal
        LOG.info("%s %s -> %d: %s", request.method, request.url.path, status, message)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        await JSONResponse(error_body(message, code=code), status_code=status, headers=headers)(scope, receive, send)


def _refusal(request, expected: bytes | None, max_body_bytes: int) -> tuple[int, str, str] | None:
    """(status, sentence, code) for a request refused by its headers, or None."""
    if expected is not None and request.url.path not in OPEN_PATHS:
        given = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, expected):
            return 401, "Invalid or missing API key; send the header 'Authorization: Bearer <key>'.", "invalid_api_key"
    length = request.headers.get("content-length")
    if length is None:
        if "chunked" in request.headers.get("transfer-encoding", "").lower():
            return 411, "Send the request body with a Content-Length header (this server refuses chunked bodies).", \
                "length_required"
        return None
    if not length.isdigit():
        return 400, f"The Content-Length header must be a number of bytes, got {length[:40]!r}.", "invalid_request"
    if int(length) > max_body_bytes:
        return 413, (f"The request body is {int(length)} bytes, past this server's limit of {max_body_bytes}; "
                     "send a shorter one."), "request_too_large"
    return None
