"""Submitting a task: validate, write it once, and dispatch at once if it is due soon.

The id is the idempotency key: the same id with the same body (and owner) returns the task
already stored; the same id with anything else is a conflict and leaves that task untouched.
"""

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from tocsin import clock
from tocsin.dispatch import DueTask, dispatch
from tocsin.errors import InvalidTask, TaskConflict
from tocsin.model import ID_PATTERN, TaskStatus, TaskType, task_view
from tocsin.settings import MAX_PAYLOAD_BYTES, Settings, settings
from tocsin.store import TaskStore
from tocsin.targets import parse_target


class Submission(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=ID_PATTERN)
    due_at: AwareDatetime
    type: TaskType
    target: dict[str, Any]
    payload: JsonValue = None


@dataclass(frozen=True)
class Submitted:
    task: dict[str, Any]
    created: bool


def _invalid(error: ValidationError, prefix: str = "") -> InvalidTask:
    first = error.errors()[0]
    field = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    return InvalidTask(f"{field or 'body'}: {first['msg']}", field=field or None)


def shard_of(task_id: str, shards: int) -> int:
    """A stable shard per id, spreading a hot minute over the index's partitions."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big") % shards


def new_item(body: Any, owner: str, now_ms: int, config: Settings) -> dict[str, Any]:
    """Validate a submission and build its PENDING item; raises InvalidTask naming the field."""
    try:
        submission = Submission.model_validate(body)
    except ValidationError as error:
        raise _invalid(error) from None
    try:
        target = parse_target(submission.type, submission.target)
    except ValidationError as error:
        raise _invalid(error, "target") from None
    due_ms = clock.to_ms(submission.due_at)
    if due_ms - now_ms > config.horizon_days * 86_400_000:
        raise InvalidTask(f"due_at: more than {config.horizon_days} days ahead", field="due_at")
    payload_json = json.dumps(submission.payload, separators=(",", ":"))
    if len(payload_json.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidTask(f"payload: larger than {MAX_PAYLOAD_BYTES} bytes", field="payload")
    target_json = target.model_dump_json()
    task_id = submission.id or uuid.uuid4().hex
    body_hash = hashlib.sha256(
        json.dumps([owner, due_ms, submission.type, target_json, payload_json]).encode()
    ).hexdigest()
    return {
        "task_id": task_id,
        "version": 1,
        "status": TaskStatus.PENDING.value,
        "due_at": clock.to_iso(due_ms),
        "due_ms": due_ms,
        "task_type": submission.type.value,
        "target": target_json,
        "payload": payload_json,
        "owner": owner,
        "body_hash": body_hash,
        "created_at": clock.to_iso(now_ms),
        "gsi_pk": str(shard_of(task_id, config.shards)),
        "gsi_due_ms": due_ms,
    }


def submit_task(body: Any, owner: str, config: Settings | None = None) -> Submitted:
    """Store a new task (or return the identical one already stored) and dispatch if due soon."""
    config = config or settings()
    now = clock.now_ms()
    item = new_item(body, owner, now, config)
    store = TaskStore(config.tasks_table)
    existing = store.create(item)
    if existing is not None:
        if existing.get("body_hash") != item["body_hash"]:
            raise TaskConflict(f"id: task {item['task_id']!r} exists with another body", "id")
        return Submitted(task_view(existing), created=False)
    if item["due_ms"] <= now + config.lookahead_s * 1000:
        dispatch(DueTask(item["due_ms"], item["task_id"], 1), config, store)
        item = store.get(item["task_id"]) or item
    return Submitted(task_view(item), created=True)
