"""A call cut off at a deadline, for what must end in time whatever the network does (a
final mark before its invocation's end, a start inside an API request): the call's answer,
or the caller's error once the time is up. A call cut off goes on, unheeded, on a thread
of its own: each caller's write is conditional or idempotent, so a late one is harmless."""

import threading
from collections.abc import Callable
from typing import TypeVar

from tocsin import clock

Answer = TypeVar("Answer")


def within(deadline_ms: int, call: Callable[[], Answer], too_late: Exception) -> Answer:
    """`call`'s answer (or its error), or `too_late` raised at `deadline_ms`."""
    answer: list[Answer] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(call())
        except BaseException as error:
            failure.append(error)

    trying = threading.Thread(target=run, name="cut-off-call", daemon=True)
    trying.start()
    trying.join(max(0, deadline_ms - clock.now_ms()) / 1000)
    if trying.is_alive():
        raise too_late
    if failure:
        raise failure[0]
    return answer[0]
