"""A task's retry policy: how often and for how long a failing target is tried again.

Attempts are spaced by a backoff doubling from `min_backoff_s` up to `max_backoff_s`,
each pause stretched by up to a quarter at random (jitter: tasks that failed together do
not come back together), and a task stops at whichever limit it meets first: its
`max_attempts`, or its `max_age_s` counted from its due time. A receiver's `Retry-After`
sets the next attempt instead (`after_s`). A throttling answer (429, or 503 with
`Retry-After`) counts towards the age, not the attempts.

Short pauses are spent inside the invocation (`SHORT_PAUSE_S`); a longer one gives the
task back to the dispatch index, RETRYING, due at its next attempt (`tocsin.fire`)."""

import random
from decimal import Decimal
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_ATTEMPTS = 185  # EventBridge Scheduler's limit
DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_MAX_AGE_S = 86_400
DEFAULT_MIN_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 3_600.0
JITTER = 0.25  # a pause is its backoff stretched by up to this share, at random
# A pause up to this long is waited inside the invocation, as today's short retries were;
# a longer one would hold the invocation (and its memory) for nothing.
SHORT_PAUSE_S = 5.0
# The failed attempts a task's item keeps (the latest): 185 of them would fill it.
KEPT_TRIES = 10


class ExhaustedBy(StrEnum):
    """Why a task that failed stopped being tried."""

    ATTEMPTS = "attempts"
    AGE = "age"
    PERMANENT = "permanent"


class RetryPolicy(BaseModel):
    """`retry` on a task or a schedule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_ATTEMPTS)
    max_age_s: int = Field(DEFAULT_MAX_AGE_S, ge=60, le=86_400)
    min_backoff_s: float = Field(DEFAULT_MIN_BACKOFF_S, ge=0.5, le=3_600)
    max_backoff_s: float = Field(DEFAULT_MAX_BACKOFF_S, ge=1, le=86_400)

    @model_validator(mode="after")
    def _ordered(self) -> "RetryPolicy":
        if self.max_backoff_s < self.min_backoff_s:
            raise ValueError("max_backoff_s must be at least min_backoff_s")
        return self

    def backoff_s(self, failures: int, rng: random.Random | None = None) -> float:
        """The pause after the `failures`-th counted failure (1 for the first)."""
        base = min(self.max_backoff_s, self.min_backoff_s * 2 ** min(failures - 1, 40))
        stretch = 1 + JITTER * (rng or random).random()
        return min(self.max_backoff_s, base * stretch)

    def stored(self) -> dict[str, Decimal]:
        """As a task's item keeps it (DynamoDB's numbers): only what differs from the
        defaults, so that a task with the defaults writes nothing more than before."""
        kept = self.model_dump(exclude_defaults=True, exclude={"max_attempts"})
        return {name: Decimal(str(value)) for name, value in kept.items()}


def given_policy(retry: RetryPolicy | None, max_attempts: int | None) -> RetryPolicy:
    """The policy a request asks for: `retry`, with the top-level `max_attempts` (which
    means `retry.max_attempts`); ValueError naming `max_attempts` when the two disagree."""
    policy = retry or RetryPolicy()
    if max_attempts is None:
        return policy
    if "max_attempts" in policy.model_fields_set and policy.max_attempts != max_attempts:
        raise ValueError("max_attempts: differs from retry.max_attempts (give one of them)")
    return policy.model_copy(update={"max_attempts": max_attempts})


def retry_after_s(value: str, now_ms: int) -> float | None:
    """A `Retry-After` value as seconds from now: delta-seconds, or an HTTP-date (RFC 9110);
    None if it is neither. A time already past is 0."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return max(0.0, moment.timestamp() - now_ms / 1000)


def rate_limit_reset_s(value: str, now_ms: int) -> float | None:
    """An `X-RateLimit-Reset` value as seconds from now: receivers send either the epoch
    second the limit resets at or the seconds until then; a count past a billion seconds
    (2001) is read as the former."""
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if number < 0:
        return None
    return max(0.0, number - now_ms / 1000) if number > 1e9 else number


def policy_of(item: dict[str, Any]) -> RetryPolicy:
    """A stored task's (or schedule's) policy: `max_attempts` beside the rest in `retry`."""
    kept = item.get("retry") or {}
    return RetryPolicy(
        max_attempts=int(item.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
        **{name: float(value) for name, value in kept.items()},
    )
