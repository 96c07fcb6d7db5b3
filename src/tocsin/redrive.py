"""Redrive: give FAILED tasks from the dead-letter queue another run, as their next version.

A DLQ message names one failed task (`task_id`, `version`: the executor's), or a batch
whose executor invocation failed as a whole (`batch.tasks`: the state machine's); each
task is judged on its own. A task still FAILED at that version goes back to PENDING as
version + 1, in the due index with its attempts reset, and fires at once (its due time
has passed). The message is deleted
once the task is redriven, or when it no longer applies (the task changed or is gone).
A task is redriven once per run: if it fails again before the run ends, that dead letter
stays on the queue for the next run, instead of the run chasing it version after version.
A second letter for a version already redriven is a copy (a letter may be sent twice;
see `tocsin.dead_letter`): it is deleted as such. A batch's tasks are still PENDING or
RUNNING at their version when its letter lands: the reconciler settles them when it looks
(started again, requeued, or FAILED with a letter of their own), and the batch's letter
stays until none of them is left so.
"""

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tocsin import aws, clock
from tocsin.dispatch import dispatch_if_due_soon
from tocsin.index_keys import due_index_keys
from tocsin.settings import Settings
from tocsin.store import TaskStore

FAILED_AGAIN = "failed again, left for the next run"
COPY = "a copy of a letter redriven"
IN_FLIGHT = "in flight, for the reconciler (letter kept)"


@dataclass
class RedriveReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    tasks: list[tuple[str, int, str]] = field(default_factory=list)  # id, version, outcome

    def add(self, task_id: str, version: int, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self.tasks.append((task_id, version, outcome))


def _messages(queue_url: str) -> Iterator[dict[str, Any]]:
    sqs = aws.client("sqs")
    while True:
        batch = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages", [])
        if not batch:
            return
        yield from batch


def _failed_versions(message: dict[str, Any]) -> list[tuple[str, int]] | None:
    """The task versions a dead letter names; None if it is not one of ours."""
    try:
        body = json.loads(message["Body"])
        named = body["batch"]["tasks"] if "batch" in body else [body]
        return [(str(task["task_id"]), int(task["version"])) for task in named]
    except (ValueError, KeyError, TypeError):
        return None


def redrive(
    queue_url: str,
    config: Settings,
    dry_run: bool = False,
    progress: Callable[[str, int, str], None] | None = None,
) -> RedriveReport:
    """Redrive every FAILED task on the dead-letter queue; `dry_run` only reports."""
    store = TaskStore(config.tasks_table)
    sqs = aws.client("sqs")
    report = RedriveReport()
    redriven: dict[str, int] = {}  # task id: the version this run redrove
    kept = []  # left on the queue (unreadable, a dry run, failed again); visible at the end
    for message in _messages(queue_url):
        named = _failed_versions(message)
        outcomes = []
        for task_id, version in named if named is not None else [("?", 0)]:
            if named is None:
                outcome = "unreadable"
            elif task_id in redriven:
                outcome = COPY if version <= redriven[task_id] else FAILED_AGAIN
            else:
                outcome = _redrive_one(store, config, task_id, version, dry_run)
            if outcome == "redriven":
                redriven[task_id] = version
            report.add(task_id, version, outcome)
            if progress:
                progress(task_id, version, outcome)
            outcomes.append(outcome)
        if dry_run or {"unreadable", FAILED_AGAIN, IN_FLIGHT} & set(outcomes):
            kept.append(message["ReceiptHandle"])
        else:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    for handle in kept:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=0)
    return report


def _redrive_one(
    store: TaskStore, config: Settings, task_id: str, version: int, dry_run: bool
) -> str:
    item = store.get(task_id)
    if item is None:
        return "gone"
    if int(item["version"]) == version and item["status"] in ("PENDING", "RUNNING"):
        return IN_FLIGHT
    if item["status"] != "FAILED" or int(item["version"]) != version:
        return "changed"
    if dry_run:
        return "would redrive"
    return "changed" if redrive_failed(store, item, config) is None else "redriven"


def redrive_failed(
    store: TaskStore, item: dict[str, Any], config: Settings, recovering: str | None = None
) -> dict[str, Any] | None:
    """A FAILED task (`item`, as read) back to PENDING as its next version, started at once
    (its due time has passed), through the recovery flow `recovering` names, if any; the
    task as it is now, or None if it changed meanwhile."""
    now = clock.now_ms()
    task_id, version = item["task_id"], int(item["version"])
    keys = due_index_keys(task_id, int(item["due_ms"]), config, now)
    redriven = store.redrive(task_id, version, keys, clock.to_iso(now), recovering)
    if redriven is not None:
        dispatch_if_due_soon(redriven, config)
    return redriven
