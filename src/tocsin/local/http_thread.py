"""A local HTTP server on a thread of its own, stopped without waiting for its poll, with
a listen backlog that takes a burst, and over TLS if given a context.

`socketserver`'s `shutdown()` returns once `serve_forever` next looks at its flag, which it
does between polls of the listening socket, every half second: each local server's stop
(the API of `tocsin serve`, the webhook receiver, the DynamoDB process, a test's peer)
waited that long. Here connections wake the loop until it has seen the flag.
"""

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseServer
from typing import Any

WAKE_EVERY_S = 0.01


class AcceptsTls:
    """A threading socketserver that answers over TLS when given a context (`tls`), each
    handshake in the thread that serves its connection: done in accept, one thread would
    make a burst's handshakes one after another."""

    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()  # type: ignore[misc]
        if self.tls is None:
            return sock, address
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except OSError:  # a client gone, or plain (a stop wakes the loop with one)
                return
        super().finish_request(request, client_address)  # type: ignore[misc]


class LocalServer(AcceptsTls, ThreadingHTTPServer):
    """A stand-in for what is another machine on AWS (a webhook's receiver, an AWS
    endpoint): a thread a request, none waited for at the end. socketserver's listen
    backlog of 5 reset most of 500 connections opened at once (338 of them on two cores),
    as a batch's senders open them when its gate lets go, and their retries seconds later
    were lateness of the stand-in's own making."""

    daemon_threads = True
    request_queue_size = 1024


def whole_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body, or None if its caller went away before sending all it announced
    (a sandbox killed mid-request): such a request is dropped unanswered, as AWS, which
    never receives it whole, never carries it out."""
    length = int(handler.headers.get("content-length", 0))
    body = handler.rfile.read(length)
    if len(body) < length:
        handler.close_connection = True
        return None
    return body


def stop_serving(server: BaseServer, thread: threading.Thread) -> None:
    """Stop `server`'s `serve_forever` on `thread` at once, then close its socket."""
    if thread.is_alive():
        stopping = threading.Thread(target=server.shutdown, name="http-stop", daemon=True)
        stopping.start()
        address = server.server_address[:2]
        while stopping.is_alive():
            with contextlib.suppress(OSError):  # a request without a line: answered by nothing
                socket.create_connection(address, timeout=1).close()  # type: ignore[arg-type]
            stopping.join(WAKE_EVERY_S)
        thread.join()
    server.server_close()


@contextmanager
def serving_in_thread(server: BaseServer, name: str) -> Iterator[BaseServer]:
    """`server` answering on a daemon thread meanwhile; stopped at once afterwards."""
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop_serving(server, thread)
