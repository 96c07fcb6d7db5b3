"""The precise gate: the executor arrives early (the lead) and sleeps the last milliseconds.

A Step Functions Wait drops milliseconds and can end up to a second early, so the state
machine wakes ahead of time and this gate decides the instant. It never lets go before
`due_ms`; a task that reaches it late goes at once.

What a send costs after its gate is what a dense millisecond waits on (a 256 MB Lambda has
a seventh of a core), so it can be watched: `WATCH`, None on AWS, is set by the embedded
runtime's sandboxes (`tocsin.local.sandbox`), which read their cgroup's CPU as a send's
gate lets go and as its bytes are written.
"""

import time
from typing import Protocol

from tocsin import clock


class Watch(Protocol):
    def let_go(self) -> None:
        """A send's gate let it go."""

    def written(self, sends: int) -> None:
        """`sends` sends' bytes are written (a call's, for a batched type)."""


WATCH: Watch | None = None


def wait_until(due_ms: int) -> int:
    """Sleep until the clock reads `due_ms`; return the millisecond it let go (>= due_ms)."""
    while (now := clock.now_ms()) < due_ms:
        time.sleep((due_ms - now) / 1000)
    return now
