"""What a task is: its statuses, its types, the stored item and the view callers see."""

import contextlib
import json
import re
from enum import StrEnum
from typing import Any

from tocsin import clock
from tocsin.flow import flow_view
from tocsin.index_keys import due_index_keys
from tocsin.retry import RetryPolicy, policy_of
from tocsin.settings import Settings

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # a submitted task's id
# any task's: a schedule's occurrence holds a `.`, a callback `.<version>.callback` more
TASK_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,80}$"
SCHEDULE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,48}$"  # leaves room for `.<due ms>` (tocsin.occurrences)


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"  # failed for now: due again at its next attempt (tocsin.retry)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class TaskType(StrEnum):
    WEBHOOK = "webhook"
    LAMBDA = "lambda"
    EVENTBRIDGE = "eventbridge"
    SQS = "sqs"
    SNS = "sns"
    EMAIL = "email"


# SendMessageBatch, PublishBatch and PutEvents take ten entries a call: tasks of these types
# due together at one queue, topic or bus go out ten to a call (tocsin.targets.base).
BATCHED_TYPES = frozenset({TaskType.SQS, TaskType.SNS, TaskType.EVENTBRIDGE})
BATCH_ENTRIES = 10


# A role session's unique id (`AROA…:session`) and, as a local principal, its ARN.
_ROLE_SESSION_ID = re.compile(r"^(AROA[A-Z0-9]+):.+$")
_ROLE_SESSION_ARN = re.compile(r"^arn:([\w-]+):sts::(\d{12}):assumed-role/([^/]+)/.+$")


def owner_id(principal_id: str) -> str:
    """The owner a caller's tasks belong to, from the kind of principal it is.

    A role's sessions share their role's tasks: the unique id `AROA…:session` (what API
    Gateway's IAM authorizer reports as `userId` and SQS as `SenderId`) keeps the role id,
    and an assumed-role ARN (a local principal) becomes the role's ARN. Every other id is
    one principal and is kept whole: an IAM user (`AIDA…`), the root (the account id), a
    federated user (`<account>:<name>`, one owner per name), any other local name.
    """
    if session := _ROLE_SESSION_ID.match(principal_id):
        return session[1]
    if session := _ROLE_SESSION_ARN.match(principal_id):
        partition, account, role = session.groups()
        return f"arn:{partition}:iam::{account}:role/{role}"
    return principal_id


def task_item(
    task_id: str,
    due_ms: int,
    task_type: TaskType,
    content: tuple[str, str],
    policy: RetryPolicy,
    owner: str,
    now_ms: int,
    config: Settings,
) -> dict[str, Any]:
    """A PENDING task's item, in the finder's due index; `content` is (target, payload)."""
    target_json, stored_payload = content
    return {
        "task_id": task_id,
        "version": 1,
        "status": TaskStatus.PENDING.value,
        "due_at": clock.to_iso(due_ms),
        "due_ms": due_ms,
        "task_type": task_type.value,
        "target": target_json,
        "payload": stored_payload,
        "max_attempts": policy.max_attempts,
        **({"retry": kept} if (kept := policy.stored()) else {}),
        "owner": owner,
        "created_at": clock.to_iso(now_ms),
        **due_index_keys(task_id, due_ms, config, now_ms),
    }


def idempotency_key(task_id: str, version: int) -> str:
    """The key every action of one task version carries, so a retried action is recognised."""
    return f"{task_id}:{version}"


def error_view(stored: str) -> dict[str, str]:
    """The state machine stores `{"Error", "Cause"}`; a Lambda's Cause is its error JSON."""
    error = json.loads(stored)
    cause = error.get("Cause", "")
    with contextlib.suppress(ValueError, AttributeError):
        cause = json.loads(cause).get("errorMessage", cause)
    return {"type": error.get("Error", ""), "message": str(cause)}


# What a listing reads of each task: all a summary shows, and the index keys a page resumes
# from; never the target or payload (up to 200 KB each: a page of them passed Lambda's 6 MB).
SUMMARY_ATTRIBUTES = (
    "task_id",
    "owner",
    "schedule_id",
    "status",
    "version",
    "due_at",
    "due_ms",
    "task_type",
    "max_attempts",
    "retry",
    "attempts",
    "next_attempt_at",
    "exhausted_by",
    "created_at",
    "updated_at",
    "fired_at",
    "lateness_ms",
    "result",
    "error",
    "flow",
    "planned_at",
    "held_ms",
    "tags",
)


def task_view(item: dict[str, Any]) -> dict[str, Any]:
    """The task as a caller sees it: stored JSON strings decoded, internal attributes left
    out; beyond a listing's summary, its target and payload, the execution that claimed it
    and the attempts that failed (when any did)."""
    view = {**task_summary(item), "target": json.loads(item["target"])}
    view["payload"] = json.loads(item["payload"])
    if "execution" in item:
        view["execution"] = item["execution"]
    if "tries" in item:
        view["tries"] = json.loads(item["tries"])
    if "callbacks" in item:
        view |= json.loads(item["callbacks"])
    if "callback_of" in item:
        view["callback_of"] = item["callback_of"]
    return view


def task_summary(item: dict[str, Any]) -> dict[str, Any]:
    """The task as a listing shows it: all but its target and payload."""
    policy = policy_of(item)
    view: dict[str, Any] = {
        "id": item["task_id"],
        "status": item["status"],
        "version": int(item["version"]),
        "due_at": item["due_at"],
        "type": item["task_type"],
        "max_attempts": policy.max_attempts,
        "retry": policy.model_dump(),
        "attempts": int(item.get("attempts", 0)),
        "created_at": item["created_at"],
    }
    for name in ("fired_at", "updated_at", "next_attempt_at", "exhausted_by"):
        if name in item:
            view[name] = item[name]
    if "lateness_ms" in item:
        view["lateness_ms"] = int(item["lateness_ms"])
    if "result" in item:
        view["result"] = json.loads(item["result"])
    if "error" in item:
        view["error"] = error_view(item["error"])
    if "tags" in item:
        view["tags"] = dict(item["tags"])
    return view | flow_view(item)
