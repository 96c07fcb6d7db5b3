"""The Schedules table, and the one write that spans it and the Tasks table.

A schedule's `revision` counts its edits and `next_ms` is its next occurrence not yet a
task. An occurrence becomes a task in one transaction with the schedule's advance, both
conditional: the schedule still at the revision and `next_ms` that were read, and the task
new (or an unclaimed occurrence of an older revision, replaced as its next version). Two
finders, a retried write or an edit racing the finder therefore give one task per
occurrence, and nothing is half-written. A large body goes apart (`tocsin.bodies`), in one
transaction with the schedule's write that names it.
"""

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from tocsin import aws, clock
from tocsin.bodies import CONTENT, BodyStore, retired_at, split_schedule
from tocsin.model import TaskStatus
from tocsin.settings import settings
from tocsin.store import PLANNED, typed

SCHEDULE_DUE_INDEX = "DueIndex"  # ENABLED schedules only, by shard and next occurrence
# A schedule edited or deleted leaves a record of the occurrences it had made: written in one
# transaction with the change, in the DueIndex under this shard, deleted once every one of
# them is cancelled (by the request, else by the finder's next runs). So a request that ends
# part way, by its time or a kill, leaves nothing of the old schedule to fire.
LEFTOVERS_SHARD = "leftovers"
SCHEDULE_OWNER_INDEX = "OwnerIndex"
SCHEDULE_PAGE_KEY = ("schedule_id", "owner")  # what a page of OwnerIndex resumes from

_serialize = TypeSerializer().serialize
_deserialize = TypeDeserializer().deserialize


class ScheduleState(StrEnum):
    ENABLED = "ENABLED"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"


class Turned(StrEnum):
    """What became of one occurrence."""

    TASK = "task"  # the task was written and the schedule advanced
    TAKEN = "taken"  # its task exists already, claimed or finished or cancelled: advanced only
    CHANGED = "changed"  # the schedule changed meanwhile: read it again


class ScheduleStore:
    def __init__(self, schedules_table: str, tasks_table: str):
        self._tables = schedules_table, tasks_table
        self._table = aws.resource("dynamodb").Table(schedules_table)
        # The resource's own client converts values itself; the transaction and the writes
        # beside it are spelled in DynamoDB's typed form, so they go through a plain client.
        self._client = aws.client("dynamodb")
        self._conditional_failed = (
            self._table.meta.client.exceptions.ConditionalCheckFailedException
        )
        self._write_refused = self._client.exceptions.ConditionalCheckFailedException
        self._cancelled = self._client.exceptions.TransactionCanceledException
        self._bodies = BodyStore(settings().bodies_table)

    def create(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """Write a new schedule, its body apart with it if large; if the id is taken, the
        schedule already there instead."""
        stored, body = split_schedule(item)
        condition = "attribute_not_exists(schedule_id)"
        if body is None:
            try:
                self._table.put_item(Item=stored, ConditionExpression=condition)
            except self._conditional_failed:
                return self.get(item["schedule_id"])
            return None
        put = {"TableName": self._tables[0], "Item": typed(stored)}
        writes = [{"Put": put | {"ConditionExpression": condition}}, self._body_put(body)]
        try:
            self._client.transact_write_items(TransactItems=writes)
        except self._cancelled as error:
            if error.response["CancellationReasons"][0].get("Code") == "ConditionalCheckFailed":
                return self.get(item["schedule_id"])
            raise
        return None

    def get(self, schedule_id: str) -> dict[str, Any] | None:
        """The schedule as stored: its body may be apart (`whole`)."""
        reply = self._table.get_item(Key={"schedule_id": schedule_id}, ConsistentRead=True)
        return reply.get("Item")

    def whole(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The schedules with their targets and payloads, the bodies kept apart read in."""
        return self._bodies.attach(items)

    def replace(
        self, current: dict[str, Any], item: dict[str, Any] | None, leftovers: dict[str, Any]
    ) -> bool:
        """Write the edited schedule `item` (None: delete it) over `current`, as it was read,
        and the record of `current`'s leftovers, in one; False if it changed meanwhile.
        With them, a new large body is written, and one no longer named given its time."""
        key = {"schedule_id": _serialize(current["schedule_id"])}
        seen = {":rev": current["revision"], ":owner": current["owner"]}
        condition = "revision = :rev AND #o = :owner AND "
        if "next_ms" in current:  # a finder's advance changes it, not the revision
            condition += "next_ms = :next"
            seen[":next"] = current["next_ms"]
        else:
            condition += "attribute_not_exists(next_ms)"
        change = {
            "TableName": self._tables[0],
            "ConditionExpression": condition,
            "ExpressionAttributeNames": {"#o": "owner"},
            "ExpressionAttributeValues": typed(seen),
        }
        stored, body = split_schedule(item) if item is not None else (None, None)
        write = (
            {"Delete": change | {"Key": key}}
            if stored is None
            else {"Put": change | {"Item": typed(stored)}}
        )
        record = {"Put": {"TableName": self._tables[0], "Item": typed(leftovers)}}
        writes = [write, record]
        old, new = current.get("body"), body and body["key"]
        if body is not None and new != old:
            writes.append(self._body_put(body))
        if old is not None and new != old:
            writes.append(self._body_retired(old))
        try:
            self._client.transact_write_items(TransactItems=writes)
        except self._cancelled:
            return False
        return True

    def _body_put(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"Put": {"TableName": self._bodies.table_name, "Item": typed(body)}}

    def _body_retired(self, key: str) -> dict[str, Any]:
        """A body no revision names from now on, given its time to live."""
        return {
            "Update": {
                "TableName": self._bodies.table_name,
                "Key": {"key": _serialize(key)},
                "UpdateExpression": "SET expires_at = :expires",
                "ExpressionAttributeValues": typed(
                    {":expires": retired_at(settings(), clock.now_ms())}
                ),
            }
        }

    def forget_leftovers(self, key: str) -> None:
        """Its leftovers are all cancelled: the record goes."""
        self._table.delete_item(Key={"schedule_id": key})

    def owned(
        self, owner: str, limit: int, start: dict[str, Any] | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Up to `limit` of one owner's schedules by id, and the key to resume from."""
        query: dict[str, Any] = {
            "IndexName": SCHEDULE_OWNER_INDEX,
            "KeyConditionExpression": "#o = :owner",
            "ExpressionAttributeNames": {"#o": "owner"},
            "ExpressionAttributeValues": {":owner": owner},
            "Limit": limit,
        }
        if start is not None:
            query["ExclusiveStartKey"] = start
        page = self._table.query(**query)
        items = page.get("Items", [])
        last = page.get("LastEvaluatedKey")
        return items, ({name: last[name] for name in SCHEDULE_PAGE_KEY} if last else None)

    def due(self, shard: str, until_ms: int) -> Iterator[str]:
        """Ids of one shard's ENABLED schedules whose next occurrence is by `until_ms`."""
        request: dict[str, Any] = {
            "IndexName": SCHEDULE_DUE_INDEX,
            "KeyConditionExpression": "gsi_pk = :shard AND gsi_next_ms <= :until",
            "ExpressionAttributeValues": {":shard": shard, ":until": until_ms},
        }
        while True:
            page = self._table.query(**request)
            yield from (item["schedule_id"] for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def advance(self, schedule: dict[str, Any], next_ms: int | None, missed: int = 0) -> bool:
        """Move the schedule past occurrences that make no task (taken, or missed and
        skipped); False if it changed since it was read."""
        try:
            self._client.update_item(
                TableName=self._tables[0], **_advance(schedule, next_ms, 0, missed)
            )
        except self._write_refused:
            return False
        return True

    def turn_into_task(
        self, schedule: dict[str, Any], task: dict[str, Any], next_ms: int | None, missed: int
    ) -> Turned:
        """Write the occurrence's task and advance the schedule to `next_ms`, in one.

        The task is put new; only if one is there already does the write go again as the
        update that replaces an unclaimed task of an older revision (moto takes ten times
        as long over that update's twenty actions, and most occurrences are new)."""
        task = self._bodies.stored(task)  # its body first, if large (tocsin.bodies)
        move = {"Update": {"TableName": self._tables[0], **_advance(schedule, next_ms, 1, missed)}}
        put = {
            "TableName": self._tables[1],
            "Item": typed(task),
            "ConditionExpression": "attribute_not_exists(task_id)",
        }
        turned = self._together({"Put": put}, move)
        if turned is Turned.TAKEN:
            replace = {"TableName": self._tables[1], **_upsert_occurrence(task)}
            turned = self._together({"Update": replace}, move)
        if turned is Turned.TAKEN and not self.advance(schedule, next_ms, missed):
            return Turned.CHANGED
        return turned

    def _together(self, write: dict[str, Any], move: dict[str, Any]) -> Turned:
        """The task's write and the schedule's advance in one transaction: TASK if both
        went, TAKEN if only the task's condition failed, CHANGED otherwise."""
        try:
            self._client.transact_write_items(TransactItems=[write, move])
        except self._cancelled as error:
            # An item that did not fail has the code "None", or (as DynamoDB's reference
            # puts it) a null one.
            task_reason, schedule_reason = (
                reason.get("Code") or "None" for reason in error.response["CancellationReasons"]
            )
            if schedule_reason == "None" and task_reason == "ConditionalCheckFailed":
                return Turned.TAKEN
            return Turned.CHANGED  # the schedule moved, or another write was in progress
        return Turned.TASK

    def cancel_occurrence(
        self, task_id: str, revision: int, now_iso: str, expires_at: int
    ) -> dict[str, Any] | None:
        """CANCELLED, if still unclaimed and made by an older revision of its schedule (or by
        any, with `revision` above every one), for TTL to delete at `expires_at`: the task,
        or None if it was not."""
        try:
            reply = self._client.update_item(
                TableName=self._tables[1],
                Key={"task_id": _serialize(task_id)},
                UpdateExpression="SET #s = :cancelled, updated_at = :now, expires_at = :expires "
                "REMOVE gsi_pk, gsi_due_ms",
                ConditionExpression="schedule_revision < :rev AND #s = :pending",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=typed(
                    {
                        ":cancelled": TaskStatus.CANCELLED.value,
                        ":now": now_iso,
                        ":expires": expires_at,
                        ":rev": revision,
                        ":pending": TaskStatus.PENDING.value,
                    }
                ),
                ReturnValues="ALL_NEW",
            )
        except self._write_refused:
            return None
        return {name: _deserialize(value) for name, value in reply["Attributes"].items()}


def _advance(
    schedule: dict[str, Any], next_ms: int | None, made: int, missed: int
) -> dict[str, Any]:
    """The conditional update that moves a schedule read at (revision, next_ms) onwards."""
    values: dict[str, Any] = {
        ":rev": schedule["revision"],
        ":seen": schedule["next_ms"],
        ":made": made,
        ":missed": missed,
        ":zero": 0,
    }
    counts = (
        "occurrences = if_not_exists(occurrences, :zero) + :made, "
        "missed = if_not_exists(missed, :zero) + :missed"
    )
    if next_ms is None:
        update = f"SET #st = :completed, {counts} REMOVE next_ms, gsi_pk, gsi_next_ms"
        values[":completed"] = ScheduleState.COMPLETED.value
    else:
        update = f"SET next_ms = :next, gsi_next_ms = :next, {counts}"
        values[":next"] = next_ms
    return {
        "Key": {"schedule_id": _serialize(schedule["schedule_id"])},
        "UpdateExpression": update,
        "ConditionExpression": "revision = :rev AND next_ms = :seen",
        "ExpressionAttributeValues": typed(values),
        **({"ExpressionAttributeNames": {"#st": "state"}} if next_ms is None else {}),
    }


# What an occurrence's task carries beyond its key and its body; a replaced one keeps its
# created_at.
_OCCURRENCE_FIELDS = (
    "due_at",
    "due_ms",
    "task_type",
    "max_attempts",
    "owner",
    "schedule_id",
    "schedule_revision",
    "gsi_pk",
    "gsi_due_ms",
    "placed_ms",
)


def _upsert_occurrence(task: dict[str, Any]) -> dict[str, Any]:
    """The occurrence's task written new (version 1), or over an unclaimed task of an older
    revision as its next version: that version's execution then fails its claim."""
    # its body held otherwise; callbacks, a flow, a retry policy or tags dropped
    optional = (*CONTENT, "body", "callbacks", "flow", "retry", "tags")
    fields = [*_OCCURRENCE_FIELDS, *(name for name in optional if name in task)]
    gone = [name for name in optional if name not in task]
    names = {f"#a{i}": name for i, name in enumerate(fields)}
    sets = ", ".join(f"#a{i} = :a{i}" for i in range(len(fields)))
    values = {f":a{i}": task[name] for i, name in enumerate(fields)}
    return {
        "Key": {"task_id": _serialize(task["task_id"])},
        "UpdateExpression": (
            f"SET #v = if_not_exists(#v, :zero) + :one, #s = :pending, {sets}, "
            "created_at = if_not_exists(created_at, :now) "
            f"REMOVE {', '.join(['execution', 'requeues', *PLANNED, *gone])}"
        ),
        "ConditionExpression": (
            "attribute_not_exists(task_id) OR (schedule_revision < :rev AND #s = :pending)"
        ),
        "ExpressionAttributeNames": {"#v": "version", "#s": "status", **names},
        "ExpressionAttributeValues": typed(
            {
                ":zero": 0,
                ":one": 1,
                ":pending": TaskStatus.PENDING.value,
                ":now": task["created_at"],
                ":rev": task["schedule_revision"],
                **values,
            }
        ),
    }
