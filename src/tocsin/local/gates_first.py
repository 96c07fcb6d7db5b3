"""Gates first: in the embedded runtime, DynamoDB calls wait while a gate is about to let go.

On AWS every gate sleeps in a Lambda of its own, and a task's bookkeeping after it fires
(the idempotency record, MarkSucceeded) runs on other machines. Here all of it shares one
interpreter lock: when 200 gates let go within a second, each fired task's table writes
took the lock from the gates still waiting, and the last ones let go late. So a DynamoDB
call from this process waits while any gate is due within `WINDOW_MS` (or overdue), for at
most `MAX_WAIT_S`. Nothing a gate needs waits: a gate makes no calls while it sleeps.
"""

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from tocsin import clock

WINDOW_MS = 20  # about the longest a DynamoDB call holds the lock here, and then some
MAX_WAIT_S = 1.0  # a run of gates longer than this lets the bookkeeping through anyway


class GatesFirst:
    """The deadlines of the gates asleep now, and the wait DynamoDB calls make for them."""

    def __init__(self) -> None:
        self._due: Counter[int] = Counter()
        self._changed = threading.Condition()

    def gate(self, wait_until: Callable[[int], int]) -> Callable[[int], int]:
        """`wait_until`, with its deadline known while it sleeps."""

        def gated(due_ms: int) -> int:
            with self._changed:
                self._due[due_ms] += 1
            try:
                return wait_until(due_ms)
            finally:
                with self._changed:
                    self._due[due_ms] -= 1
                    if not self._due[due_ms]:
                        del self._due[due_ms]
                    if not self._imminent():  # wake the waiters only once the way is clear
                        self._changed.notify_all()

        return gated

    def yield_to_gates(self, **_: Any) -> None:
        """A `before-call` hook: return once no gate is due within the window."""
        with self._changed:
            self._changed.wait_for(lambda: not self._imminent(), timeout=MAX_WAIT_S)

    def _imminent(self) -> bool:
        return bool(self._due) and min(self._due) <= clock.now_ms() + WINDOW_MS
