"""Webhook target: POST the payload to a public HTTPS URL, signed per Standard Webhooks
(standardwebhooks.com), with an idempotency key.

The host is resolved and checked, the signing secret fetched and the connection opened
(TCP and TLS) before the gate, so only the request itself follows the gate. The
connection goes to that checked address (TLS still verifies the host name), so DNS cannot
be rebound between check and use.
Redirects are not followed: a 3xx is a permanent failure.

An attempt ends by its limit whatever the receiver does: a read timeout starts again with
every byte, so a receiver that trickled its answer's head held an attempt as long as it
liked; at the limit, the watchdog shuts the connection's socket (one thread watches every
request in flight). The HTTPS connections of an executor share one TLS context (a context
of their own cost each task its certificates).
"""

import base64
import binascii
import contextlib
import hashlib
import heapq
import hmac
import itertools
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import SplitResult, urlsplit

import urllib3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from pydantic import Field, PrivateAttr, field_validator
from urllib3.util.wait import wait_for_read

from tocsin import aws, clock
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.settings import WEBHOOK_CONNECT_TRIES, settings
from tocsin.targets import address_guard
from tocsin.targets.base import Delivery, Target

SECRET_PREFIX = "whsec_"
_RESERVED_HEADERS = {"host", "content-length", "content-type", "idempotency-key", "connection"}
_RESERVED_PREFIXES = ("tocsin-", "webhook-")
_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


def signing_keys(secret: str) -> list[bytes]:
    """The HMAC keys in the signing secret: a `whsec_<base64>` value (the prefix may be left
    out), or several separated by spaces while a rotation is under way."""
    keys = []
    for value in secret.split():
        text = value.removeprefix(SECRET_PREFIX)
        try:
            keys.append(base64.b64decode(text + "=" * (-len(text) % 4), validate=True))
        except binascii.Error:
            raise PermanentTargetError("the webhook signing secret is not whsec_<base64>") from None
    return keys


def signature_headers(
    keys: list[bytes], message_id: str, timestamp_s: int, body: bytes
) -> dict[str, str]:
    """Standard Webhooks headers: the HMAC-SHA256 of `<id>.<timestamp>.<body>` under each key,
    so a receiver that knows any one of them verifies (rotation without a gap)."""
    prefix = f"{message_id}.{timestamp_s}.".encode()
    signatures = (_signature(key, prefix, body) for key in keys)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": " ".join(f"v1,{base64.b64encode(s).decode()}" for s in signatures),
    }


def _signature(key: bytes, prefix: bytes, body: bytes) -> bytes:
    """The HMAC of the prefix and body, without a copy of the body joined to it."""
    digest = hmac.new(key, prefix, hashlib.sha256)
    digest.update(body)
    return digest.digest()


def _is_allowed(parts: SplitResult) -> bool:
    """Hosts the operator allows explicitly (by name, or name:port) skip the address checks."""
    host = (parts.hostname or "").lower()
    allowed = settings().webhook_allowed_hosts
    return host in allowed or f"{host}:{parts.port}" in allowed


@cache
def _secrets() -> SecretsProvider:
    return SecretsProvider(boto3_client=aws.target_client("secretsmanager"))


def _signing_keys() -> list[bytes]:
    """The signing keys, cached for five minutes so a rotation is picked up without a redeploy."""
    arn = settings().webhook_secret_arn
    return signing_keys(str(_secrets().get(arn, max_age=300))) if arn else []


class WebhookTarget(Target):
    aws_services = ("secretsmanager",)
    url: str = Field(max_length=2048)
    headers: dict[str, str] = Field(default_factory=dict, max_length=20)
    _address: str | None = PrivateAttr(default=None)
    _keys: list[bytes] | None = PrivateAttr(default=None)  # a factory costs pydantic a signature
    _pool: urllib3.HTTPConnectionPool | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _public_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials")
        literal = address_guard.literal_address(parts.hostname)
        if literal is None and (problem := address_guard.dns_name_problem(parts.hostname)):
            raise ValueError(f"its host {problem}")
        if _is_allowed(parts):
            return url
        if parts.hostname == "localhost" or (literal and not address_guard.is_public(literal)):
            raise ValueError("must not point at an internal address unless its host is allowed")
        if parts.scheme != "https":
            raise ValueError("must use https")
        return url

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            lowered = name.lower()
            if not name.replace("-", "").isalnum() or len(name) > 64:
                raise ValueError(f"header name {name!r} is not a plain token")
            if lowered in _RESERVED_HEADERS or lowered.startswith(_RESERVED_PREFIXES):
                raise ValueError(f"header {name!r} is set by Tocsin")
            if "\r" in value or "\n" in value or len(value) > 1024:
                raise ValueError(f"header {name!r} has a line break or is too long")
        return headers

    @property
    def attempt_limit_s(self) -> float:
        return settings().webhook_attempt_limit_s

    def prepare(self) -> None:
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._address = address_guard.resolve(
            parts.hostname or "", port, allow_internal=_is_allowed(parts)
        )
        self._keys = _signing_keys()
        self._pool = self._connection_pool(parts)
        _open_ahead(self._pool)

    def send(self, delivery: Delivery) -> dict[str, Any]:
        parts = urlsplit(self.url)
        if self._pool is None:
            self.prepare()
        elif self._pool.pool is None:  # closed by the last attempt's send: the same address
            self._pool = self._connection_pool(parts)
        body = delivery.payload_json
        headers = {
            **self.headers,
            "Host": parts.netloc,
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.idempotency_key,
            "Tocsin-Task-Id": delivery.task_id,
            "Tocsin-Task-Version": str(delivery.version),
        }
        if self._keys:
            timestamp_s = clock.now_ms() // 1000
            headers |= signature_headers(self._keys, delivery.idempotency_key, timestamp_s, body)
        status = self._post(parts, body, headers)
        return {"status": status}

    def _connection_pool(self, parts: SplitResult) -> urllib3.HTTPConnectionPool:
        """One connection, to the checked address."""
        timeout = settings().webhook_timeout_s
        common: dict[str, Any] = {
            "port": parts.port,
            "timeout": urllib3.Timeout(connect=min(aws.CONNECT_TIMEOUT_S, timeout), read=timeout),
            "maxsize": 1,
        }
        if parts.scheme == "https":
            host = parts.hostname or ""
            return _WatchedHTTPSPool(
                self._address,
                server_hostname=host,
                assert_hostname=host,
                ssl_context=_tls_context(os.environ.get("SSL_CERT_FILE")),
                **common,
            )
        return _WatchedHTTPPool(self._address, **common)

    def _post(self, parts: SplitResult, body: bytes, headers: dict[str, str]) -> int:
        pool = self._pool
        assert pool is not None  # made by prepare()
        # Only a connection that failed is tried again here: nothing was sent. A status
        # or a timeout after the request went out is the executor's to retry, after a
        # backoff and within its time (`attempt_limit_s`).
        retries = urllib3.Retry(
            total=WEBHOOK_CONNECT_TRIES - 1,
            connect=WEBHOOK_CONNECT_TRIES - 1,
            read=0,
            status=0,
            other=0,
        )
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        request = WATCHDOG.watch(pool, self.attempt_limit_s)
        shut = request.shut
        try:
            with pool:  # the body is not read: a receiver that trickles it holds no attempt
                response = pool.urlopen(
                    "POST",
                    path,
                    body=body,
                    headers=headers,
                    retries=retries,
                    redirect=False,
                    preload_content=False,
                )
                response.close()
        except urllib3.exceptions.HTTPError as error:
            _within_limit(shut, self.attempt_limit_s)
            reason = getattr(error, "reason", error)
            # A certificate that does not verify will not verify on a retry either.
            if isinstance(reason, urllib3.exceptions.SSLError):
                raise PermanentTargetError(f"webhook TLS failed: {reason}") from error
            raise TransientTargetError(f"webhook request failed: {_failure(error)}") from error
        finally:
            WATCHDOG.release(request)
        _within_limit(shut, self.attempt_limit_s)  # a head cut short may still parse
        if response.status in _RETRIED_STATUSES:
            raise TransientTargetError(f"webhook answered {response.status}")
        if not 200 <= response.status < 300:
            raise PermanentTargetError(f"webhook answered {response.status}")
        return int(response.status)


@cache
def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context every HTTPS webhook shares (one per CA bundle: tests name theirs)."""
    return ssl.create_default_context(cafile=ca_file)


class _Watched:
    """A connection pool that keeps the connections it made, for the watchdog (`_shut`)."""

    def _new_conn(self) -> Any:
        connection = super()._new_conn()  # type: ignore[misc]
        self.__dict__.setdefault("made", []).append(connection)
        return connection


class _WatchedHTTPPool(_Watched, urllib3.HTTPConnectionPool):
    pass


class _WatchedHTTPSPool(_Watched, urllib3.HTTPSConnectionPool):
    pass


@dataclass(order=True)
class _InFlight:
    """A request in flight: its pool's sockets are shut at `deadline` unless released."""

    deadline: float
    order: int
    pool: urllib3.HTTPConnectionPool = field(compare=False)
    shut: threading.Event = field(compare=False, default_factory=threading.Event)
    released: bool = field(compare=False, default=False)


class _Watchdog:
    """One thread that shuts each request in flight at its limit. A timer thread a
    request, started and cancelled around each send, cost four times the request's own
    CPU after the gate, where 500 sends share a seventh of a core (0.9 ms a send without,
    3 to 5 ms with, measured side by side)."""

    def __init__(self) -> None:
        self._in_flight: list[_InFlight] = []  # a heap, earliest deadline first
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, pool: urllib3.HTTPConnectionPool, limit_s: float) -> _InFlight:
        request = _InFlight(time.monotonic() + limit_s, next(self._order), pool)
        with self._changed:
            heapq.heappush(self._in_flight, request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
            if self._in_flight[0] is request:  # sooner than the one it waits for
                self._changed.notify()
        return request

    def release(self, request: _InFlight) -> None:
        """The request ended: no shut begins after this (one begun is seen by `shut`)."""
        with self._changed:
            request.released = True

    def _run(self) -> None:
        while True:
            with self._changed:
                due = self._next_due()
                if due.released:
                    continue
                due.shut.set()
            _shut(due.pool)

    def _next_due(self) -> _InFlight:
        """The earliest request, once its deadline has come (called holding the condition)."""
        while True:
            now = time.monotonic()
            if self._in_flight and self._in_flight[0].deadline <= now:
                return heapq.heappop(self._in_flight)
            self._changed.wait(self._in_flight[0].deadline - now if self._in_flight else None)


WATCHDOG = _Watchdog()


def _shut(pool: urllib3.HTTPConnectionPool) -> None:
    """Shut the sockets of the pool's connections, so the request in flight ends now (its
    reads fail; the receiver sees the connection close)."""
    for connection in pool.__dict__.get("made", []):
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)


def _within_limit(shut: threading.Event, limit_s: float) -> None:
    """Raise if the watchdog shut the request: whatever came back, it came too late."""
    if shut.is_set():
        raise TransientTargetError(f"webhook request ran past {limit_s:g} s")


def _failure(error: Exception) -> str:
    """What went wrong, by the names of the error and of its cause (a reset, a close, a
    timeout): never their messages, which can hold the target's URL and its query."""
    causes = [getattr(error, "reason", None), *error.args]
    cause = next((c for c in causes if isinstance(c, BaseException) and c is not error), None)
    return type(error).__name__ + (f" ({type(cause).__name__})" if cause else "")


def _open_ahead(pool: urllib3.HTTPConnectionPool) -> None:
    """Connect now, before the gate. If it fails, or the server drops the idle connection
    meanwhile, urllib3 connects again at the send, which reports any error then."""
    connection = pool._get_conn()
    try:
        connection.connect()
        _read_session_tickets(connection.sock)
    except Exception:  # a refused socket, a bad certificate: the send meets it again
        connection.close()
    pool._put_conn(connection)


def _read_session_tickets(sock: Any, wait_s: float = 0.05) -> None:
    """A TLS 1.3 server sends session tickets just after the handshake. Left unread, they
    make the idle connection look dropped to urllib3, which would connect again after the
    gate; read them now (they carry no application data)."""
    if not isinstance(sock, ssl.SSLSocket):
        return
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while wait_for_read(sock, timeout=wait_s):
            try:
                if not sock.recv(4096):
                    return  # closed: urllib3 will see it and connect again
            except ssl.SSLWantReadError:
                continue
    finally:
        sock.settimeout(timeout)
