"""A task after submission: read it, list an owner's tasks, cancel it, reschedule it.

Every operation is scoped to the caller: a task of another owner is reported as not found.
Cancel and reschedule are conditional writes that succeed only while the task is unclaimed
(PENDING), so racing the executor's claim gives exactly one winner.
"""

import base64
import binascii
import json
import re
from decimal import Decimal
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
)

from tocsin import clock
from tocsin.bodies import CONTENT
from tocsin.dispatch import dispatch_if_due_soon, stop_own_execution
from tocsin.errors import Conflict, InvalidTask, NotFound, TaskError
from tocsin.index_keys import due_index_keys
from tocsin.model import (
    SCHEDULE_ID_PATTERN,
    TASK_ID_PATTERN,
    TaskStatus,
    task_summary,
    task_view,
)
from tocsin.redrive import redrive_failed
from tocsin.settings import Settings
from tocsin.store import OWNER_INDEX_KEY, SCHEDULE_INDEX_KEY, TaskStore
from tocsin.submit import Timing, invalid, payload_json
from tocsin.tags import Tags, wanted_tags

MAX_PAGE = 100
# A page's summaries in JSON stop short of this (Lambda answers 6 MB at most): results and
# errors are the only fields of unbounded size a summary has.
MAX_PAGE_BYTES = 1024 * 1024


class Listing(BaseModel):
    """The query string of `GET /tasks`."""

    model_config = ConfigDict(extra="forbid")

    status: TaskStatus | None = None
    due_before: AwareDatetime | None = None
    due_after: AwareDatetime | None = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    schedule: str | None = Field(default=None, pattern=SCHEDULE_ID_PATTERN)
    next: str | None = Field(default=None, max_length=2048)
    order: Literal["asc", "desc"] = "asc"


# `tag[<key>]=<value>`, any of them: a task listed carries each (tocsin.tags)
TagsAsked = TypeAdapter(Tags)


class Change(Timing):
    """The body of `PATCH /tasks/{id}`: a new time (`due_at` or `delay`), a new payload, or both."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})  # checked in reschedule

    payload: JsonValue = None


def check_id(task_id: str) -> str:
    if not re.fullmatch(TASK_ID_PATTERN, task_id):
        raise InvalidTask("id: must match [A-Za-z0-9_.-]{1,64}", field="id")
    return task_id


def _owned(store: TaskStore, task_id: str, owner: str) -> dict[str, Any]:
    item = store.get(check_id(task_id))
    if item is None or item.get("owner") != owner:
        raise NotFound(f"id: no task {task_id!r}", field="id")
    return item


def _unchangeable(store: TaskStore, task_id: str, owner: str, verb: str) -> Conflict:
    """Why a conditional change failed: not found (raised), or a conflict naming the status."""
    item = _owned(store, task_id, owner)
    return Conflict(f"id: task {task_id!r} is {item['status']}, it cannot be {verb}", "id")


def get_task(task_id: str, owner: str, config: Settings) -> dict[str, Any]:
    store = TaskStore(config.tasks_table)
    return task_view(store.whole([_owned(store, task_id, owner)])[0])


def held_targets(owner: str, config: Settings) -> dict[str, Any]:
    """The owner's hosts held back for failing (`tocsin.holds`), longest held first."""
    return {
        "held": [
            {
                "host": item["host"],
                "task_type": item["task_type"],
                "held_since": item["held_since"],
                "failures": int(item["failures"]),
                "last_error": item.get("last_error"),
                "waiting": item["waiting"],
            }
            for item in TaskStore(config.tasks_table).held_hosts(owner)
        ]
    }


def encode_page_key(key: dict[str, Any], owner: str) -> str:
    """A `next` token: the index key to resume from, and whose listing it belongs to."""
    plain = {name: int(v) if isinstance(v, Decimal) else v for name, v in key.items()}
    return base64.urlsafe_b64encode(json.dumps(plain | {"owner": owner}).encode()).decode()


def decode_page_key(
    token: str, owner: str, names: tuple[str, ...], kind: type[TaskError] = InvalidTask
) -> dict[str, Any]:
    """The resume key (of an index keyed by `names`) of a `next` token; a token made for
    another owner or another listing is refused as a `kind` of request (tasks', schedules')."""
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        key = None
    if (
        not isinstance(key, dict)
        or set(key) != {*names, "owner"}
        or key["owner"] != owner
        or not all(isinstance(v, str) or type(v) is int for v in key.values())
    ):
        raise kind("next: not a token from a previous page of this listing", field="next")
    return {name: key[name] for name in names}


def list_tasks(query: dict[str, str], owner: str, config: Settings) -> dict[str, Any]:
    """One page of the owner's tasks, earliest due first (`order=desc`: latest first);
    `next` fetches the following page."""
    wanted, rest = wanted_tags(query)
    try:
        listing = Listing.model_validate(rest)
    except ValidationError as error:
        raise invalid(error) from None
    try:
        TagsAsked.validate_python(wanted)
    except ValidationError as error:
        first = error.errors()[0]
        key = next((str(part) for part in first["loc"] if str(part) != "[key]"), "")
        raise InvalidTask(f"tag[{key}]: {first['msg']}", field=f"tag[{key}]") from None
    after = clock.to_ms(listing.due_after) if listing.due_after else None
    before = clock.to_ms(listing.due_before) if listing.due_before else None
    if after is not None and before is not None and before - after < 2:
        raise InvalidTask("due_before: must be later than due_after", field="due_before")
    names = SCHEDULE_INDEX_KEY if listing.schedule else OWNER_INDEX_KEY
    start = decode_page_key(listing.next, owner, names) if listing.next else None
    items, last = TaskStore(config.tasks_table).owned(
        owner,
        after,
        before,
        listing.status,
        listing.limit,
        start,
        listing.schedule,
        latest_first=listing.order == "desc",
        tags=wanted,
    )
    tasks, size = [], 0
    for item in items:
        summary = task_summary(item)
        size += len(json.dumps(summary))
        if tasks and size > MAX_PAGE_BYTES:  # the rest on the next page, from the last shown
            last = {name: tasks[-1][1][name] for name in names}
            break
        tasks.append((summary, item))
    return {
        "tasks": [summary for summary, _ in tasks],
        "next": encode_page_key(last, owner) if last else None,
    }


def _with_body(item: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    """`item` as stored, with the target and payload `whole` holds (no read of its body)."""
    return {**item, **{name: whole[name] for name in CONTENT}}


def cancel_task(task_id: str, owner: str, config: Settings) -> dict[str, Any]:
    """Cancel an unclaimed task, then stop its own execution (its claim fails anyway)."""
    store, now_ms = TaskStore(config.tasks_table), clock.now_ms()
    item = store.cancel(check_id(task_id), owner, clock.to_iso(now_ms), config.expires_at(now_ms))
    if item is None:
        raise _unchangeable(store, task_id, owner, "cancelled")
    stop_own_execution(item, "cancelled", config)
    return task_view(store.whole([item])[0])


def retry_task(
    task_id: str, owner: str, config: Settings, recovering: str | None = None
) -> dict[str, Any]:
    """A FAILED task again, as its next version, fired at once: what `tocsin redrive` does
    for an operator, done by the task's owner (`recovering`: through that recovery flow,
    as a bulk retry's tasks go)."""
    store = TaskStore(config.tasks_table)
    item = _owned(store, task_id, owner)
    if item["status"] != TaskStatus.FAILED:
        message = f"id: task {task_id!r} is {item['status']}, only a FAILED one is retried"
        raise Conflict(message, "id")
    retried = redrive_failed(store, item, config, recovering)
    if retried is None:
        raise _unchangeable(store, task_id, owner, "retried")
    return task_view(store.whole([retried])[0])


def reschedule_task(task_id: str, body: Any, owner: str, config: Settings) -> dict[str, Any]:
    """Move an unclaimed task to a new time and/or payload as its next version."""
    try:
        change = Change.model_validate(body)
    except ValidationError as error:
        raise invalid(error) from None
    if not change.model_fields_set:
        raise InvalidTask("body: give due_at, delay or payload", field="body")
    store = TaskStore(config.tasks_table)
    current = _owned(store, task_id, owner)
    now = clock.now_ms()
    changes: dict[str, Any] = {}
    if change.due_at is not None or change.delay is not None:
        due_ms = change.due_ms(now, now, config)
        changes |= {"due_ms": due_ms, "due_at": clock.to_iso(due_ms)}
    if "payload" in change.model_fields_set:
        changes["payload"] = payload_json(change.payload)
    due_ms = changes.get("due_ms", int(current["due_ms"]))
    changes |= due_index_keys(task_id, due_ms, config, now)
    version = int(current["version"])
    [whole] = store.whole([current])
    # the next version's body, written apart again if large: its key, and its time to live
    nxt = {**whole, **changes, "version": version + 1}
    changes = {name: value for name, value in changes.items() if name not in CONTENT}
    changes |= store.put_body(nxt)
    item = store.reschedule(task_id, owner, version, changes, clock.to_iso(now))
    if item is None:
        raise _unchangeable(store, task_id, owner, "rescheduled")
    stop_own_execution(current, "rescheduled", config)
    dispatch_if_due_soon(item, config)
    return task_view(_with_body(item, nxt))
