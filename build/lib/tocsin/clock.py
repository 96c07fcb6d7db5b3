"""Time in one form: timezone-aware UTC, and integer epoch milliseconds named `*_ms`."""

import time
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """The current time in whole epoch milliseconds (floored, so never ahead of the clock)."""
    return time.time_ns() // 1_000_000


def to_datetime(ms: int) -> datetime:
    seconds, millis = divmod(ms, 1000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)


def to_iso(ms: int) -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-11-23T10:00:00.125Z."""
    return to_datetime(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def to_iso_second(ms: int) -> str:
    """ISO-8601 UTC floored to the second: the form a Step Functions Wait honours exactly."""
    return to_datetime(ms - ms % 1000).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_ms(moment: datetime) -> int:
    """Epoch milliseconds of an aware datetime (sub-millisecond parts are floored)."""
    if moment.tzinfo is None:
        raise ValueError("datetime must be timezone-aware")
    return (moment - _EPOCH) // timedelta(milliseconds=1)
