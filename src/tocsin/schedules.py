"""Recurring schedules: create, read, list, edit, pause and resume, delete, and preview.

A schedule is owned like a task (another owner's is not found) and refused like one: a 4xx
naming the field, nothing written. Its occurrences become tasks as their time comes near
(tocsin.occurrences); each is listed by `GET /tasks?schedule=<id>` with its status,
lateness and result. The same id and body again is the schedule as stored; another body is
a conflict.
"""

import hashlib
import json
import time
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from tocsin import clock
from tocsin.bodies import split_schedule
from tocsin.callbacks import Callback
from tocsin.dispatch import dispatch_all, look_again_now
from tocsin.errors import Conflict, InvalidSchedule, NotFound
from tocsin.flow import Flow
from tocsin.index_keys import shard_of
from tocsin.lifecycle import MAX_PAGE, decode_page_key, encode_page_key
from tocsin.model import (
    SCHEDULE_ID_PATTERN,
    TaskType,
)
from tocsin.observability import logger
from tocsin.occurrences import (
    DELETED,
    ScheduleRefused,
    as_it_was,
    finish_leftovers,
    leftovers_key,
    leftovers_record,
    made_tasks,
    materialize,
    occurrences_of,
)
from tocsin.recurrence import MAX_UPCOMING, Occurrences, parse
from tocsin.retry import MAX_ATTEMPTS, RetryPolicy, policy_of
from tocsin.schedule_store import SCHEDULE_PAGE_KEY, ScheduleState, ScheduleStore
from tocsin.settings import Settings
from tocsin.store import TaskStore
from tocsin.submit import IsoTime, checked_callbacks, checked_content, checked_policy, invalid
from tocsin.tags import Tags

MAX_EXPRESSION = 256
DISPATCH_BUDGET_S = 10.0  # of an API request, for starting the occurrences due soon
LEFTOVERS_BUDGET_S = 12.0  # of an API request, for cancelling a changed schedule's leftovers
CHANGE_TRIES = 3  # an edit or delete written again after a finder moved the schedule on


class CatchUp(StrEnum):
    SKIP = "skip"  # occurrences missed while nothing ran are not fired
    LATEST = "latest"  # the latest missed one fires at once, late


class ScheduleSpec(BaseModel):
    """The body of `POST /schedules`."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=SCHEDULE_ID_PATTERN)
    expression: str = Field(
        max_length=MAX_EXPRESSION,
        description="cron(minutes hours day-of-month month day-of-week year), "
        "rate(value seconds|minutes|hours|days) or at(yyyy-mm-ddThh:mm:ss[.fff])",
    )
    timezone: str = Field(default="UTC", max_length=64, description="an IANA time zone")
    start_at: IsoTime | None = None
    end_at: IsoTime | None = None
    type: TaskType
    target: dict[str, Any]
    payload: JsonValue = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)  # retry's
    retry: RetryPolicy | None = None  # each occurrence's, as a task's (tocsin.retry)
    catch_up: CatchUp = CatchUp.SKIP
    on_success: Callback | None = None  # each occurrence's, as a task's (tocsin.callbacks)
    on_failure: Callback | None = None
    flow: Flow | None = None  # each occurrence's, as a task's (tocsin.flow)
    tags: Tags | None = None  # each occurrence's, as a task's (tocsin.tags)


class ScheduleListing(BaseModel):
    """The query string of `GET /schedules`."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    next: str | None = Field(default=None, max_length=2048)


class ScheduleChange(BaseModel):
    """The body of `PATCH /schedules/{id}`: what changes; `state` pauses or resumes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    expression: str | None = Field(default=None, max_length=MAX_EXPRESSION)
    timezone: str | None = Field(default=None, max_length=64)
    start_at: IsoTime | None = None
    end_at: IsoTime | None = None
    type: TaskType | None = None
    target: dict[str, Any] | None = None
    payload: JsonValue = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)
    retry: RetryPolicy | None = None
    catch_up: CatchUp | None = None
    on_success: Callback | None = None  # null: none from now on
    on_failure: Callback | None = None
    flow: Flow | None = None  # null: none from now on
    tags: Tags | None = None  # null: none from now on
    state: Literal["ENABLED", "PAUSED"] | None = None


TIMING = ("expression", "timezone", "start_at", "end_at")


def _store(config: Settings) -> ScheduleStore:
    return ScheduleStore(config.schedules_table, config.tasks_table)


def _ms(moment: Any) -> int | None:
    return None if moment is None else clock.to_ms(moment)


def _schedule_item(
    schedule_id: str, spec: ScheduleSpec, owner: str, now_ms: int, anchor_ms: int, config: Settings
) -> dict[str, Any]:
    """A checked schedule as stored, ENABLED at its first occurrence from now; raises
    InvalidSchedule naming the field when it has none or anything is wrong."""
    start, end = _ms(spec.start_at), _ms(spec.end_at)
    if start is not None and end is not None and end <= start:
        raise InvalidSchedule("end_at: must be after start_at", field="end_at")
    if end is not None and end <= now_ms:
        raise InvalidSchedule("end_at: is in the past", field="end_at")
    if start is not None and start - now_ms > config.horizon_days * 86_400_000:
        raise InvalidSchedule(f"start_at: more than {config.horizon_days} days ahead", "start_at")
    rule = parse(spec.expression, spec.timezone, start if start is not None else anchor_ms)
    target, payload = checked_content(spec.type, spec.target, spec.payload, InvalidSchedule)
    wanted = {"on_success": spec.on_success, "on_failure": spec.on_failure}
    callbacks = checked_callbacks(wanted, InvalidSchedule)
    policy = checked_policy(spec.retry, spec.max_attempts, InvalidSchedule)
    item: dict[str, Any] = {
        "schedule_id": schedule_id,
        "owner": owner,
        "expression": spec.expression.strip(),
        "timezone": spec.timezone,
        "anchor_ms": start if start is not None else anchor_ms,
        "task_type": spec.type.value,
        "target": target,
        "payload": payload,
        "max_attempts": policy.max_attempts,
        **({"retry": kept} if (kept := policy.stored()) else {}),
        "catch_up": spec.catch_up.value,
        "state": ScheduleState.ENABLED.value,
        "revision": 1,
        "occurrences": 0,
        "missed": 0,
        "created_at": clock.to_iso(now_ms),
        **({"start_ms": start} if start is not None else {}),
        **({"end_ms": end} if end is not None else {}),
        **({"callbacks": callbacks} if callbacks else {}),
        **({"flow": spec.flow.stored()} if spec.flow else {}),
        **({"tags": spec.tags} if spec.tags else {}),
    }
    first = Occurrences(rule, start, end).first_from(now_ms)
    if first is None:
        raise InvalidSchedule(
            "expression: has no occurrence from now on"
            + (" before end_at" if end is not None else " (an at() in the past?)"),
            field="expression",
        )
    return item | _due_keys(schedule_id, first, config)


def _due_keys(schedule_id: str, next_ms: int, config: Settings) -> dict[str, Any]:
    """What puts an ENABLED schedule in the finder's due index at its next occurrence."""
    shard = str(shard_of(schedule_id, config.shards))
    return {"next_ms": next_ms, "gsi_pk": shard, "gsi_next_ms": next_ms}


def _body_hash(owner: str, spec: ScheduleSpec) -> str:
    """What identifies a creating request, its retries included (times as instants; the
    callbacks and flow only where named, so that a schedule without keeps the hash it had)."""
    optional = ("on_success", "on_failure", "flow", "retry", "tags")
    unnamed = {name for name in optional if getattr(spec, name) is None}
    body = spec.model_dump(mode="json", exclude={"id", "start_at", "end_at", *unnamed})
    body |= {"start_at": _ms(spec.start_at), "end_at": _ms(spec.end_at)}
    return hashlib.sha256(json.dumps([owner, body], sort_keys=True).encode()).hexdigest()


def _stored_spec(item: dict[str, Any]) -> dict[str, Any]:
    """A stored schedule's fields as a request (and a view) names them."""
    return {
        "expression": item["expression"],
        "timezone": item["timezone"],
        "start_at": _iso(item.get("start_ms")),
        "end_at": _iso(item.get("end_ms")),
        "type": item["task_type"],
        "target": json.loads(item["target"]),
        "payload": json.loads(item["payload"]),
        "max_attempts": int(item["max_attempts"]),
        "retry": policy_of(item).model_dump(),
        "catch_up": item["catch_up"],
        **json.loads(item.get("callbacks", "{}")),
        **({"flow": json.loads(item["flow"])} if "flow" in item else {}),
        **({"tags": dict(item["tags"])} if "tags" in item else {}),
    }


def schedule_view(item: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The schedule as its owner sees it: `next_due_at` is its next occurrence from now
    (COMPLETED: every occurrence is a task already, the last perhaps still to fire)."""
    state = item["state"]
    next_due = occurrences_of(item).first_from(now_ms) if state != ScheduleState.PAUSED else None
    view: dict[str, Any] = {
        "id": item["schedule_id"],
        **_stored_spec(item),
        "state": state,
        "revision": int(item["revision"]),
        "next_due_at": _iso(next_due),
        "occurrences": int(item.get("occurrences", 0)),
        "missed": int(item.get("missed", 0)),
        "created_at": item["created_at"],
    }
    if "updated_at" in item:
        view["updated_at"] = item["updated_at"]
    return view


def _view(store: ScheduleStore, item: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """`schedule_view` of a schedule as stored, its body read in if it is apart."""
    [whole] = store.whole([item])
    return schedule_view(whole, now_ms)


def _iso(ms: Any) -> str | None:
    return None if ms is None else clock.to_iso(int(ms))


def _owned(store: ScheduleStore, schedule_id: str, owner: str) -> dict[str, Any]:
    item = store.get(schedule_id)
    if item is None or item.get("owner") != owner:
        raise NotFound(f"id: no schedule {schedule_id!r}", field="id")
    return item


def _start_due_soon(task_ids: list[str], config: Settings) -> None:
    """Start the executions of occurrences the finder's next run could be too late for."""
    if not task_ids:
        return
    report = dispatch_all(
        made_tasks(task_ids, config), config, time.monotonic() + DISPATCH_BUDGET_S
    )
    look_again_now(report.left, config)


def _turn_near_occurrences(item: dict[str, Any], config: Settings) -> None:
    """What the finder would do for this schedule, now: its occurrences due within the
    look-ahead made tasks, and those started, within the request's budget (the finder's
    next run makes the rest, and makes them all if the writes keep being refused)."""
    now = clock.now_ms()
    until, deadline = now + config.lookahead_s * 1000, time.monotonic() + DISPATCH_BUDGET_S
    try:
        written = materialize(_store(config), item, config, now, until, deadline)
    except ScheduleRefused as refused:
        logger.warning("occurrences left to the finder", schedule_id=item["schedule_id"])
        written = refused.written
    _start_due_soon(written, config)


def create_schedule(body: Any, owner: str, config: Settings) -> tuple[dict[str, Any], bool]:
    """A new schedule (or the identical one already stored), and whether it is new."""
    try:
        spec = ScheduleSpec.model_validate(body)
    except ValidationError as error:
        raise invalid(error, kind=InvalidSchedule) from None
    now = clock.now_ms()
    schedule_id = spec.id or uuid.uuid4().hex
    item = _schedule_item(schedule_id, spec, owner, now, now, config)
    item["body_hash"] = _body_hash(owner, spec)
    store = _store(config)
    existing = store.create(item)
    if existing is not None:
        if existing.get("body_hash") != item["body_hash"]:
            raise Conflict(f"id: schedule {schedule_id!r} exists with another body", "id")
        return _view(store, existing, now), False
    _turn_near_occurrences(split_schedule(item)[0], config)  # as stored: its body apart
    return _view(store, store.get(schedule_id) or item, clock.now_ms()), True


def get_schedule(schedule_id: str, owner: str, config: Settings) -> dict[str, Any]:
    store, now = _store(config), clock.now_ms()
    view = _view(store, _owned(store, schedule_id, owner), now)
    fired = TaskStore(config.tasks_table).last_fired(schedule_id, owner, now)
    return view | {"last_fired_at": fired}


def list_schedules(query: dict[str, str], owner: str, config: Settings) -> dict[str, Any]:
    """One page of the owner's schedules by id; `next` fetches the following page."""
    try:
        listing = ScheduleListing.model_validate(query)
    except ValidationError as error:
        raise invalid(error, kind=InvalidSchedule) from None
    start = (
        decode_page_key(listing.next, owner, SCHEDULE_PAGE_KEY, InvalidSchedule)
        if listing.next
        else None
    )
    store = _store(config)
    items, last = store.owned(owner, listing.limit, start)
    now = clock.now_ms()
    return {
        "schedules": [schedule_view(item, now) for item in store.whole(items)],
        "next": encode_page_key(last, owner) if last else None,
    }


def upcoming(schedule_id: str, count: int, owner: str, config: Settings) -> dict[str, Any]:
    """The schedule's next `count` occurrences after now, within its start and end (what
    its expression gives: a paused schedule makes none of them until resumed)."""
    if not 1 <= count <= MAX_UPCOMING:
        raise InvalidSchedule(f"count: a whole number 1-{MAX_UPCOMING}", field="count")
    item = _owned(_store(config), schedule_id, owner)
    found = occurrences_of(item).upcoming(clock.now_ms(), count)
    return {"id": schedule_id, "occurrences": [clock.to_iso(moment) for moment in found]}


def _merged(item: dict[str, Any], change: ScheduleChange) -> ScheduleSpec:
    """The schedule's spec with the change laid over it, checked as a new one would be."""
    stored = _stored_spec(item)
    changes = change.model_dump(mode="json", exclude_unset=True, exclude={"state"})
    if "max_attempts" in changes:  # the stored policy's count gives way to the new one
        stored["retry"] = {k: v for k, v in stored["retry"].items() if k != "max_attempts"}
    if "retry" in changes:
        stored.pop("max_attempts")
    try:
        return ScheduleSpec.model_validate(stored | changes)
    except ValidationError as error:
        raise invalid(error, kind=InvalidSchedule) from None


def update_schedule(schedule_id: str, body: Any, owner: str, config: Settings) -> dict[str, Any]:
    """Edit, pause or resume a schedule as its next revision. Occurrences already tasks and
    still unclaimed follow it: rewritten where the new revision has them too, else
    cancelled. A resumed schedule goes on from now (what it missed while paused is not
    fired)."""
    try:
        change = ScheduleChange.model_validate(body)
    except ValidationError as error:
        raise invalid(error, kind=InvalidSchedule) from None
    if not change.model_fields_set:
        raise InvalidSchedule("body: give what changes", field="body")
    store = _store(config)
    current = _owned(store, schedule_id, owner)
    for _ in range(CHANGE_TRIES):
        now = clock.now_ms()
        [whole] = store.whole([current])
        item = _edited(whole, change, config, now)
        revision = int(item["revision"])
        leftovers = leftovers_record(current, revision, str(revision), config, now)
        if store.replace(current, item, leftovers):
            break
        seen, current = current, _owned(store, schedule_id, owner)
        if current["revision"] != seen["revision"]:  # another edit came first
            raise _changed_meanwhile(schedule_id)
    else:  # a finder moved it on each time
        raise _changed_meanwhile(schedule_id)
    _turn_near_occurrences(split_schedule(item)[0], config)  # as stored: its body apart
    finish_leftovers(store, leftovers, config, time.monotonic() + LEFTOVERS_BUDGET_S)
    return _view(store, store.get(schedule_id) or item, clock.now_ms())


def _edited(
    current: dict[str, Any], change: ScheduleChange, config: Settings, now: int
) -> dict[str, Any]:
    """The schedule's next revision: `current` with the change laid over it."""
    spec = _merged(current, change)
    retimed = bool(change.model_fields_set & set(TIMING))
    anchor = now if retimed else int(current["anchor_ms"])
    state = change.state or (
        ScheduleState.ENABLED if current["state"] == ScheduleState.COMPLETED else current["state"]
    )
    item = _schedule_item(current["schedule_id"], spec, current["owner"], now, anchor, config)
    kept = {name: current[name] for name in ("body_hash", "created_at", "occurrences", "missed")}
    item |= kept | {"revision": int(current["revision"]) + 1, "updated_at": clock.to_iso(now)}
    if state == ScheduleState.PAUSED:
        item["state"] = ScheduleState.PAUSED.value
        for name in ("next_ms", "gsi_pk", "gsi_next_ms"):
            item.pop(name)
    return item


def _changed_meanwhile(schedule_id: str) -> Conflict:
    return Conflict(f"id: schedule {schedule_id!r} changed meanwhile, try again", "id")


def delete_schedule(schedule_id: str, owner: str, config: Settings) -> dict[str, Any]:
    """Delete a schedule and cancel its occurrences not yet claimed; the schedule as it was.
    A retry of a delete whose cancels did not all end (its request ran out of time, or was
    killed) goes on with them; the finder does too, if none comes."""
    store, now = _store(config), clock.now_ms()
    deadline = time.monotonic() + LEFTOVERS_BUDGET_S
    current = store.get(schedule_id)
    if current is None or current.get("owner") != owner:
        pending = store.get(leftovers_key(schedule_id, DELETED))
        if pending is None or pending.get("leftovers_owner") != owner:
            raise NotFound(f"id: no schedule {schedule_id!r}", field="id")
        finish_leftovers(store, pending, config, deadline)
        return _view(store, as_it_was(pending), now)
    for _ in range(CHANGE_TRIES):
        leftovers = leftovers_record(current, int(current["revision"]) + 1, DELETED, config, now)
        if store.replace(current, None, leftovers):
            break
        current = _owned(store, schedule_id, owner)  # edited or moved on meanwhile: again
    else:
        raise _changed_meanwhile(schedule_id)
    finish_leftovers(store, leftovers, config, deadline)
    return _view(store, current, now)
