"""The reconciler: no task stays SCHEDULED or RUNNING for good.

A task in flight sits in a check shard of the dispatch index at the time its execution
must have settled it by (`index_keys.SETTLE_AFTER_MS` after its due time). Each finder
run looks at the ones past that time and at their execution:

* still running (a long retry): look again later;
* ended without settling the task (its invocation crashed or timed out for good and the
  batch went to the DLQ, a finder died between start and mark and no run came back, the
  embedded runtime restarted): the task goes back to PENDING at the same version, its
  `requeues` counted, which gives its next execution a name not yet taken. The version
  and so the idempotency key stay: if the lost execution had sent it, the idempotency
  record answers instead of a second send;
* after MAX_REQUEUES such ends: FAILED, with a dead letter of its own.

It also sends the dead letters that FAILED tasks still owe past their grace (their failer
died or met an SQS outage between the mark and the send: see `tocsin.dead_letter`). Once
SQS refuses one, the run sends no more (each refusal costs botocore's retries, out of the
run's time to dispatch), and that letter is tried again `CHECK_AGAIN_MS` later; the rest
wait for the next run. `letters_owed` in the finder's report counts what is left owed.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tocsin import aws, clock
from tocsin.dead_letter import send_letter
from tocsin.index_keys import check_shard, due_index_keys, owed_letter_keys
from tocsin.model import TaskStatus
from tocsin.observability import logger
from tocsin.settings import Settings
from tocsin.store import TaskStore

MAX_REQUEUES = 3
CHECK_AGAIN_MS = 5 * 60 * 1000


class Reconciled(StrEnum):
    REQUEUED = "requeued"
    FAILED = "failed_stuck"
    STILL_RUNNING = "still_running"
    CHANGED = "changed"  # settled meanwhile: nothing to do
    LETTER_SENT = "letter_sent"  # a FAILED task's owed dead letter
    LETTER_OWED = "letter_owed"  # and still owed: SQS refused it again


@dataclass
class ReconcileReport:
    outcomes: Counter[Reconciled] = field(default_factory=Counter)
    tasks: list[tuple[str, Reconciled]] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        stuck = sum(self.outcomes[o] for o in (Reconciled.REQUEUED, Reconciled.FAILED))
        return {
            "stuck": stuck,
            Reconciled.REQUEUED.value: self.outcomes[Reconciled.REQUEUED],
            Reconciled.FAILED.value: self.outcomes[Reconciled.FAILED],
            "letters_sent": self.outcomes[Reconciled.LETTER_SENT],
            "letters_owed": self.outcomes[Reconciled.LETTER_OWED],
        }


def _execution_running(execution_arn: str | None) -> bool:
    """Whether the execution still runs; one that is gone (or never was) does not."""
    if not execution_arn:
        return False
    sfn = aws.client("stepfunctions")
    try:
        return sfn.describe_execution(executionArn=execution_arn)["status"] == "RUNNING"
    except sfn.exceptions.ExecutionDoesNotExist:
        return False


def _settle(store: TaskStore, item: dict[str, Any], config: Settings, now_ms: int) -> Reconciled:
    task_id, version = item["task_id"], int(item["version"])
    execution = item.get("claimed_by") or item.get("execution_arn")
    if _execution_running(execution):
        store.check_later(task_id, version, now_ms + CHECK_AGAIN_MS)
        return Reconciled.STILL_RUNNING
    requeues = int(item.get("requeues", 0))
    if requeues < MAX_REQUEUES:
        keys = due_index_keys(task_id, int(item["due_ms"]), config)
        requeued = store.requeue(task_id, version, requeues, keys, clock.to_iso(now_ms))
        return Reconciled.REQUEUED if requeued else Reconciled.CHANGED
    error = {
        "Error": "TaskStuck",
        "Cause": f"{requeues + 1} executions ended without settling it (last: {execution})",
    }
    failed = store.fail_in_flight(
        task_id,
        version,
        {
            "error": json.dumps(error),
            "expires_at": config.expires_at(int(item["due_ms"])),
            **owed_letter_keys(task_id, now_ms, config),
        },
    )
    if failed is None:
        return Reconciled.CHANGED
    send_letter(store, task_id, version, item["task_type"], execution or "", error)
    return Reconciled.FAILED


def _send_owed_letter(store: TaskStore, item: dict[str, Any], now_ms: int) -> Reconciled:
    execution = item.get("claimed_by") or item.get("execution_arn") or ""
    error = json.loads(item["error"])
    task_id, version, task_type = item["task_id"], int(item["version"]), item["task_type"]
    if send_letter(store, task_id, version, task_type, execution, error):
        return Reconciled.LETTER_SENT
    store.check_later(task_id, version, now_ms + CHECK_AGAIN_MS)
    return Reconciled.LETTER_OWED


def reconcile(config: Settings, until_ms: int) -> ReconcileReport:
    """Settle every task in flight whose check time is at or before `until_ms`, and send
    the dead letters owed by then."""
    store, now_ms, report = TaskStore(config.tasks_table), clock.now_ms(), ReconcileReport()
    sqs_refused = False
    for shard in range(config.shards):
        for entry in list(store.in_shard(check_shard(shard), until_ms)):
            item = store.get(entry["task_id"])
            if not item or int(item["version"]) != int(entry["version"]):
                continue  # changed since the index was read
            if item["status"] == TaskStatus.FAILED and sqs_refused:
                outcome = Reconciled.LETTER_OWED  # for the next run
            elif item["status"] == TaskStatus.FAILED:
                outcome = _send_owed_letter(store, item, now_ms)
                sqs_refused = outcome is Reconciled.LETTER_OWED
            elif item["status"] in (TaskStatus.SCHEDULED, TaskStatus.RUNNING):
                outcome = _settle(store, item, config, now_ms)
            else:
                continue  # settled since the index was read
            report.outcomes[outcome] += 1
            report.tasks.append((item["task_id"], outcome))
            if outcome is not Reconciled.STILL_RUNNING:
                logger.warning("task reconciled", task_id=item["task_id"], outcome=outcome)
    return report
