"""Running the app: in the foreground for `python -m labsupport serve`, or in a background
thread for a notebook, the bench and the tests.

Introduced in notebook 09 (serving over HTTP). Both listen on 127.0.0.1 unless told
otherwise: a server on another address is reachable by anyone who can reach the machine,
so that takes an explicit host.

Both also bound what one client's connections can hold: a connection must send a whole request
head within `HEAD_TIMEOUT_S` of opening (or of its last response), else it is closed (uvicorn
itself waits forever: slowloris); an idle kept-alive connection closes after
`KEEP_ALIVE_S`; past `MAX_CONNECTIONS` connections or requests at once, a request gets a 503.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import logging

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS
from uvicorn.importer import import_from_string

from ..errors import LabError
from ..inputs import finite_number

LOCALHOST = "127.0.0.1"
HEAD_TIMEOUT_S = 10.0          # to send a whole request head
KEEP_ALIVE_S = 5.0             # an idle kept-alive connection (uvicorn's default)
MAX_CONNECTIONS = 256          # connections or requests at once; a 503 past it
LOG = logging.getLogger("uvicorn.error")


class HeadDeadline:
    """Mixed into uvicorn's HTTP protocol: a connection that has not sent a whole request head
    `head_timeout` seconds after it opened, or after its last response, is closed. `cycle` is what
    uvicorn makes once a head is complete, so an unchanged one means none came. Notebook 09 (serving over HTTP)."""

    head_timeout = HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        handle = getattr(self, "_head_deadline", None)
        if handle is not None:
            handle.cancel()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        handle = getattr(self, "_head_deadline", None)
        if handle is not None:
            handle.cancel()
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_too_slow, self.cycle)

    def _head_too_slow(self, cycle_then) -> None:
        if self.cycle is cycle_then and not self.transport.is_closing():
            LOG.info("Closed a connection from %s: no whole request head within %.0f s.",
                     "%s:%d" % self.client if self.client else "a client", self.head_timeout)
            self.transport.close()


def guarded_protocol(head_timeout: float = HEAD_TIMEOUT_S) -> type:
    """uvicorn's own HTTP protocol (httptools where installed, else h11) with `HeadDeadline`.
    Notebook 09 (serving over HTTP)."""
    base = import_from_string(HTTP_PROTOCOLS["auto"])
    return type(f"HeadDeadline{base.__name__}", (HeadDeadline, base), {"head_timeout": head_timeout})


def _limits(head_timeout: float = HEAD_TIMEOUT_S) -> dict:
    """uvicorn's settings that bound what one client's connections can hold."""
    return {"http": guarded_protocol(head_timeout), "timeout_keep_alive": KEEP_ALIVE_S,
            "limit_concurrency": MAX_CONNECTIONS}


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost). Notebook 09 (serving over HTTP)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_server(app, host: str = LOCALHOST, port: int = 8000, log_level: str = "info") -> None:
    """Serve `app` until Ctrl+C (what ``python -m labsupport serve`` runs): uvicorn in a thread, and
    the engine's loop in this one, the thread that loaded the model (`EngineThread.run_here` says
    why). Notebook 09 (serving over HTTP)."""
    if not is_loopback(host) and getattr(app.state, "api_key", None) is None:
        print(f"warning: listening on {host} without an API key: anyone who can reach this machine can use "
              "this server (start it with --api-key KEY).", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, **_limits()))
    engine = getattr(app.state, "engine_thread", None)
    if engine is None:
        server.run()
        return
    engine.leave_to_caller()                 # the engine steps here, in the thread that loaded the model

    def serve_then_stop_the_engine():
        try:
            server.run()
        finally:                             # uvicorn ended (or could not start): so does the engine's loop
            engine.stop()
    web = threading.Thread(target=serve_then_stop_the_engine, name="labsupport-http", daemon=True)
    web.start()
    try:
        engine.run_here()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        web.join(30)


class BackgroundServer:
    """`app` served by uvicorn in a background thread on a free port of 127.0.0.1 (or `port`).

    Introduced in notebook 09 (serving over HTTP). ``with BackgroundServer(app) as server:``
    starts it (waiting until it accepts connections), gives `server.url`, and stops it at
    the end: uvicorn finishes the requests in flight, then the app's engine thread stops.
    head_timeout: seconds a connection has to send a whole request head (`HeadDeadline`).
    """

    def __init__(self, app, host: str = LOCALHOST, port: int = 0, log_level: str = "warning",
                 head_timeout: float = HEAD_TIMEOUT_S):
        head_timeout = finite_number(head_timeout, "head_timeout (seconds)", minimum=0, above_minimum=True)
        if not is_loopback(host):
            raise LabError(f"A background server listens on this machine only; got host {host!r}. Use "
                           "`python -m labsupport serve --host ...` to serve other machines.")
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as error:
            self.socket.close()
            raise LabError(f"Cannot listen on {host}:{port} ({error.strerror}); choose another port.") from None
        self.host, self.port = host, self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on",
                                                    timeout_graceful_shutdown=10, **_limits(head_timeout)))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="labsupport-http", daemon=True)

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:54321 (OpenAI clients take url + "/v1")."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise LabError(f"The server did not start within {timeout:.0f} s on {self.url}.")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.socket.close()
        if self.thread.is_alive():
            raise LabError(f"The server on {self.url} did not stop within {timeout:.0f} s.")

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
