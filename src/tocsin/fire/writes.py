"""How the executor's own table writes (claims, plans, final marks) are tried: each keeps
tries of its own within the invocation's time, then `TableUnavailable` fails the
invocation, for the state machine to retry it."""

import random
import time
from collections.abc import Callable
from typing import TypeVar

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as EndpointUnreachable

from tocsin import aws, clock, cutoff

WRITE_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # between tries of one claim or mark, with jitter
Written = TypeVar("Written")  # what a claim or mark returns


class TableUnavailable(Exception):
    """A claim or a final mark could not be written in the invocation's time (the table is
    busy or down): the invocation is retried, and takes back what it holds."""


def written(task_id: str, deadline_ms: int, write: Callable[[], Written]) -> Written:
    """A claim or final mark, tried again while the invocation has time before `deadline_ms`
    for another try as long as the last (a try may hold botocore's own retries); then
    TableUnavailable, for the invocation to be retried.

    botocore's standard mode shares one retry quota per client, and stops retrying when it
    is spent: in a brownout, a batch's hundreds of writes spend it in a few dozen retried
    500s, and every write after that would fail on its first refusal, failing the whole
    batch. Each write here keeps its own tries. Claims and marks are safe to repeat: a try
    that committed unseen is found by the next (`TaskStore.claim`, `TaskStore.finish`).
    A fault no later try can mend (a malformed request, no credentials) is not retried,
    and a refusal that is not the table's state (a 4xx) is raised as it is.
    """
    tries = 0
    while True:
        tries += 1
        began = clock.now_ms()
        if began > deadline_ms:  # queued behind the batch's other writes past the deadline
            raise TableUnavailable(f"{task_id}: no time left to write")
        try:
            return write()
        except (BotoCoreError, ClientError) as fault:
            if isinstance(fault, ClientError) and not aws.is_transient(fault):
                raise
            pause_s = WRITE_PAUSES_S[min(tries, len(WRITE_PAUSES_S)) - 1] * random.uniform(0.5, 1)
            took_ms = clock.now_ms() - began
            if not _may_pass(fault) or clock.now_ms() + pause_s * 1000 + took_ms > deadline_ms:
                raise TableUnavailable(f"{task_id}: {type(fault).__name__}") from fault
            time.sleep(pause_s)


def answered_by(deadline_ms: int, write: Callable[[], Written]) -> Written:
    """`write`'s answer, or TableUnavailable at `deadline_ms` if it has none by then. A
    final mark's try could hang past the invocation's end (botocore's own retries, each up
    to its read timeout): Lambda would kill the invocation with the task sent and no record
    of it, and the retry would send it again. Cut off, the mark leaves the time to write
    the sent log (`execute`). A write that cannot outlast the deadline is made here,
    without a thread of its own."""
    if clock.now_ms() + aws.call_limit_s() * 1000 <= deadline_ms:
        return write()
    return cutoff.within(
        deadline_ms, write, TableUnavailable("no answer before the invocation's end")
    )


def _may_pass(fault: Exception) -> bool:
    """A fault a later try may not meet: throttling, a 5xx, a connection that failed."""
    if isinstance(fault, ClientError):
        return aws.is_transient(fault)
    return isinstance(fault, (EndpointUnreachable, HTTPClientError))
