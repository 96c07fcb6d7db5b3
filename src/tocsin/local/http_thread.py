"""A local HTTP server on a thread of its own, stopped without waiting for its poll, with
a listen backlog that takes a burst, and over TLS if given a context.

`socketserver`'s `shutdown()` returns once `serve_forever` next looks at its flag, which it
does between polls of the listening socket, every half second: each local server's stop
(the API of `tocsin serve`, the webhook receiver, the DynamoDB process, a test's peer)
waited that long. Here connections wake the loop until it has seen the flag.
"""

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseServer
from typing import Any

WAKE_EVERY_S = 0.01


# Linux's SO_TIMESTAMPNS (asm-generic; the socket module does not name it): each received
# segment carries the kernel's CLOCK_REALTIME of its arrival, read as ancillary data.
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("qq")


def stamp_arrivals(sock: socket.socket) -> None:
    """Ask the kernel to stamp what this connection receives (where it can)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def first_bytes_ns(sock: socket.socket, wait_s: float) -> int:
    """When the next bytes on `sock` reached this machine, by the kernel's stamp: they are
    peeked, not read (a TLS socket reads them itself), waiting up to `wait_s` for them.
    The time now where no stamp can be had (bytes already read into the TLS layer, no
    stamp asked, a connection closed): a handler's own clock, which counts the wait for
    its thread and the interpreter lock, is what this replaces."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return time.time_ns()
    try:
        if not select.select([sock], [], [], wait_s)[0]:
            return time.time_ns()
        _, ancillary, _, _ = socket.socket.recvmsg(
            sock, 1, socket.CMSG_SPACE(TIMESPEC.size), socket.MSG_PEEK
        )
    except (OSError, ValueError):
        return time.time_ns()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanoseconds = TIMESPEC.unpack(data[: TIMESPEC.size])
            return seconds * 1_000_000_000 + nanoseconds
    return time.time_ns()


class StampsArrivals(BaseHTTPRequestHandler):
    """A handler that knows when each request's first bytes arrived (`arrived_ns`), where
    lateness is measured: not when its thread got to it. Its server stamps connections
    (`LocalServer`). A client that pipelines requests would wait for them here up to
    IDLE_WAIT_S: none of Tocsin's senders does."""

    arrived_ns = 0
    IDLE_WAIT_S = 60.0

    def handle_one_request(self) -> None:
        self.arrived_ns = first_bytes_ns(self.connection, self.IDLE_WAIT_S)
        super().handle_one_request()


class AcceptsTls:
    """A threading socketserver that answers over TLS when given a context (`tls`), each
    handshake in the thread that serves its connection: done in accept, one thread would
    make a burst's handshakes one after another."""

    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()  # type: ignore[misc]
        stamp_arrivals(sock)
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
