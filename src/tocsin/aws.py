"""boto3 clients made once per process, with botocore's retry modes rather than our own loops."""

import threading
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

_lock = threading.Lock()


@cache
def _cached(service: str, kind: str, retry_mode: str, max_attempts: int) -> Any:
    config = Config(
        retries={"mode": retry_mode, "max_attempts": max_attempts},
        max_pool_connections=64,
    )
    factory = boto3.resource if kind == "resource" else boto3.client
    made = factory(service, config=config)
    # botocore builds a client's exception classes on first use, unlocked: two threads there
    # at once can get different classes, and `except client.exceptions.X` then misses the X
    # the client raises. Build them now, under the caller's lock.
    (made.meta.client if kind == "resource" else made).exceptions  # noqa: B018
    return made


def client(service: str, retry_mode: str = "standard", max_attempts: int = 5) -> Any:
    """A shared client with botocore's retries in `retry_mode`, `max_attempts` after the first."""
    with _lock:  # boto3's session is not safe to create clients from in parallel
        return _cached(service, "client", retry_mode, max_attempts)


def resource(service: str) -> Any:
    with _lock:
        return _cached(service, "resource", "standard", 5)


def forget_clients() -> None:
    """Drop cached clients (the embedded runtime starts a fresh set of mocked services)."""
    _cached.cache_clear()


def error_code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


_THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "ProvisionedThroughputExceededException",
    "SlowDown",
}


def is_transient(error: Exception) -> bool:
    """Throttling or a server-side fault: worth another attempt later."""
    response = getattr(error, "response", None) or {}
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return error_code(error) in _THROTTLING or status == 429 or status >= 500
