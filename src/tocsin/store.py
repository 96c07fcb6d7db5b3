"""The Tasks table: every read and conditional write the domain makes, in one place.

Expressions are written as strings. boto3's condition objects (`Key`, `Attr`) go through
one placeholder builder per resource that every call resets, so two threads sharing the
table could swap each other's names mid-build (a finder query once named the wrong key).
"""

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import islice
from typing import Any

from boto3.dynamodb.types import TypeSerializer
from botocore.exceptions import ClientError

from tocsin import aws, clock
from tocsin.batch_read import BATCH_GET_MAX, batch_read
from tocsin.bodies import CONTENT, BodyStore
from tocsin.errors import Busy
from tocsin.holds import HELD_INDEX, HOLDS_OWNER
from tocsin.model import SUMMARY_ATTRIBUTES, TaskStatus
from tocsin.settings import settings
from tocsin.tags import has_tags

DUE_INDEX = "DispatchIndex"  # by shard and time: every task in a due shard, a few to check
# Not a task (no task id holds a `~`): how far the finder and the reconciler have read the
# due shards (`tocsin.index_keys`), so that each reads every entry once.
HORIZONS_KEY = {"task_id": "~horizons"}
# Listing reads keys-only indexes, then the tasks by key: a task's state changes do not
# rewrite an entry that holds only its keys, where one holding every attribute was written
# at each of them (three write units a task, all on its owner's index partition).
OWNER_INDEX = "OwnerKeysIndex"
OWNER_INDEX_KEY = ("task_id", "owner", "due_ms")  # what a page of it resumes from
SCHEDULE_INDEX = "ScheduleKeysIndex"  # a schedule's occurrences, by due time
SCHEDULE_INDEX_KEY = ("task_id", "schedule_id", "due_ms")
# A schedule's last fire: its newest occurrences due by now, a short page at a time (each
# is read whole), up to LAST_FIRED_LOOKS pages.
LAST_FIRED_PAGE = 10
LAST_FIRED_LOOKS = 25
BUSY = "DynamoDB is busy: send the same request again"
# A claim's lease is over (or there is none): no invocation may still be sending the task.
LEASE_OVER = "(attribute_not_exists(lease_until) OR lease_until < :now_ms)"
STATUS_AND_VERSION = {"#s": "status", "#v": "version"}
# What the finder's packing reads of a crowded second's tasks (`tocsin.call_keys`)
CALL_ATTRIBUTES = ("task_id", "task_type", "target", "body", "flow", "recovering")
# A version's flow slot (`tocsin.flow`): a new version is planned anew.
PLANNED = ("planned_ms", "planned_at")
HELD = ", ".join((*PLANNED, "held_ms"))
# A RETRYING version's state (`retry_later`): gone once it ends, or a new version begins.
RETRY_STATE = ("next_attempt_ms", "next_attempt_at", "throttled", "held_on", "recovering")
# Not claimed yet: PENDING, or RETRYING (due at its next attempt); cancelled or changed so.
UNCLAIMED = "#s IN (:pending, :retrying)"
_serialize = TypeSerializer().serialize


@dataclass(frozen=True)
class Holder:
    """Who claims a task: the execution (its name), its invocation (the attempt: Lambda's
    request id) and the invocation's end, when the attempt is gone and its lease with it."""

    execution: str
    attempt: str
    lease_until_ms: int


@dataclass(frozen=True)
class Claim:
    """A claim's answer: the task as it was before (None: not claimed); whether a live
    attempt of the same execution holds it; whether it was taken over from an earlier
    attempt of this execution (which may have sent it)."""

    before: dict[str, Any] | None
    in_progress: bool = False
    taken_over: bool = False


MAX_HELD_LISTED = 100  # held hosts one GET /targets lists (one BatchGetItem)
WAITING_COUNT_PAGES = 10  # HeldIndex pages a count of a hold's waiting tasks reads at most

# A status filter may skip most of an owner's entries: a request reads this many at most
# (ten pages of the keys-only index, each with its BatchGetItem) and answers what it found
# with a token to go on from, so it answers at once however many tasks the owner holds
# (read to the end, a large owner's listing ran past the API's 29 s and answered 500).
STATUS_READ_LIMIT = 10 * BATCH_GET_MAX


class TaskStore:
    def __init__(self, table_name: str):
        self._dynamodb = aws.resource("dynamodb")
        self._table = self._dynamodb.Table(table_name)
        self._conditional_failed = (
            self._table.meta.client.exceptions.ConditionalCheckFailedException
        )
        self._client = aws.client("dynamodb")  # a task's end with its callback's put
        self._cancelled = self._client.exceptions.TransactionCanceledException
        self._bodies = BodyStore(settings().bodies_table)

    @property
    def table_name(self) -> str:
        return str(self._table.name)

    def create(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """Write a new task, its body apart first if it is large (`tocsin.bodies`); if the
        id is taken, return the task already there instead."""
        stored = self._bodies.stored(item)
        try:
            self._table.put_item(Item=stored, ConditionExpression="attribute_not_exists(task_id)")
        except self._conditional_failed:
            return self.get(item["task_id"])
        return None

    def whole(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tasks with their targets and payloads, the bodies kept apart read in."""
        return self._bodies.attach(items)

    def put_body(self, item: dict[str, Any]) -> dict[str, Any]:
        """The attributes that hold a task version's body (`item` holds it whole): the body
        itself, or its key once written apart."""
        whole = {name: value for name, value in item.items() if name != "body"}  # the old key
        stored = self._bodies.stored(whole)
        return {name: stored[name] for name in (*CONTENT, "body") if name in stored}

    def get(self, task_id: str) -> dict[str, Any] | None:
        reply = self._table.get_item(Key={"task_id": task_id}, ConsistentRead=True)
        return reply.get("Item")

    def in_shard(
        self, shard: str, until_ms: int, after_ms: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The dispatch index's entries of one shard after `after_ms` (if given) up to
        `until_ms`, earliest first, all pages (none when the range is empty: DynamoDB
        refuses a BETWEEN whose bounds are the wrong way round)."""
        if after_ms is not None and after_ms >= until_ms:
            return
        if after_ms is None:
            key, values = "gsi_due_ms <= :until", {":until": until_ms}
        else:
            key, values = "gsi_due_ms BETWEEN :after AND :until", {":after": after_ms + 1}
            values[":until"] = until_ms
        yield from _every_page(
            self._table.query,
            IndexName=DUE_INDEX,
            KeyConditionExpression=f"gsi_pk = :shard AND {key}",
            ExpressionAttributeValues={":shard": shard, **values},
        )

    def statuses(self, task_ids: list[str]) -> dict[str, tuple[str, int]]:
        """Up to 100 tasks' status and version, read at once (eventually consistent: a
        look that finds a task unsettled reads it again, consistently)."""
        items = self._read(task_ids, ("task_id", "status", "version"))
        return {item["task_id"]: (item["status"], int(item["version"])) for item in items}

    def targets(self, task_ids: list[str]) -> list[dict[str, Any]]:
        """Up to 100 tasks' targets and what flow sends them alone, read at once (eventually
        consistent: for packing, not sending; `tocsin.call_keys`), a target in a body apart
        read from there."""
        return self._bodies.with_targets(self._read(task_ids, CALL_ATTRIBUTES))

    def horizon(self, name: str) -> int | None:
        """How far a reader of the due shards has read (None: it never has)."""
        item = self._table.get_item(Key=HORIZONS_KEY, ConsistentRead=True).get("Item", {})
        return int(item[name]) if name in item else None

    def advance_horizon(self, name: str, to_ms: int) -> None:
        """Move a horizon forward, never back: of two runs at once, the further one stands."""
        with suppress(self._conditional_failed):
            self._table.update_item(
                Key=HORIZONS_KEY,
                UpdateExpression="SET #h = :to",
                ConditionExpression="attribute_not_exists(#h) OR #h < :to",
                ExpressionAttributeNames={"#h": name},
                ExpressionAttributeValues={":to": to_ms},
            )

    def owned(
        self,
        owner: str,
        due_after_ms: int | None,
        due_before_ms: int | None,
        status: TaskStatus | None,
        limit: int,
        start: dict[str, Any] | None,
        schedule: str | None = None,
        latest_first: bool = False,
        tags: dict[str, str] | None = None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Up to `limit` of one owner's tasks (or one schedule's occurrences), earliest due
        first or latest first (strict bounds), carrying every one of `tags`, and the key to
        resume from (None when there are no more)."""
        low = None if due_after_ms is None else due_after_ms + 1
        high = None if due_before_ms is None else due_before_ms - 1
        values: dict[str, Any] = {}
        if schedule is None:
            index, key_names, key = OWNER_INDEX, OWNER_INDEX_KEY, "#o = :owner"
            values[":owner"] = owner
        else:
            index, key_names, key = SCHEDULE_INDEX, SCHEDULE_INDEX_KEY, "schedule_id = :sid"
            values[":sid"] = schedule
        if low is not None and high is not None:
            key += " AND due_ms BETWEEN :low AND :high"
        elif low is not None:
            key += " AND due_ms >= :low"
        elif high is not None:
            key += " AND due_ms <= :high"
        values.update({name: v for name, v in ((":low", low), (":high", high)) if v is not None})
        query: dict[str, Any] = {
            "IndexName": index,
            "KeyConditionExpression": key,
            "ExpressionAttributeValues": values,
            # a filter may skip most entries: read as many as one BatchGetItem takes
            "Limit": limit if status is None and not tags else BATCH_GET_MAX,
            "ScanIndexForward": not latest_first,
        }
        if schedule is None:
            query["ExpressionAttributeNames"] = {"#o": "owner"}
        if start is not None:
            query["ExclusiveStartKey"] = start
        items: list[dict[str, Any]] = []
        read = 0
        for entries, more in self._index_pages(query):
            for position, (entry, item) in enumerate(entries):
                if not _listed(entry, item, owner, status, tags or {}):
                    continue
                items.append(item)  # type: ignore[arg-type]  # _listed: not None
                if len(items) == limit:
                    rest = more or position < len(entries) - 1
                    return items, ({name: entry[name] for name in key_names} if rest else None)
            read += len(entries)
            if more and entries and read >= STATUS_READ_LIMIT:  # the rest on the next page
                return items, {name: entries[-1][0][name] for name in key_names}
        return items, None

    def last_fired(self, schedule_id: str, owner: str, now_ms: int) -> str | None:
        """When the schedule's latest fired occurrence fired, from its newest few due by now."""
        query: dict[str, Any] = {
            "IndexName": SCHEDULE_INDEX,
            "KeyConditionExpression": "schedule_id = :sid AND due_ms <= :now",
            "ExpressionAttributeValues": {":sid": schedule_id, ":now": now_ms},
            "ScanIndexForward": False,
            "Limit": LAST_FIRED_PAGE,
        }
        for looked, (entries, _) in enumerate(self._index_pages(query), start=1):
            fired = [
                str(item["fired_at"])
                for _, item in entries
                if item is not None and item["owner"] == owner and "fired_at" in item
            ]
            if fired:
                return max(fired)
            if looked == LAST_FIRED_LOOKS:
                return None
        return None

    def _index_pages(
        self, query: dict[str, Any]
    ) -> Iterator[tuple[list[tuple[dict[str, Any], dict[str, Any] | None]], bool]]:
        """The pages of a query on a keys-only index, each entry beside its task read from
        the table (None if it is gone), and whether more pages follow."""
        with _busy_when_throttled():  # the query's pages and their BatchGetItems
            for page in _pages(self._table.query, **query):
                entries = page.get("Items", [])
                tasks = self._tasks([entry["task_id"] for entry in entries])
                more = "LastEvaluatedKey" in page
                yield [(entry, tasks.get(entry["task_id"])) for entry in entries], more

    def _tasks(self, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Up to 100 tasks by id, what a summary shows of them (SUMMARY_ATTRIBUTES)."""
        return {item["task_id"]: item for item in self._read(task_ids, SUMMARY_ATTRIBUTES)}

    def _read(self, task_ids: list[str], attributes: tuple[str, ...]) -> list[dict[str, Any]]:
        """Up to 100 tasks' `attributes`, read at once (eventually consistent), each name
        an alias (DynamoDB reserves words such as `status`)."""
        keys = [{"task_id": task_id} for task_id in dict.fromkeys(task_ids)]
        names = {f"#a{i}": name for i, name in enumerate(attributes)}
        return batch_read(
            self._dynamodb,
            self._table.name,
            keys,
            ProjectionExpression=", ".join(names),
            ExpressionAttributeNames=names,
        )

    def cancel(
        self, task_id: str, owner: str, now_iso: str, expires_at: int
    ) -> dict[str, Any] | None:
        """CANCELLED if the owner's task is not claimed yet, for TTL to delete at
        `expires_at`; the task, or None if it was not."""
        return self._update_if_changeable(
            task_id,
            owner,
            "SET #s = :cancelled, updated_at = :now, expires_at = :expires "
            "REMOVE gsi_pk, gsi_due_ms, held_on",
            {":cancelled": TaskStatus.CANCELLED.value, ":now": now_iso, ":expires": expires_at},
        )

    def reschedule(
        self, task_id: str, owner: str, version: int, changes: dict[str, Any], now_iso: str
    ) -> dict[str, Any] | None:
        """The next version, PENDING with `changes` (its body among them: `put_body`), if
        still unclaimed at `version`; else None.

        The old version's execution fails its claim on the version and does nothing. (A
        PENDING task names no execution: a requeue or a redrive removed its claim's.)
        """
        names, values, sets = _assignments(changes, "c")
        # the body's other form, the old version's flow slot and its attempts
        old = [*(n for n in (*CONTENT, "body") if n not in changes), *PLANNED, *RETRY_STATE]
        gone = ", ".join([*old, "tries"])
        return self._update_if_changeable(
            task_id,
            owner,
            f"SET #v = :next, #s = :pending, attempts = :zero, updated_at = :now, {sets} "
            f"REMOVE {gone}",
            {":next": version + 1, ":now": now_iso, ":version": version, ":zero": 0, **values},
            extra_condition=" AND #v = :version",
            extra_names=names,
        )

    def _update_if_changeable(
        self,
        task_id: str,
        owner: str,
        update: str,
        values: dict[str, Any],
        extra_condition: str = "",
        extra_names: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        return self._update(
            task_id,
            update,
            f"#o = :owner AND {UNCLAIMED}" + extra_condition,
            {
                ":owner": owner,
                ":pending": TaskStatus.PENDING.value,
                ":retrying": TaskStatus.RETRYING.value,
                **values,
            },
            {"#o": "owner", **(extra_names or {})},
            returning="ALL_NEW",
        )

    def claim(self, task_id: str, version: int, holder: "Holder", now_ms: int) -> "Claim":
        """The exactly-once lock: one version to RUNNING for `holder`, the task as it was.

        An execution holds a task until the end of the attempt that claimed it (its lease):
        a retried write of that attempt finds its own claim, and a later attempt of the same
        execution (Fire's retry) takes the task over once the lease has run out or been
        released. Refused: held by another execution, changed (cancelled, rescheduled,
        done), or held by a live attempt of this execution (`Claim.in_progress`).
        """
        try:
            reply = self._table.update_item(
                Key={"task_id": task_id},
                UpdateExpression="SET #s = :running, execution = :execution, attempt = :attempt, "
                "lease_until = :lease",
                ConditionExpression=f"#v = :v AND ({UNCLAIMED} OR (#s = :running "
                "AND execution = :execution AND (attempt = :attempt OR lease_until < :now)))",
                ExpressionAttributeNames=STATUS_AND_VERSION,
                ExpressionAttributeValues={
                    ":running": TaskStatus.RUNNING.value,
                    ":pending": TaskStatus.PENDING.value,
                    ":retrying": TaskStatus.RETRYING.value,
                    ":execution": holder.execution,
                    ":attempt": holder.attempt,
                    ":lease": holder.lease_until_ms,
                    ":now": now_ms,
                    ":v": version,
                },
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except self._conditional_failed as refused:
            old = refused.response.get("Item", {})
            held_here = (
                old.get("status", {}).get("S") == TaskStatus.RUNNING.value
                and old.get("execution", {}).get("S") == holder.execution
                and old.get("version", {}).get("N") == str(version)
            )
            return Claim(None, in_progress=held_here)
        before = reply.get("Attributes", {})
        taken_over = before.get("status") == TaskStatus.RUNNING.value and (
            before.get("attempt") != holder.attempt
        )
        return Claim(before, taken_over=taken_over)

    def finish(
        self,
        task_id: str,
        version: int,
        attempt: str,
        status: TaskStatus,
        fields: dict[str, Any],
        callback: dict[str, Any] | None = None,
    ) -> bool:
        """A claimed version's end, by the attempt that holds it: SUCCEEDED or FAILED with
        `fields`, and the `callback` task it owes so ended, if any. True when it is so now,
        also when a retried write finds its own first try committed; False if the task is
        no longer this attempt's (it changed under the claim, or a later attempt took it
        over). A FAILED task's `fields` hold the index keys it waits at until its letter is
        sent (`letter_sent`); a SUCCEEDED task's entry stays where it is
        (`tocsin.index_keys`)."""
        names, values, sets = _assignments(fields, "f")
        old = self._update_with_callback(
            {
                "Key": {"task_id": task_id},
                "UpdateExpression": f"SET #s = :status, {sets} REMOVE {', '.join(RETRY_STATE)}",
                "ConditionExpression": "#s = :running AND #v = :v AND attempt = :attempt",
                "ExpressionAttributeNames": {**STATUS_AND_VERSION, **names},
                "ExpressionAttributeValues": {
                    ":status": status.value,
                    ":running": TaskStatus.RUNNING.value,
                    ":v": version,
                    ":attempt": attempt,
                    **values,
                },
            },
            callback,
        )
        return old is None or (
            old.get("status", {}).get("S") == status.value
            and old.get("version", {}).get("N") == str(version)
            and old.get("attempt", {}).get("S") == attempt
        )

    def _update_with_callback(
        self, update: dict[str, Any], callback: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """One conditional update of a task (update_item's arguments) and, if the task owes
        one, the put of its callback task, in one transaction (`tocsin.callbacks`): None if
        written, else the task as it was (DynamoDB's typed form) when the condition failed.
        The callback's body, if large, is written apart first (a body nothing names is
        harmless, and deleted in time)."""
        if callback is None:
            try:
                self._table.update_item(**update, ReturnValuesOnConditionCheckFailure="ALL_OLD")
            except self._conditional_failed as refused:
                return refused.response.get("Item", {})
            return None
        stored = self._bodies.stored(callback)
        change = {
            **update,
            "TableName": self._table.name,
            "Key": typed(update["Key"]),
            "ExpressionAttributeValues": typed(update["ExpressionAttributeValues"]),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        put = {
            "TableName": self._table.name,
            "Item": typed(stored),
            "ConditionExpression": "attribute_not_exists(task_id)",
        }
        try:
            self._client.transact_write_items(TransactItems=[{"Update": change}, {"Put": put}])
        except self._cancelled as error:
            reason = error.response["CancellationReasons"][0]
            if reason.get("Code") != "ConditionalCheckFailed":
                raise
            return reason.get("Item", {})
        return None

    def let_go(self, task_id: str, version: int, attempt: str) -> None:
        """End `attempt`'s hold on a task it claimed and did not finish: its lease is over."""
        self._update(
            task_id,
            "SET lease_until = :over",
            "#s = :running AND #v = :v AND attempt = :attempt",
            {":over": 0, ":running": TaskStatus.RUNNING.value, ":v": version, ":attempt": attempt},
        )

    def plan(self, task_id: str, version: int, attempt: str, planned_ms: int) -> bool:
        """Write when flow control lets a claimed task go (`tocsin.flow`): the API shows
        it, and a retry of the claim keeps it. Whether the task is still `attempt`'s."""
        return (
            self._update(
                task_id,
                "SET planned_ms = :planned, planned_at = :planned_at",
                "#s = :running AND #v = :v AND attempt = :attempt",
                {
                    ":planned": planned_ms,
                    ":planned_at": clock.to_iso(planned_ms),
                    ":running": TaskStatus.RUNNING.value,
                    ":v": version,
                    ":attempt": attempt,
                },
            )
            is not None
        )

    def hand_on(
        self, task_id: str, version: int, attempt: str, planned_ms: int, keys: dict[str, Any]
    ) -> bool:
        """Give a claimed task back, PENDING, for an execution that wakes for its flow's
        slot at `planned_ms` (past what `attempt` can wait for), in a check shard (`keys`)
        for a look once that execution should have settled it. Whether it was given."""
        return (
            self._update(
                task_id,
                "SET #s = :pending, planned_ms = :planned, planned_at = :planned_at, "
                "gsi_pk = :pk, gsi_due_ms = :look REMOVE execution, attempt, lease_until",
                "#s = :running AND #v = :v AND attempt = :attempt",
                {
                    ":pending": TaskStatus.PENDING.value,
                    ":planned": planned_ms,
                    ":planned_at": clock.to_iso(planned_ms),
                    ":pk": keys["gsi_pk"],
                    ":look": keys["gsi_due_ms"],
                    ":running": TaskStatus.RUNNING.value,
                    ":v": version,
                    ":attempt": attempt,
                },
            )
            is not None
        )

    def retry_later(self, task_id: str, version: int, attempt: str, fields: dict[str, Any]) -> bool:
        """Give a claimed task back, RETRYING, due at its next attempt: `fields` hold its
        attempts so far, their errors, and its place in the dispatch index at that time.
        Its `requeues` counts one more (its next execution needs a name of its own) and so
        does `retried` (the reconciler's count of executions that ended unsettled leaves
        these out). Whether it was given."""
        names, values, sets = _assignments(fields, "f")
        gone = ["execution", "attempt", "lease_until", *PLANNED]
        if "held_on" not in fields:  # a task that waited on its host's hold waits no more
            gone.append("held_on")
        return (
            self._update(
                task_id,
                f"SET #s = :retrying, {sets}, requeues = if_not_exists(requeues, :zero) + :one, "
                f"retried = if_not_exists(retried, :zero) + :one REMOVE {', '.join(gone)}",
                "#s = :running AND #v = :v AND attempt = :attempt",
                {
                    ":retrying": TaskStatus.RETRYING.value,
                    ":running": TaskStatus.RUNNING.value,
                    ":v": version,
                    ":attempt": attempt,
                    ":zero": 0,
                    ":one": 1,
                    **values,
                },
                names,
            )
            is not None
        )

    def waiting_on(self, hold: str, limit: int | None = None) -> Iterator[str]:
        """The ids of the tasks waiting on a host's hold (`tocsin.holds`), `limit` at most."""
        request = _held_on(hold) | ({} if limit is None else {"Limit": limit})
        entries = islice(_every_page(self._table.query, **request), limit)
        return (entry["task_id"] for entry in entries)

    def wake(self, task_id: str, hold: str, fields: dict[str, Any]) -> dict[str, Any] | None:
        """A task waiting on `hold` due again as `fields` say (its next attempt, its place in
        the dispatch index), under a name of its own (`requeues`, and `retried`: no
        execution ended unsettled); the task as it is now, or None if it waits no more
        (cancelled, rescheduled, woken already)."""
        names, values, sets = _assignments(fields, "f")
        return self._update(
            task_id,
            f"SET {sets}, requeues = requeues + :one, retried = retried + :one REMOVE held_on",
            "held_on = :hold AND #s = :retrying",
            {":hold": hold, ":retrying": TaskStatus.RETRYING.value, ":one": 1, **values},
            names,
            returning="ALL_NEW",
        )

    def held_hosts(self, owner: str) -> list[dict[str, Any]]:
        """The owner's held hosts (`tocsin.holds`), longest held first (MAX_HELD_LISTED at
        most), each with how many of the owner's tasks wait on it."""
        keys = self._table.query(
            IndexName=OWNER_INDEX,
            KeyConditionExpression="#o = :owner",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":owner": f"{HOLDS_OWNER}{owner}"},
            Limit=MAX_HELD_LISTED,
        )["Items"]
        wanted = [{"task_id": key["task_id"]} for key in keys]
        items = batch_read(self._dynamodb, self.table_name, wanted)
        for item in items:
            item["waiting"] = self._count_waiting(item["task_id"])
        return sorted(items, key=lambda item: int(item["held_since_ms"]))

    def _count_waiting(self, hold: str) -> int:
        """The tasks waiting on `hold`, counted on WAITING_COUNT_PAGES of HeldIndex at most."""
        pages = _pages(self._table.query, **_held_on(hold), Select="COUNT")
        return sum(page["Count"] for page in islice(pages, WAITING_COUNT_PAGES))

    def redrive(
        self,
        task_id: str,
        version: int,
        index_keys: dict[str, Any],
        now_iso: str,
        recovering: str | None = None,
    ) -> dict[str, Any] | None:
        """A FAILED task back to PENDING as version + 1, attempts reset, through the
        recovery flow `recovering` names if any (`tocsin.flow.recovery_flow`); None if it
        changed."""
        gone = [*RETRY_STATE]
        sets, more = "", {}
        if recovering is not None:
            gone.remove("recovering")
            sets, more = ", recovering = :recovering", {":recovering": recovering}
        return self._update(
            task_id,
            "SET #v = :next, #s = :pending, attempts = :zero, updated_at = :now, "
            f"gsi_pk = :pk, gsi_due_ms = :due, placed_ms = :placed{sets} "
            "REMOVE #e, expires_at, execution, attempt, lease_until, requeues, retried, tries, "
            f"exhausted_by, {HELD}, {', '.join(gone)}",
            "#s = :failed AND #v = :v",
            {
                **more,
                ":next": version + 1,
                ":v": version,
                ":pending": TaskStatus.PENDING.value,
                ":failed": TaskStatus.FAILED.value,
                ":zero": 0,
                ":now": now_iso,
                ":pk": index_keys["gsi_pk"],
                ":due": index_keys["gsi_due_ms"],
                ":placed": index_keys["placed_ms"],
            },
            {"#e": "error"},
            returning="ALL_NEW",
        )

    def requeue(
        self, task_id: str, version: int, requeues: int, keys: dict[str, Any], now_ms: int
    ) -> dict[str, Any] | None:
        """A RUNNING task whose execution ended without settling it, PENDING again at the
        same version (a send recorded in the sent log is not sent again), counted in
        `requeues`, which names its next execution anew, and put at `keys` for a look once
        that one should have settled it. None if it changed meanwhile, or if its claim's
        lease is still live (its invocation may still be sending)."""
        return self._update(
            task_id,
            "SET #s = :pending, requeues = :next, updated_at = :now, gsi_pk = :pk, "
            "gsi_due_ms = :look REMOVE execution, attempt, lease_until",
            "#s = :running AND #v = :v AND (attribute_not_exists(requeues) OR requeues = :seen)"
            f" AND {LEASE_OVER}",
            {
                ":pending": TaskStatus.PENDING.value,
                ":running": TaskStatus.RUNNING.value,
                ":v": version,
                ":seen": requeues,
                ":next": requeues + 1,
                ":now": clock.to_iso(now_ms),
                ":now_ms": now_ms,
                ":pk": keys["gsi_pk"],
                ":look": keys["gsi_due_ms"],
            },
            returning="ALL_NEW",
        )

    def rename(self, task_id: str, version: int, requeues: int, now_iso: str) -> bool:
        """A PENDING task whose execution name an ended execution holds (it ended without
        settling it): counted in `requeues`, which names its next execution anew. False if
        it changed meanwhile."""
        renamed = self._update(
            task_id,
            "SET requeues = :next, updated_at = :now",
            "#s = :pending AND #v = :v AND (attribute_not_exists(requeues) OR requeues = :seen)",
            {
                ":pending": TaskStatus.PENDING.value,
                ":v": version,
                ":seen": requeues,
                ":next": requeues + 1,
                ":now": now_iso,
            },
        )
        return renamed is not None

    def fail_in_flight(
        self,
        task_id: str,
        version: int,
        now_ms: int,
        fields: dict[str, Any],
        callback: dict[str, Any] | None = None,
    ) -> bool:
        """FAILED with `fields` (among them the index keys it waits at until its letter is
        sent), and the `callback` task it owes so ended, if any, if still RUNNING at
        `version` and its claim's lease is over; False if not."""
        names, values, sets = _assignments(fields, "f")
        update = {
            "Key": {"task_id": task_id},
            "UpdateExpression": f"SET #s = :failed, {sets}",
            "ConditionExpression": f"#s = :running AND #v = :v AND {LEASE_OVER}",
            "ExpressionAttributeNames": {**STATUS_AND_VERSION, **names},
            "ExpressionAttributeValues": {
                ":failed": TaskStatus.FAILED.value,
                ":running": TaskStatus.RUNNING.value,
                ":v": version,
                ":now_ms": now_ms,
                **values,
            },
        }
        return self._update_with_callback(update, callback) is None

    def letter_sent(self, task_id: str, version: int) -> None:
        """A FAILED version's dead letter is sent: out of the check shards for good."""
        self._update(
            task_id,
            "REMOVE gsi_pk, gsi_due_ms",
            "#s = :failed AND #v = :v",
            {":failed": TaskStatus.FAILED.value, ":v": version},
        )

    def look_again(self, task_id: str, version: int, keys: dict[str, Any]) -> None:
        """Put a task not yet settled in a check shard (`keys`) for another look: one whose
        start failed or was made late, one whose execution still runs, a FAILED one whose
        letter SQS refused."""
        self._update(
            task_id,
            "SET gsi_pk = :pk, gsi_due_ms = :look",
            "#s IN (:pending, :retrying, :running, :failed) AND #v = :v",
            {
                ":pk": keys["gsi_pk"],
                ":look": keys["gsi_due_ms"],
                ":pending": TaskStatus.PENDING.value,
                ":retrying": TaskStatus.RETRYING.value,
                ":running": TaskStatus.RUNNING.value,
                ":failed": TaskStatus.FAILED.value,
                ":v": version,
            },
        )

    def forget(self, task_id: str, version: int) -> None:
        """Take a settled task out of the check shards, where it needs no more looks."""
        self._update(
            task_id,
            "REMOVE gsi_pk, gsi_due_ms",
            "#s IN (:succeeded, :cancelled) AND #v = :v",
            {
                ":succeeded": TaskStatus.SUCCEEDED.value,
                ":cancelled": TaskStatus.CANCELLED.value,
                ":v": version,
            },
        )

    def _update(
        self,
        task_id: str,
        update: str,
        condition: str,
        values: dict[str, Any],
        names: dict[str, str] | None = None,
        returning: str = "NONE",
    ) -> dict[str, Any] | None:
        """One conditional update of a task (`#s` is its status, `#v` its version): the
        attributes asked for by `returning` ({} for none), or None if the condition failed."""
        said = update + condition  # DynamoDB refuses names the expressions do not use
        names = {k: v for k, v in STATUS_AND_VERSION.items() if k in said} | (names or {})
        try:
            reply = self._table.update_item(
                Key={"task_id": task_id},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues=returning,
            )
        except self._conditional_failed:
            return None
        return reply.get("Attributes", {})


def typed(values: dict[str, Any]) -> dict[str, Any]:
    """`values` in DynamoDB's typed form, as a plain client's calls and transactions take
    them (the resource's own client converts them itself)."""
    return {name: _serialize(value) for name, value in values.items()}


def _assignments(fields: dict[str, Any], prefix: str) -> tuple[dict[str, str], dict[str, Any], str]:
    """`fields` as placeholder names, placeholder values and `#n = :v, …` to SET them."""
    names = {f"#{prefix}{i}": name for i, name in enumerate(fields)}
    values = {f":{prefix}{i}": value for i, value in enumerate(fields.values())}
    sets = ", ".join(f"{name} = {value}" for name, value in zip(names, values, strict=True))
    return names, values, sets


@contextmanager
def _busy_when_throttled() -> Iterator[None]:
    """A read DynamoDB still throttles after botocore's retries is `Busy` (503): the same
    request may well succeed a moment later, where a 500 would say it never will."""
    try:
        yield
    except ClientError as error:
        if aws.is_throttling(error):
            raise Busy(BUSY) from error
        raise


def _listed(
    entry: dict[str, Any],
    item: dict[str, Any] | None,
    owner: str,
    status: TaskStatus | None,
    tags: dict[str, str],
) -> bool:
    """Whether a listing shows the task read for an index entry: the owner's, in the asked
    status, with the asked tags, and still where the entry says (a task rescheduled since
    the index was read is listed at its new due time, from its new entry)."""
    return (
        item is not None
        and item["owner"] == owner
        and item["due_ms"] == entry["due_ms"]
        and (status is None or item["status"] == status.value)
        and has_tags(item, tags)
    )


def _held_on(hold: str) -> dict[str, Any]:
    """A HeldIndex query for the tasks waiting on one hold."""
    return {
        "IndexName": HELD_INDEX,
        "KeyConditionExpression": "held_on = :hold",
        "ExpressionAttributeValues": {":hold": hold},
    }


def _pages(read: Any, **request: Any) -> Iterator[dict[str, Any]]:
    """The pages of a query or scan, each read from where the one before stopped."""
    while True:
        page = read(**request)
        yield page
        if "LastEvaluatedKey" not in page:
            return
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _every_page(read: Any, **request: Any) -> Iterator[dict[str, Any]]:
    """The items of a query or scan, page after page."""
    for page in _pages(read, **request):
        yield from page.get("Items", [])
