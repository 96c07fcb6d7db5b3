"""What a task is: its statuses, its types, the stored item and the view callers see."""

import json
from enum import StrEnum
from typing import Any

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


class TaskStatus(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
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


def idempotency_key(task_id: str, version: int) -> str:
    """The key every action of one task version carries, so a retried action is recognised."""
    return f"{task_id}:{version}"


def task_view(item: dict[str, Any]) -> dict[str, Any]:
    """The task as a caller sees it: stored JSON strings decoded, internal attributes left out."""
    view: dict[str, Any] = {
        "id": item["task_id"],
        "status": item["status"],
        "version": int(item["version"]),
        "due_at": item["due_at"],
        "type": item["task_type"],
        "target": json.loads(item["target"]),
        "payload": json.loads(item["payload"]),
        "created_at": item["created_at"],
    }
    for name in ("fired_at", "error"):
        if name in item:
            view[name] = item[name]
    if "lateness_ms" in item:
        view["lateness_ms"] = int(item["lateness_ms"])
    if "result" in item:
        view["result"] = json.loads(item["result"])
    return view
