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

The finder dispatches after it, so the reconciler keeps to a deadline and to itself: a
task whose settling meets a fault (a throttled DescribeExecution, a refused write) is
counted and left in its check shard for the next run, what the deadline leaves unread
waits there too, and each execution is described once a run, however many of its
batch's tasks it left stuck.
"""

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws, clock
from tocsin.dead_letter import send_letter
from tocsin.dispatch import execution_arn
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
    FAULT = "reconcile_faults"  # AWS refused a step: left for the next run


@dataclass
class ReconcileReport:
    outcomes: Counter[Reconciled] = field(default_factory=Counter)
    tasks: list[tuple[str, Reconciled]] = field(default_factory=list)
    cut_short: bool = False  # the deadline came first: the rest waits for the next run

    def as_dict(self) -> dict[str, int]:
        stuck = sum(self.outcomes[o] for o in (Reconciled.REQUEUED, Reconciled.FAILED))
        return {
            "stuck": stuck,
            Reconciled.REQUEUED.value: self.outcomes[Reconciled.REQUEUED],
            Reconciled.FAILED.value: self.outcomes[Reconciled.FAILED],
            "letters_sent": self.outcomes[Reconciled.LETTER_SENT],
            "letters_owed": self.outcomes[Reconciled.LETTER_OWED],
            "reconcile_faults": self.outcomes[Reconciled.FAULT],
            "reconcile_cut_short": int(self.cut_short),
        }


@dataclass
class Letters:
    """The run's dead letters: once SQS refuses one, the run tries no more (each refusal
    spends botocore's retries out of the run's time); they stay owed."""

    refused: bool = False

    def send(self, store: TaskStore, item: dict[str, Any], execution: str, error: Any) -> bool:
        """Whether the letter went out (False: refused, or not tried after a refusal)."""
        if self.refused:
            return False
        task_id, version, task_type = item["task_id"], int(item["version"]), item["task_type"]
        sent = send_letter(store, task_id, version, task_type, execution, error)
        self.refused = self.refused or not sent
        return sent


class Executions:
    """Whether executions still run, each described once a run: a dead batch leaves up to
    BatchSize tasks stuck, all naming the same execution. A refused look is kept too, and
    raised again for the execution's other tasks, each then left for the next run."""

    def __init__(self) -> None:
        self._running: dict[str, bool | Exception] = {}

    def running(self, execution_arn: str) -> bool:
        """Whether the execution still runs; one that is gone (or never was) does not."""
        if execution_arn not in self._running:
            self._running[execution_arn] = _described(execution_arn)
        answer = self._running[execution_arn]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _described(execution_arn: str) -> bool | Exception:
    """Whether DescribeExecution says the execution runs, or the fault it met."""
    sfn = aws.client("stepfunctions")
    try:
        return bool(sfn.describe_execution(executionArn=execution_arn)["status"] == "RUNNING")
    except sfn.exceptions.ExecutionDoesNotExist:
        return False
    except (BotoCoreError, ClientError) as fault:
        return fault


@dataclass
class RunState:
    """What one reconciler run learns as it goes."""

    executions: Executions = field(default_factory=Executions)
    letters: Letters = field(default_factory=Letters)


def _settle(
    store: TaskStore,
    item: dict[str, Any],
    config: Settings,
    now_ms: int,
    run: RunState,
) -> Reconciled:
    task_id, version = item["task_id"], int(item["version"])
    execution = _held_by(item, config)
    if execution and run.executions.running(execution):
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
    run.letters.send(store, item, execution or "", error)
    return Reconciled.FAILED


def _held_by(item: dict[str, Any], config: Settings) -> str | None:
    """The ARN of the execution a task in flight names: its claim's, else its mark's."""
    name = item.get("execution")
    return execution_arn(config.state_machine_arn, name) if name else None


def _send_owed_letter(
    store: TaskStore, item: dict[str, Any], config: Settings, now_ms: int, letters: Letters
) -> Reconciled:
    execution = _held_by(item, config) or ""
    if letters.send(store, item, execution, json.loads(item["error"])):
        return Reconciled.LETTER_SENT
    store.check_later(item["task_id"], int(item["version"]), now_ms + CHECK_AGAIN_MS)
    return Reconciled.LETTER_OWED


def reconcile(config: Settings, until_ms: int, deadline: float | None = None) -> ReconcileReport:
    """Settle every task in flight whose check time is at or before `until_ms`, and send
    the dead letters owed by then; until `deadline` (a time.monotonic() value), if given."""
    store, now_ms, report = TaskStore(config.tasks_table), clock.now_ms(), ReconcileReport()
    run = RunState()
    try:
        for entry in _due_for_a_look(store, config, until_ms):
            if deadline is not None and time.monotonic() >= deadline:
                report.cut_short = True
                logger.warning("reconciler out of time: the rest waits for the next run")
                break
            _settle_entry(store, entry, config, now_ms, run, report)
    except (BotoCoreError, ClientError) as fault:  # a check shard's read refused
        report.cut_short = True
        logger.warning("reconciler stopped: the rest waits for the next run", fault=repr(fault))
    return report


def _settle_entry(
    store: TaskStore,
    entry: dict[str, Any],
    config: Settings,
    now_ms: int,
    run: RunState,
    report: ReconcileReport,
) -> None:
    try:
        outcome = _reconcile_one(store, entry, config, now_ms, run)
    except (BotoCoreError, ClientError) as fault:
        logger.warning("reconcile fault", task_id=entry["task_id"], fault=repr(fault))
        outcome = Reconciled.FAULT
    if outcome is None:
        return
    report.outcomes[outcome] += 1
    report.tasks.append((entry["task_id"], outcome))
    if outcome not in (Reconciled.STILL_RUNNING, Reconciled.FAULT):
        logger.warning("task reconciled", task_id=entry["task_id"], outcome=outcome)


def _due_for_a_look(store: TaskStore, config: Settings, until_ms: int) -> Iterator[dict[str, Any]]:
    """The check shards' entries due by `until_ms`, shard by shard, each shard read whole
    before its entries are settled (settling moves entries within the shards)."""
    for shard in range(config.shards):
        yield from list(store.in_shard(check_shard(shard), until_ms))


def _reconcile_one(
    store: TaskStore, entry: dict[str, Any], config: Settings, now_ms: int, run: RunState
) -> Reconciled | None:
    """One index entry's outcome; None if its task changed or settled since the read."""
    item = store.get(entry["task_id"])
    if not item or int(item["version"]) != int(entry["version"]):
        return None  # changed since the index was read
    if item["status"] == TaskStatus.FAILED and run.letters.refused:
        return Reconciled.LETTER_OWED  # for the next run
    if item["status"] == TaskStatus.FAILED:
        return _send_owed_letter(store, item, config, now_ms, run.letters)
    if item["status"] in (TaskStatus.SCHEDULED, TaskStatus.RUNNING):
        return _settle(store, item, config, now_ms, run)
    return None  # settled since the index was read
