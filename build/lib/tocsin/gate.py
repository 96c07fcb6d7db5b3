"""The precise gate: the executor arrives early (the lead) and sleeps the last milliseconds.

A Step Functions Wait drops milliseconds and can end up to a second early, so the state
machine wakes ahead of time and this gate decides the instant. It never lets go before
`due_ms`; a task that reaches it late goes at once.
"""

import time

from tocsin import clock


def wait_until(due_ms: int) -> int:
    """Sleep until the clock reads `due_ms`; return the millisecond it let go (>= due_ms)."""
    while (now := clock.now_ms()) < due_ms:
        time.sleep((due_ms - now) / 1000)
    return now
