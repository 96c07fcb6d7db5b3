"""boto3 clients made once per process, with botocore's retry modes rather than our own loops.

Every call is bounded: a connection gets CONNECT_TIMEOUT_S, an answer READ_TIMEOUT_S
(botocore's defaults are 60 s each, half an executor's life). An executor must know how
long one attempt at a target can take, so target clients retry once, not five times
(`target_attempt_limit_s`); the executor's own attempts back off beyond that.
"""

import os
import threading
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

from tocsin.settings import CONNECT_TIMEOUT_S, READ_TIMEOUT_S

_lock = threading.Lock()
TARGET_RETRIES = 1
MAX_ATTEMPTS = 5  # botocore's tries of one call of our own clients (`client`, `resource`)


def target_read_timeout_s() -> float:
    """How long a target's call waits for its answer: READ_TIMEOUT_S, unless the
    environment sets another (the embedded runtime: its moto endpoint answers a burst's
    calls one at a time, in one process, 14 s for the last of 50 SendMessageBatch calls,
    where SQS takes milliseconds; timed out, each call was sent again, and queued twice)."""
    return float(os.environ.get("TOCSIN_TARGET_READ_TIMEOUT_SECONDS", READ_TIMEOUT_S))


def target_attempt_limit_s() -> float:
    """One send to an AWS target at most: every try connecting and waiting its longest,
    and botocore's backoff between them (standard mode: up to 20 s, never that much after
    one)."""
    return (1 + TARGET_RETRIES) * (CONNECT_TIMEOUT_S + target_read_timeout_s()) + 2.0


def call_limit_s(max_attempts: int = MAX_ATTEMPTS) -> float:
    """The longest one call of a client of ours (`client`, `resource`) can take: every try
    connecting and waiting its longest, and standard mode's backoff between them (at most
    2 ** n seconds before try n + 2)."""
    backoff_s = sum(2.0**n for n in range(max_attempts - 1))
    return max_attempts * (CONNECT_TIMEOUT_S + _read_timeout_s()) + backoff_s


def _read_timeout_s() -> float:
    """READ_TIMEOUT_S, unless the environment sets another (the embedded runtime: its one
    DynamoDB process queues answers under load, where AWS's would not)."""
    return float(os.environ.get("TOCSIN_SDK_READ_TIMEOUT_SECONDS", READ_TIMEOUT_S))


@cache
def _cached(service: str, kind: str, retry_mode: str, max_attempts: int) -> Any:
    config = Config(
        retries={"mode": retry_mode, "max_attempts": max_attempts},
        max_pool_connections=64,
        connect_timeout=CONNECT_TIMEOUT_S,
        # A target's clients keep AWS's bound: an attempt's limit is computed from it.
        read_timeout=READ_TIMEOUT_S if kind == "target" else _read_timeout_s(),
    )
    factory = boto3.resource if kind == "resource" else boto3.client
    if kind != "target":
        made = factory(service, config=config)
    else:  # its calls in a turn are written at their gates (tocsin.targets.aws_call)
        from tocsin.targets import aws_call

        made = factory(service, config=config, endpoint_url=os.environ.get(TARGET_ENDPOINT))
        made.meta.events.register_first("before-send", aws_call.send_on_the_wire)
    # botocore builds a client's exception classes on first use, unlocked: two threads there
    # at once can get different classes, and `except client.exceptions.X` then misses the X
    # the client raises. Build them now, under the caller's lock.
    (made.meta.client if kind == "resource" else made).exceptions  # noqa: B018
    return made


# Where target clients send, if not to AWS: the embedded runtime's moto endpoint
# (`tocsin.local.moto_endpoint`), whose requests moto answers as AWS would. Unset on AWS.
TARGET_ENDPOINT = "TOCSIN_TARGET_ENDPOINT_URL"


def client(service: str, retry_mode: str = "standard", max_attempts: int = MAX_ATTEMPTS) -> Any:
    """A shared client with botocore's retries in `retry_mode`, `max_attempts` after the first."""
    with _lock:  # boto3's session is not safe to create clients from in parallel
        return _cached(service, "client", retry_mode, max_attempts)


def target_client(service: str) -> Any:
    """A client for sending to a target: one retry, so one attempt stays within
    target_attempt_limit_s()."""
    with _lock:
        return _cached(service, "target", "standard", TARGET_RETRIES)


def resource(service: str) -> Any:
    with _lock:
        return _cached(service, "resource", "standard", MAX_ATTEMPTS)


def forget_clients() -> None:
    """Drop cached clients (the embedded runtime starts a fresh set of mocked services)."""
    _cached.cache_clear()


def error_code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


# Every code botocore's standard retry mode retries as throttling (ThrottledRetryableChecker
# in botocore/retries/standard.py; a test checks this holds them all), besides any code that
# says so itself (KMSThrottlingException, say): a service that answers one is busy, not
# refusing the request, so it is worth another attempt later.
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
# What botocore retries as transient besides a 5xx (TransientRetryableChecker).
TIMEOUT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException"})
# Why DynamoDB cancels a transaction (a 400, which no retry mode retries) for a moment only:
# its rate, or another transaction on one of its items; not a condition, not a validation.
PASSING_CANCELLATIONS = frozenset(
    {"ThrottlingError", "ProvisionedThroughputExceeded", "TransactionConflict"}
)


def _status(error: Exception) -> int:
    response = getattr(error, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_throttling(error: Exception) -> bool:
    """The service is busy: it refused the request for its rate, not for what it asked."""
    code = error_code(error)
    return code in THROTTLING_CODES or "Throttl" in code or _status(error) == 429


def is_transient(error: Exception) -> bool:
    """Throttling, a timeout or a server-side fault, or a transaction cancelled for a
    moment only: worth another attempt later."""
    return (
        is_throttling(error)
        or error_code(error) in TIMEOUT_CODES
        or _status(error) >= 500
        or _cancelled_for_a_moment(error)
    )


def _cancelled_for_a_moment(error: Exception) -> bool:
    """A transaction DynamoDB cancelled for PASSING_CANCELLATIONS alone."""
    if error_code(error) != "TransactionCanceledException":
        return False
    reasons = (getattr(error, "response", None) or {}).get("CancellationReasons", [])
    codes = {reason.get("Code") or "None" for reason in reasons} - {"None"}
    return bool(codes) and codes <= PASSING_CANCELLATIONS
