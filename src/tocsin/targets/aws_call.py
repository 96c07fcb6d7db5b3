"""An AWS target's call, made whole before its gate and written at it by the wire.

botocore serializes the call, signs it (SigV4) and parses its answer, as for any call of a
client: the call runs in the thread that sends it, ahead of its gate, until botocore would
put it on a connection of its own. There a `before-send` handler (botocore's hook for
answering a request without sending it, which botocore's Stubber and moto use) hands the
request's bytes to the wire (`tocsin.fire.wire`) on a connection to the endpoint opened
ahead, with its TLS handshake done, and gives botocore the answer, which botocore parses
and raises from as usual. A SigV4 signature holds for five minutes: far longer than a
call waits for its gate. A call made outside a turn (`through`) is sent by botocore.
"""

import contextlib
import os
import ssl
import threading
from collections.abc import Iterator
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from botocore.httpsession import get_cert_path

from tocsin import aws
from tocsin.fire import wire
from tocsin.settings import CONNECT_TIMEOUT_S

_turns = threading.local()  # the turn of the call this thread makes, while it makes it


@contextlib.contextmanager
def through(turn: wire.Turn) -> Iterator[None]:
    """While open, this thread's target calls go through `turn` and the wire."""
    _turns.turn = turn
    try:
        yield
    finally:
        _turns.turn = None


def send_on_the_wire(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
    """botocore's `before-send`: a request made in a turn, written by the wire; its answer."""
    turn = getattr(_turns, "turn", None)
    if turn is None:
        return None
    parts = urlsplit(request.url)
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    headers = [(k, v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()]
    body = request.body or b""
    body = body.encode() if isinstance(body, str) else bytes(body)
    for fresh in (False, True):  # a connection dropped while it waited: once more, a new one
        connection = POOL.take(parts) if not fresh else POOL.opened(parts)
        head, body_bytes = connection.request(request.method, target, headers, body)
        answer_within_s = aws.target_read_timeout_s()
        sent = turn.send(wire.Sent(connection, head, body_bytes, 0, answer_within_s))
        if not sent.dropped:
            break
        connection.close()
    if sent.stopped is not None:
        raise sent.stopped
    if sent.timed_out:
        raise ReadTimeoutError(endpoint_url=request.url)
    if sent.answer is None:
        raise ConnectionClosedError(endpoint_url=request.url)
    if connection.reusable():
        POOL.put(parts, connection.again())
    else:
        connection.close()
    return AWSResponse(
        request.url, sent.answer.status, _headers(sent.answer), _Raw(sent.answer.body)
    )


def _headers(answer: wire.Answer) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in answer.headers}


class _Raw:
    """An answer's body, as botocore reads an AWSResponse's raw stream."""

    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class Pool:
    """Connections to the AWS endpoints, kept open between calls."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[wire.Connection]] = {}
        self._lock = threading.Lock()

    def take(self, parts: Any) -> wire.Connection:
        key = _address(parts)
        with self._lock:
            idle = self._idle.get(key, [])
            while idle:
                connection = idle.pop()
                if not connection.dropped():
                    return connection
                connection.close()
        return self.opened(parts)

    def opened(self, parts: Any) -> wire.Connection:
        try:
            tls = _tls() if parts.scheme == "https" else None
            return wire.Connection.open(
                _address(parts), parts.netloc, CONNECT_TIMEOUT_S, tls, parts.hostname
            )
        except OSError as error:
            raise EndpointConnectionError(endpoint_url=parts.geturl(), error=error) from error

    def put(self, parts: Any, connection: wire.Connection) -> None:
        with self._lock:
            self._idle.setdefault(_address(parts), []).append(connection)


def _address(parts: Any) -> tuple[str, int]:
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


@cache
def _tls() -> ssl.SSLContext:
    """As botocore verifies: AWS_CA_BUNDLE if set, else its own bundle."""
    return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))


POOL = Pool()
