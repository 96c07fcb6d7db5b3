"""Submitting a task: validate, write it once, and dispatch at once if it is due soon.

The id is the idempotency key: the same id with the same body (and owner) returns the task
already stored; the same id with anything else is a conflict and leaves that task untouched.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    WithJsonSchema,
)

from tocsin import clock
from tocsin.callbacks import Callback
from tocsin.dispatch import dispatch_if_due_soon
from tocsin.errors import Conflict, InvalidTask, TaskError
from tocsin.flow import Flow
from tocsin.model import (
    ID_PATTERN,
    TaskStatus,
    TaskType,
    task_item,
    task_view,
)
from tocsin.retry import MAX_ATTEMPTS, RetryPolicy, given_policy
from tocsin.settings import MAX_PAYLOAD_BYTES, Settings, settings
from tocsin.store import TaskStore
from tocsin.tags import Tags
from tocsin.targets import parse_target

DELAY_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "format": "duration"},
        {"type": "null"},
    ],
    "description": "seconds, or an ISO-8601 duration such as PT90S",
}


def _text_only(value: object) -> object:
    """A number is not a time: pydantic would read `12345` as epoch seconds, in 1970."""
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an ISO-8601 string with a time zone")
    return value


IsoTime = Annotated[AwareDatetime, BeforeValidator(_text_only)]


class Timing(BaseModel):
    """When a task is due: an absolute `due_at`, or a `delay` after the request (or event)."""

    model_config = ConfigDict(extra="forbid")

    due_at: IsoTime | None = None
    # Seconds, or an ISO-8601 duration; the document says both (pydantic's says a string).
    delay: Annotated[timedelta | None, WithJsonSchema(DELAY_SCHEMA)] = Field(
        default=None, ge=timedelta(0)
    )

    def due_ms(self, base_ms: int, now_ms: int, config: Settings) -> int:
        """The due time in epoch ms; raises InvalidTask if absent, doubled, beyond the
        horizon, or a `due_at` further in the past than a late fire can be meant (a
        mistyped year). A delay from an event that arrives late still fires, late."""
        if (self.due_at is None) == (self.delay is None):
            raise InvalidTask("due_at: give exactly one of due_at and delay", field="due_at")
        if self.due_at is not None:
            due_ms, field = clock.to_ms(self.due_at), "due_at"
        else:
            assert self.delay is not None
            due_ms, field = base_ms + self.delay // timedelta(milliseconds=1), "delay"
        if due_ms - now_ms > config.horizon_days * 86_400_000:
            raise InvalidTask(f"{field}: more than {config.horizon_days} days ahead", field=field)
        if field == "due_at" and now_ms - due_ms > config.max_overdue_s * 1000:
            raise InvalidTask(
                f"{field}: more than {config.max_overdue_s} seconds in the past", field=field
            )
        return due_ms


class Submission(Timing):
    id: str | None = Field(default=None, pattern=ID_PATTERN)
    type: TaskType
    target: dict[str, Any]
    payload: JsonValue = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)  # retry's
    retry: RetryPolicy | None = None
    on_success: Callback | None = None
    on_failure: Callback | None = None
    flow: Flow | None = None
    tags: Tags | None = None


@dataclass(frozen=True)
class Submitted:
    task: dict[str, Any]
    created: bool
    # the stored item while it is PENDING: a retried submission starts it again too, in
    # case the first one stored it and died before its start
    item: dict[str, Any] | None = None


def invalid(
    error: ValidationError, prefix: str = "", kind: type[TaskError] = InvalidTask
) -> TaskError:
    """The first pydantic error as a `kind` of refusal (a task's, or a schedule's) naming
    its field (dotted path)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "") or "body"
    return kind(f"{field}: {first['msg']}", field=field)


def payload_json(payload: JsonValue, kind: type[TaskError] = InvalidTask) -> str:
    """The payload as stored; raises `kind` when it is over the size limit."""
    encoded = json.dumps(payload, separators=(",", ":"))
    if len(encoded.encode()) > MAX_PAYLOAD_BYTES:
        raise kind(f"payload: larger than {MAX_PAYLOAD_BYTES} bytes", field="payload")
    return encoded


def checked_content(
    task_type: TaskType,
    target: dict[str, Any],
    payload: JsonValue,
    kind: type[TaskError] = InvalidTask,
) -> tuple[str, str]:
    """A task's (or a schedule's) target and payload as stored; `kind` of refusal naming
    the field at fault."""
    try:
        parsed = parse_target(task_type, target)
    except ValidationError as error:
        raise invalid(error, "target", kind) from None
    return parsed.model_dump_json(), payload_json(payload, kind)


def checked_policy(
    retry: RetryPolicy | None, max_attempts: int | None, kind: type[TaskError] = InvalidTask
) -> RetryPolicy:
    """A task's (or a schedule's) retry policy (`given_policy`); `kind` of refusal naming
    `max_attempts` when it disagrees with `retry`."""
    try:
        return given_policy(retry, max_attempts)
    except ValueError as error:
        raise kind(str(error), field="max_attempts") from None


def checked_callbacks(
    wanted: dict[str, Callback | None], kind: type[TaskError] = InvalidTask
) -> str | None:
    """The callbacks a task (or a schedule) names, as stored (`tocsin.callbacks`): JSON of
    each one's type and checked target, None if it names none; `kind` of refusal naming
    the field at fault."""
    checked = {}
    for name, callback in wanted.items():
        if callback is None:
            continue
        try:
            target = parse_target(callback.type, callback.target)
        except ValidationError as error:
            raise invalid(error, f"{name}.target", kind) from None
        checked[name] = {"type": callback.type.value, "target": target.model_dump(mode="json")}
        if callback.retry is not None:
            checked[name]["retry"] = callback.retry.model_dump()
    return json.dumps(checked, separators=(",", ":")) if checked else None


def new_item(
    body: Any, owner: str, now_ms: int, config: Settings, base_ms: int | None = None
) -> dict[str, Any]:
    """Validate a submission and build its PENDING item; raises InvalidTask naming the field.

    A `delay` counts from `base_ms` (an event's time), else from `now_ms`.
    """
    try:
        submission = Submission.model_validate(body)
    except ValidationError as error:
        raise invalid(error) from None
    due_ms = submission.due_ms(base_ms if base_ms is not None else now_ms, now_ms, config)
    content = checked_content(submission.type, submission.target, submission.payload)
    callbacks = checked_callbacks(
        {"on_success": submission.on_success, "on_failure": submission.on_failure}
    )
    task_id = submission.id or uuid.uuid4().hex
    # What the caller asked for (a delay, not the time it resolved to), so a retried
    # request is recognised as the same one; callbacks and a flow only where named, so a
    # task without them keeps the hash it had before they existed.
    asked = [clock.to_ms(submission.due_at)] if submission.due_at else [str(submission.delay)]
    policy = checked_policy(submission.retry, submission.max_attempts)
    hashed = [owner, *asked, submission.type, *content, policy.max_attempts]
    named = {
        "callbacks": callbacks,
        "flow": submission.flow and submission.flow.stored(),
        "retry": policy.stored(),
        "tags": submission.tags,
    }
    named = {name: value for name, value in named.items() if value}
    body_hash = hashlib.sha256(
        json.dumps(hashed + list(named.values()), default=str).encode()
    ).hexdigest()
    item = task_item(task_id, due_ms, submission.type, content, policy, owner, now_ms, config)
    return {**item, "body_hash": body_hash, **named}


def submit_task(
    body: Any,
    owner: str,
    config: Settings | None = None,
    base_ms: int | None = None,
    dispatch: bool = True,
) -> Submitted:
    """Store a new task (or return the identical one already stored) and dispatch it if due
    soon (unless `dispatch` is False: its caller dispatches a batch of them together)."""
    config = config or settings()
    item = new_item(body, owner, clock.now_ms(), config, base_ms)
    store = TaskStore(config.tasks_table)
    existing = store.create(item)
    if existing is not None:
        if existing.get("body_hash") != item["body_hash"]:
            raise Conflict(f"id: task {item['task_id']!r} exists with another body", "id")
        [stored] = store.whole([existing])
        pending = stored if stored["status"] == TaskStatus.PENDING else None
        if pending is not None and dispatch:
            dispatch_if_due_soon(pending, config)
        return Submitted(task_view(stored), created=False, item=pending)
    if dispatch:
        dispatch_if_due_soon(item, config)
    return Submitted(task_view(item), created=True, item=item)
