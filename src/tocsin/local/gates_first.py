"""Gates first: in the embedded runtime, DynamoDB calls wait while a gate is about to let go.

On AWS every gate sleeps in a Lambda of its own, and a task's bookkeeping after it fires
(its final mark) runs on other machines. Here all of it shares one
interpreter lock: when 200 gates let go within a second, each fired task's table writes
took the lock from the gates still waiting, and the last ones let go late. So a DynamoDB
call from this process waits while any gate is due within `WINDOW_MS` (or overdue), and for
`ACTION_MS` after a gate lets go, at most `MAX_WAIT_S` in all (the floor of the
bookkeeping's rate while gates keep coming). Nothing a gate needs waits: a gate makes no
calls while it sleeps, nor its action (a webhook request, say) after it, and the calls a
flow's send makes on its way to its gate (its key's ledger items: `tocsin.flow`) do not wait.
Held up like the rest, each took up to `MAX_WAIT_S` while gates came every few ms: a send
held its flow's lease through two of them, and `tocsin bench --scenarios flow` (5,000 tasks,
10 in flight) sent 28 a second at most where its rate was 500.

The wait after a gate matters as much as the one before: the calls held up for a gate
used to be woken all at once as it let go, and took the lock from the request it had let
through. In `tocsin bench --scenarios recurring` (1,770 occurrences), the gates let go with
a p99 of 6 ms past due while the requests arrived with a p99 of 21-25 ms; with the wait
after, 7-9 ms.
"""

import bisect
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tocsin import clock
from tocsin.flow_keys import part_of

WINDOW_MS = 20  # about the longest a DynamoDB call holds the lock here, and then some
ACTION_MS = 10  # after a gate lets go, its action (a webhook's request, say) goes first too
# A call waits this long at most, however long the run of gates: a steady stream never
# ends its run (at 100 tasks a second a gate is due every 10 ms), and the claims of the
# next batches, 32 at a time (`executor.CLAIM_WORKERS`), then went at 32 a second at
# most with 1 s here, behind 100 a second due: `dense` fell seconds behind (p99 5.9 s),
# where 0.1 s gave p99 57 ms, and `burst-1000`, `burst` and `recurring` no worse.
MAX_WAIT_S = 0.1
# A gate sleeps this close to its due time where the runtime's stop can wake it, and the
# rest in the gate's own sleep, as on AWS (so being stoppable costs no precision).
STOPPABLE_UNTIL_MS = 5


class RuntimeStopped(Exception):
    """The runtime stopped while this gate slept: its invocation ends, sending nothing, as a
    Lambda whose environment is shut down."""


class GatesFirst:
    """The deadlines of the gates asleep now, and the wait DynamoDB calls make for them."""

    def __init__(self) -> None:
        # Kept in order as gates come and go: a call asks for the first few every few ms,
        # and sorting them all each time was a twentieth of the runtime's CPU in `dense`.
        self._due: list[int] = []
        self._acting_until_ms = 0  # the last gate to let go, plus its action's time
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def gate(self, wait_until: Callable[[int], int]) -> Callable[[int], int]:
        """`wait_until`, with its deadline known while it sleeps."""

        def gated(due_ms: int) -> int:
            with self._lock:
                bisect.insort(self._due, due_ms)
            try:
                asleep_ms = due_ms - STOPPABLE_UNTIL_MS - clock.now_ms()
                if self._stopped.wait(max(asleep_ms, 0) / 1000):  # True: it is set
                    raise RuntimeStopped(f"the runtime stopped before {clock.to_iso(due_ms)}")
                return wait_until(due_ms)
            finally:
                with self._lock:
                    del self._due[bisect.bisect_left(self._due, due_ms)]
                    let_go_until = clock.now_ms() + ACTION_MS
                    self._acting_until_ms = max(self._acting_until_ms, let_go_until)

        return gated

    def stop(self) -> None:
        """The runtime's stop: every gate asleep, and any to come, raises RuntimeStopped."""
        self._stopped.set()

    def yield_to_gates(self, params: dict[str, Any] | None = None, **_: Any) -> None:
        """A `before-call` hook: return once no gate is due within the window and no gate's
        action is under way, or at once for a call on a flow's ledger. Waiters sleep for as
        long as the gates known then ask; none is woken by a gate letting go, so they do not
        all wake into the action's way."""
        give_up = time.monotonic() + MAX_WAIT_S
        while (pause_ms := self._pause_ms()) > 0:
            if _on_a_flows_ledger(params or {}):
                return
            left_s = give_up - time.monotonic()
            if left_s <= 0:
                return
            time.sleep(min(pause_ms / 1000, left_s))

    def _pause_ms(self) -> int:
        """How long a call should wait, as far as the gates known now tell (0: go): to the
        end of the run of gates under way (each due within the window of the one before),
        so that a waiter sleeps through a burst's second in one go. Waking at each gate of
        it instead, hundreds of held calls took the lock a thousand times a second from the
        gates themselves (`burst-1000`: p50 lateness 100-200 ms). It reads no further than
        a call waits: a flow's 5,000 sends, 2 ms apart, made one run that every call read
        whole, again and again."""
        now = clock.now_ms()
        run_end = None
        with self._lock:
            acting_until = self._acting_until_ms
            for due_ms in self._due:
                run_reach_ms = (now if run_end is None else run_end) + WINDOW_MS
                if due_ms > min(run_reach_ms, now + MAX_WAIT_S * 1000):
                    break
                run_end = due_ms
        if run_end is not None:
            return max(run_end - now, 0) + ACTION_MS
        return max(acting_until - now, 0)


def _on_a_flows_ledger(request: dict[str, Any]) -> bool:
    """Whether a DynamoDB request (botocore's, its body JSON) reads or writes only a flow's
    ledger items: a send waits on it before its gate."""
    body = json.loads(request.get("body") or b"{}")
    keys = [body["Key"]] if "Key" in body else []
    for table in body.get("RequestItems", {}).values():
        keys += table.get("Keys", []) if isinstance(table, dict) else []
    return bool(keys) and all(part_of(key) is not None for key in keys)
