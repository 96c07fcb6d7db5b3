"""What an executor sent when the Tasks table would not record it.

The final mark (SUCCEEDED, with the fire time, lateness and the target's answer) is the
sent marker: a SUCCEEDED task is never sent again. When the Tasks table refuses that mark
past every try after a send, nothing durable says the task was sent, and the attempt that
takes it over next (a retry of the execution, or the execution the reconciler requeues it
to) would send it again. On that path only, the send is written here, in a table of its
own (the Tasks table is the one refusing); a claim that takes a task over from an earlier
attempt reads it before sending. Tasks claimed fresh read and write nothing here.
"""

import json
from dataclasses import dataclass
from typing import Any

from tocsin import aws

# An attempt that failed, as a task's history keeps it: {"at": ISO-8601, "error": why}.
Try = dict[str, str]


@dataclass(frozen=True)
class Fired:
    """A task sent: when its gate let go, what the target answered, in how many attempts,
    the attempts before it that failed, and how long flow control held it."""

    fired_ms: int
    result: dict[str, Any]
    attempts: int
    tries: tuple[Try, ...] = ()
    held_ms: int = 0  # how long its flow's limits held it past its due time (tocsin.flow)
    slot_ms: int = 0  # the slot it went in, when its flow held it (else its due time)


class SentLog:
    def __init__(self, table_name: str):
        self._table = aws.resource("dynamodb").Table(table_name)

    def record(self, task_id: str, version: int, sent: Fired, expires_at: int) -> None:
        self._table.put_item(
            Item={
                "id": _key(task_id, version),
                "fired_ms": sent.fired_ms,
                "result": json.dumps(sent.result),
                "attempts": sent.attempts,
                "tries": json.dumps(sent.tries),
                "held_ms": sent.held_ms,
                "expires_at": expires_at,
            }
        )

    def find(self, task_id: str, version: int) -> Fired | None:
        item = self._table.get_item(Key={"id": _key(task_id, version)}, ConsistentRead=True).get(
            "Item"
        )
        if item is None:
            return None
        result, tries = json.loads(item["result"]), tuple(json.loads(item.get("tries", "[]")))
        held_ms = int(item.get("held_ms", 0))
        return Fired(int(item["fired_ms"]), result, int(item["attempts"]), tries, held_ms)


def _key(task_id: str, version: int) -> str:
    return f"{task_id}:{version}"
