"""Outcome callbacks: a task that names `on_success` or `on_failure` is followed, once it
ends so, by a task of its own, its callback, that tells that target the outcome.

The callback is put in one transaction with the final mark that ends its task
(`TaskStore.finish`, `TaskStore.fail_in_flight`): a task never ends without the callback it
owes, and no retried mark makes a second, since its id is the version's
(`<task id>.<version>.callback`) and its put is conditional. From there it is a task like
any other: started by what ended its task (else the reconciler starts it, as any task its
writer did not), claimed once, retried and dead-lettered on its own, and whatever becomes
of it, its task's status stays. Its delivery carries the key `<task id>:<version>:callback`.
It tells the outcome, never the task's payload or target (a target may hold secrets). A
cancelled task has none, and a callback has no callback.
"""

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from tocsin.index_keys import due_index_keys
from tocsin.model import TaskStatus, TaskType, error_view, task_item
from tocsin.retry import RetryPolicy
from tocsin.settings import Settings

OUTCOMES = {TaskStatus.SUCCEEDED: "on_success", TaskStatus.FAILED: "on_failure"}
SUFFIX = ".callback"
# What a task's callback needs of its item, kept by the executor from the claim's reply.
NEEDED = ("task_id", "version", "due_at", "owner", "callbacks")


class Callback(BaseModel):
    """Where a task's outcome goes: a target of any type, checked as a task's is."""

    model_config = ConfigDict(extra="forbid")

    type: TaskType
    target: dict[str, Any]
    retry: RetryPolicy | None = None  # the callback task's own (tocsin.retry)


def needed(item: dict[str, Any]) -> dict[str, Any] | None:
    """What `callback_item` needs of a task's item, if it names a callback (else None)."""
    return {name: item[name] for name in NEEDED} if "callbacks" in item else None


def callback_id(task_id: str, version: int) -> str:
    return f"{task_id}.{version}{SUFFIX}"


def callback_item(
    item: dict[str, Any],
    status: TaskStatus,
    fields: dict[str, Any],
    now_ms: int,
    written_by_ms: int,
    config: Settings,
) -> dict[str, Any] | None:
    """The PENDING callback task that `item`, ended as `status` with its final mark's
    `fields`, owes now (None if it names no callback for that outcome), due at once.

    Its writer starts it once the mark is written, by `written_by_ms` at the latest (the
    invocation's end: its retries may take that long). Should the writer die first, the
    reconciler starts it, as any task its writer did not: it reads each due entry once, a
    look-after past its time, from where it read last. So the entry is placed at
    `written_by_ms`: placed at `now_ms`, a write that committed late could appear behind
    what the reconciler had read already, and never be read."""
    wanted = json.loads(item.get("callbacks", "{}")).get(OUTCOMES.get(status, ""))
    if wanted is None:
        return None
    task_id, version = item["task_id"], int(item["version"])
    outcome: dict[str, Any] = {
        "task_id": task_id,
        "version": version,
        "status": status.value,
        "due_at": item["due_at"],
        "attempts": int(fields.get("attempts", item.get("attempts", 0))),
    }
    for name in ("fired_at", "lateness_ms", "exhausted_by"):
        if name in fields:
            outcome[name] = fields[name]
    if "result" in fields:
        outcome["result"] = json.loads(fields["result"])
    if "error" in fields:
        outcome["error"] = error_view(fields["error"])
    content = (json.dumps(wanted["target"]), json.dumps(outcome, separators=(",", ":")))
    own_id, policy = callback_id(task_id, version), RetryPolicy(**wanted.get("retry", {}))
    task = task_item(
        own_id, now_ms, TaskType(wanted["type"]), content, policy, item["owner"], now_ms, config
    )
    placed = due_index_keys(own_id, now_ms, config, max(written_by_ms, now_ms))
    return {**task, **placed, "callback_of": task_id}


def callback_key(task_id: str) -> str | None:
    """The idempotency key a callback task's delivery carries (None for another task)."""
    if not task_id.endswith(SUFFIX):
        return None
    parent, _, version = task_id.removesuffix(SUFFIX).rpartition(".")
    return f"{parent}:{version}:callback"
