"""A local HTTP server on a thread of its own, stopped without waiting for its poll, and
with a listen backlog that takes a burst.

`socketserver`'s `shutdown()` returns once `serve_forever` next looks at its flag, which it
does between polls of the listening socket, every half second: each local server's stop
(the API of `tocsin serve`, the webhook receiver, the DynamoDB process, a test's peer)
waited that long. Here connections wake the loop until it has seen the flag.
"""

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from socketserver import BaseServer

WAKE_EVERY_S = 0.01


class LocalServer(ThreadingHTTPServer):
    """A stand-in for what is another machine on AWS (a webhook's receiver, an AWS
    endpoint): a thread a request, none waited for at the end. socketserver's listen
    backlog of 5 reset most of 500 connections opened at once (338 of them on two cores),
    as a batch's senders open them when its gate lets go, and their retries seconds later
    were lateness of the stand-in's own making."""

    daemon_threads = True
    request_queue_size = 1024


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
