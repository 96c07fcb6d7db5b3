"""Webhook target: POST the payload to a public HTTPS URL, signed per Standard Webhooks
(standardwebhooks.com), with an idempotency key.

Before the gate, the host is resolved and checked, the signing secret fetched, the
connection opened (TCP and TLS, to that checked address: TLS still verifies the host name,
and DNS cannot be rebound between check and use) and the request built whole, its
signature for the due second. At the gate only its bytes are written (`tocsin.fire.wire`).
Redirects are not followed: a 3xx is a permanent failure.

An attempt ends by its limit whatever the receiver does: a receiver that trickles its
answer's head, a byte at a time, is cut off when the answer's time is up, as one that
says nothing is. The HTTPS connections of an executor share one TLS context (a context of
their own cost each task its certificates).
"""

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import ssl
import threading
from functools import cache
from typing import Any
from urllib.parse import SplitResult, urlsplit

from aws_lambda_powertools.utilities.parameters import SecretsProvider
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError
from pydantic import Field, PrivateAttr, field_validator

from tocsin import aws, clock
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.fire import wire
from tocsin.retry import rate_limit_reset_s, retry_after_s
from tocsin.settings import WEBHOOK_CONNECT_TRIES, settings
from tocsin.targets import address_guard
from tocsin.targets.base import Delivery, Target

SECRET_PREFIX = "whsec_"
_RESERVED_HEADERS = {"host", "content-length", "content-type", "idempotency-key", "connection"}
_RESERVED_PREFIXES = ("tocsin-", "webhook-")
# Tried again: a timeout, too early, throttled, or the receiver's fault (5xx).
_RETRIED_STATUSES = frozenset({408, 425, 429, *range(500, 600)})
# A receiver that answers with this header (any value) is not tried again: the task fails.
NO_RETRY_HEADER = b"tocsin-no-retry"
# A receiver takes a signature up to 5 minutes old (the Standard Webhooks verifier's fixed
# tolerance): one for a due second more than this far past is made for now instead.
SIGNATURE_FRESH_S = 60


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


def _secrets() -> SecretsProvider:
    """The provider of this process's client (a fresh client, after `aws.forget_clients`,
    has a provider of its own, and its cache)."""
    return _provider(aws.client("secretsmanager"))


@cache
def _provider(client: Any) -> SecretsProvider:
    return SecretsProvider(boto3_client=client)


_reading_keys = threading.Lock()


def _signing_keys() -> list[bytes]:
    """The signing keys, cached for five minutes so a rotation is picked up without a
    redeploy: read by one send at a time (a batch's sends prepare side by side, and each
    read the secret at once when its cache was empty). A read that fails is transient:
    the task is tried again, never failed for good for it."""
    arn = settings().webhook_secret_arn
    if not arn:
        return []
    try:
        with _reading_keys:
            secret = _secrets().get(arn, max_age=300)
    except GetParameterError as error:
        raise TransientTargetError("the webhook signing secret could not be read") from error
    return signing_keys(str(secret))


class WebhookTarget(Target):
    own_services = ("secretsmanager",)
    url: str = Field(max_length=2048)
    headers: dict[str, str] = Field(default_factory=dict, max_length=20)
    _address: str | None = PrivateAttr(default=None)
    _keys: list[bytes] | None = PrivateAttr(default=None)  # a factory costs pydantic a signature
    _connection: wire.Connection | None = PrivateAttr(default=None)

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

    @property
    def host_key(self) -> str:
        return urlsplit(self.url).netloc.lower()

    def prepare(self) -> None:
        """Resolve and check the host, fetch the signing keys and connect (TCP and TLS)."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._address = address_guard.resolve(
            parts.hostname or "", port, allow_internal=_is_allowed(parts)
        )
        self._keys = _signing_keys()
        with contextlib.suppress(TransientTargetError):  # failing, the send connects again
            self._connect()

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        """The request built whole now, then written at its turn (its gate): on the
        connection opened ahead, or on a new one if that failed or the receiver closed it
        meanwhile, WEBHOOK_CONNECT_TRIES connections at most an attempt. A connection that
        cannot be had fails the attempt at its turn, never before its due time."""
        if self._address is None:
            self.prepare()
        headers = self._headers(delivery, turn.fires_ms)
        for tries in range(1, WEBHOOK_CONNECT_TRIES + 1):
            last = tries == WEBHOOK_CONNECT_TRIES
            try:
                connection = self._connection or self._connect()
            except TransientTargetError:
                if not last:
                    continue
                turn.at_gate()
                raise
            self._connection = None  # one request a connection: its answer's body goes unread
            head, body = connection.request("POST", _path(self.url), headers, delivery.payload_json)
            timeout_s = settings().webhook_timeout_s
            sent = turn.send(wire.Sent(connection, head, body, 0, timeout_s, whole_answer=False))
            connection.close()
            if not sent.dropped or last:
                break
        return {"status": _status(sent)}

    def _headers(self, delivery: Delivery, fires_ms: int) -> list[tuple[str, str]]:
        """Every header but Host, signed for the second it is due in (a receiver accepts
        minutes of skew), or for now when that second is past by more than
        SIGNATURE_FRESH_S (a retry, or a late gate)."""
        body = delivery.payload_json
        headers = [
            *self.headers.items(),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", delivery.idempotency_key),
            ("Tocsin-Task-Id", delivery.task_id),
            ("Tocsin-Task-Version", str(delivery.version)),
            ("Tocsin-Attempt", str(delivery.attempt)),
        ]
        if self._keys:
            now_ms = clock.now_ms()
            fresh = now_ms - fires_ms <= SIGNATURE_FRESH_S * 1000
            timestamp_s = (fires_ms if fresh else now_ms) // 1000
            signed = signature_headers(self._keys, delivery.idempotency_key, timestamp_s, body)
            headers += signed.items()
        return headers

    def _connect(self) -> wire.Connection:
        """A connection to the checked address, kept for the send. A certificate that does
        not verify fails the task for good; any other failure is transient."""
        parts = urlsplit(self.url)
        tls = _tls_context(os.environ.get("SSL_CERT_FILE")) if parts.scheme == "https" else None
        address = (self._address or "", parts.port or (443 if tls else 80))
        timeout_s = min(aws.CONNECT_TIMEOUT_S, settings().webhook_timeout_s)
        try:
            self._connection = wire.Connection.open(
                address, parts.netloc, timeout_s, tls, parts.hostname
            )
        except ssl.SSLCertVerificationError as error:
            raise PermanentTargetError(f"webhook TLS failed: {error}") from error
        except OSError as error:
            raise TransientTargetError(f"webhook request failed: {_failure(error)}") from error
        return self._connection


def _path(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def _status(sent: wire.Sent) -> int:
    """The answer's status, or the failure it met: a 3xx (a redirect, not followed),
    another 4xx, or an answer that says not to retry (NO_RETRY_HEADER) fails the task for
    good; a status in _RETRIED_STATUSES, a failed connection and no answer in time are
    transient, tried again when `Retry-After` (or a 429's `X-RateLimit-Reset`) says."""
    if sent.answer is None:
        failure = sent.failure or "the connection closed while it waited"
        raise TransientTargetError(f"webhook request failed: {failure}")
    status, headers = sent.answer.status, dict(sent.answer.headers)
    if 200 <= status < 300:
        return status
    if NO_RETRY_HEADER in headers:
        raise PermanentTargetError(f"webhook answered {status}, and not to retry")
    if status not in _RETRIED_STATUSES:
        raise PermanentTargetError(f"webhook answered {status}")
    now_ms = clock.now_ms()
    after_s = None
    if b"retry-after" in headers:
        after_s = retry_after_s(headers[b"retry-after"].decode("latin-1"), now_ms)
    if after_s is None and status == 429 and b"x-ratelimit-reset" in headers:
        after_s = rate_limit_reset_s(headers[b"x-ratelimit-reset"].decode("latin-1"), now_ms)
    throttled = status == 429 or (status == 503 and after_s is not None)
    raise TransientTargetError(f"webhook answered {status}", after_s, throttled)


@cache
def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context every HTTPS webhook shares (one per CA bundle: tests name theirs)."""
    return ssl.create_default_context(cafile=ca_file)


def _failure(error: Exception) -> str:
    """What went wrong, by the error's name (a reset, a refusal, a timeout): never its
    message, which can hold the target's address."""
    return type(error).__name__
