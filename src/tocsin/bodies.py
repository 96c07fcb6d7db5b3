"""A task's body, its target and payload: on the task's item while it is small, else an
item of its own, in the Bodies table.

Every write to a task (the mark, the claim, the final mark, a cancel) is billed one unit
per KB of the larger of the item's images, so a task that carried a 10 KiB payload paid
eleven units for each, though the body is written once and read once (by the executor that
claims it, and a GET). A body of more than INLINE_BYTES is written apart when the task is
stored, under a key of its own (the task's id, version and a digest of the body: a
submission refused for another body with the same id writes no other task's body), and
the task names it (`body`). The body is written first: a task is never stored without its
body, and a body left without a task (its put refused) is deleted by TTL with the others,
RetentionDays after the due time plus DEAD_LETTER_DAYS, so that a task an operator
redrives from the dead-letter queue still has it.

A schedule's large body goes apart the same way, under `<schedule id>:<digest>`, written
in one transaction with the schedule (`tocsin.schedule_store`), and its occurrences name
it rather than a body of their own: neither the schedule's advance at each occurrence nor
the occurrence carries it. It has no time to live while a revision of the schedule names
it; once none does (an edit to another body, a delete), it is given one: `retired_at`.
"""

import hashlib
from typing import Any

from tocsin import aws
from tocsin.batch_read import BATCH_GET_MAX, batch_read
from tocsin.settings import Settings, settings

# A body up to this many bytes stays on the task: with its other attributes and marks the
# item stays within one write unit (1 KB) through a first try's final mark. The largest
# such item is an email schedule's occurrence (a 48-character schedule id, a 45-character
# owner, SES's 60-character message id in its result): with a 400-byte body, 1,101 B under
# a 74-character execution name (1,107 B at Step Functions' 80), two units on DynamoDB
# Local (tests/integration/test_write_units_local.py).
INLINE_BYTES = 300
DEAD_LETTER_DAYS = 14  # the dead-letter queue keeps a message this long (template.yaml)
CONTENT = ("target", "payload")


def split(item: dict[str, Any], config: Settings) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The task's item as stored, and its body's item if the body goes apart (else None).
    A task that names its body already (a schedule's occurrence: its schedule's) is kept."""
    if "body" in item or _small(item):
        return item, None
    key = f"{item['task_id']}:{item['version']}:{_digest(item)}"
    expires_at = config.expires_at(int(item["due_ms"])) + DEAD_LETTER_DAYS * 86_400
    return _apart(item, key, {"expires_at": expires_at})


def split_schedule(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The schedule's item as stored, and its body's item if the body goes apart (else
    None): kept while a revision names it, so without a time to live."""
    if _small(item):
        return item, None
    return _apart(item, f"{item['schedule_id']}:{_digest(item)}", {})


def retired_at(config: Settings, now_ms: int) -> int:
    """When a schedule's body that no revision names from now on may go: after the
    occurrences made from it (due within the look-ahead) have their retention, and the
    dead-letter queue its days, as a task's body does."""
    return config.expires_at(now_ms + config.lookahead_s * 1000) + DEAD_LETTER_DAYS * 86_400


def _small(item: dict[str, Any]) -> bool:
    return sum(len(item[name].encode()) for name in CONTENT) <= INLINE_BYTES


def _digest(item: dict[str, Any]) -> str:
    return hashlib.sha256((item["target"] + "\0" + item["payload"]).encode()).hexdigest()[:16]


def _apart(
    item: dict[str, Any], key: str, extra: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    body = {"key": key, **{name: item[name] for name in CONTENT}, **extra}
    return naming(item, key), body


def naming(item: dict[str, Any], key: str) -> dict[str, Any]:
    """`item` without its target and payload, naming the body that holds them."""
    return {name: value for name, value in item.items() if name not in CONTENT} | {"body": key}


class BodyStore:
    def __init__(self, table_name: str):
        self.table_name = table_name
        self._dynamodb = aws.resource("dynamodb")
        self._table = self._dynamodb.Table(table_name)

    def stored(self, item: dict[str, Any]) -> dict[str, Any]:
        """The task's item as it is stored (`split`), its body written apart first if it is
        large: a task is never stored without its body. Writing a body again is harmless,
        as the same key always holds the same body."""
        stored, body = split(item, settings())
        if body is not None:
            self._table.put_item(Item=body)
        return stored

    def attach(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tasks with their bodies in place: read, for those that name one apart."""
        keys = [item["body"] for item in items if "body" in item]
        bodies = self._read(keys) if keys else {}
        return [
            {**item, **{name: bodies[item["body"]][name] for name in CONTENT}}
            if item.get("body") in bodies
            else item
            for item in items
        ]

    def with_targets(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tasks with their targets in place, read (the target alone, eventually
        consistent) for those that name a body apart."""
        keys = [item["body"] for item in items if "body" in item]
        aliases = {"ExpressionAttributeNames": {"#k": "key", "#t": "target"}}
        bodies = self._read(keys, ProjectionExpression="#k, #t", **aliases) if keys else {}
        return [
            {**item, "target": bodies[item["body"]]["target"]}
            if item.get("body") in bodies
            else item
            for item in items
        ]

    def _read(self, keys: list[str], **asked: Any) -> dict[str, dict[str, Any]]:
        """Bodies by key, read as `asked` (a projection), or whole and consistently: each
        was written before its task."""
        unique = [{"key": key} for key in dict.fromkeys(keys)]
        how = asked or {"ConsistentRead": True}
        return {
            body["key"]: body
            for start in range(0, len(unique), BATCH_GET_MAX)
            for body in batch_read(
                self._dynamodb, self._table.name, unique[start : start + BATCH_GET_MAX], **how
            )
        }
