"""Running the app: in the foreground for `python -m labsupport serve`, or in a background
thread for a notebook, the bench and the tests.

Introduced in notebook 09 (serving over HTTP). Both listen on 127.0.0.1 unless told
otherwise: a server on another address is reachable by anyone who can reach the machine,
so that takes an explicit host.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import uvicorn

from ..errors import LabError

LOCALHOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost). Notebook 09 (serving over HTTP)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_server(app, host: str = LOCALHOST, port: int = 8000, log_level: str = "info") -> None:
    """Serve `app` until Ctrl+C (what ``python -m labsupport serve`` runs). Notebook 09 (serving over HTTP)."""
    if not is_loopback(host) and getattr(app.state, "api_key", None) is None:
        print(f"warning: listening on {host} without an API key: anyone who can reach this machine can use "
              "this server (start it with --api-key KEY).", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class BackgroundServer:
    """`app` served by uvicorn in a background thread on a free port of 127.0.0.1 (or `port`).

    Introduced in notebook 09 (serving over HTTP). ``with BackgroundServer(app) as server:``
    starts it (waiting until it accepts connections), gives `server.url`, and stops it at
    the end: uvicorn finishes the requests in flight, then the app's engine thread stops.
    """

    def __init__(self, app, host: str = LOCALHOST, port: int = 0, log_level: str = "warning"):
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
                                                    timeout_graceful_shutdown=10))
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
