"""The reconciler: no task stays unstarted, or in flight, for good.

Each finder run it reads, within its share of the run:

* the due shards' entries due past its horizon up to `index_keys.LOOK_AFTER_MS` ago,
  each task's status read at once (BatchGetItem, at $0.125 a million reads where moving
  an entry was two writes at $0.625): a task settled by then needs nothing, the others a
  closer look. Its horizon then moves up to the first entry it could not finish;
* the check shards' entries up to now: the few tasks put there for a look at that time.

A closer look, at the task as it is now (read consistently):

* PENDING: nobody started it (its writer died before the start, or a start failed):
  started now, late, as a batch of its own, and put in a check shard for a look once that
  execution should have settled it;
* RUNNING, its execution still running (a long retry): looked at again later;
* RUNNING, its execution ended without settling it (its invocation crashed or timed out
  for good and the batch went to the DLQ, the embedded runtime restarted): requeued,
  PENDING again at the same version with its `requeues` counted (which gives its next
  execution a name not yet taken), and started as above. A send the lost execution made
  but could not mark is in the sent log, and is not sent again;
* after MAX_REQUEUES such ends: FAILED, with a dead letter of its own;
* FAILED, in a check shard: the dead letter it still owes past its grace (its failer died
  or met an SQS outage between the mark and the send: see `tocsin.dead_letter`). Once SQS
  refuses one, the run sends no more (each refusal costs botocore's retries, out of the
  run's time to dispatch), and that letter is tried again `CHECK_AGAIN_MS` later;
* settled, in a check shard: taken out.

The finder dispatches after it, so the reconciler keeps to a deadline and to itself: a
task whose look meets a fault (a throttled DescribeExecution, a refused write) is counted
and left for the next run, what the deadline leaves unread waits too, and each execution
is described once a run, however many of its batch's tasks it left stuck.
"""

import heapq
import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws, clock
from tocsin.batch_read import BATCH_GET_MAX
from tocsin.callbacks import callback_item
from tocsin.dead_letter import send_letter
from tocsin.dispatch import dispatch_all, due_task, execution_arn
from tocsin.errors import Busy
from tocsin.index_keys import (
    LOOK_AFTER_MS,
    check_keys,
    check_shard,
    in_check_shard,
    owed_letter_keys,
)
from tocsin.model import TaskStatus
from tocsin.observability import logger
from tocsin.settings import Settings
from tocsin.store import TaskStore

MAX_REQUEUES = 3
CHECK_AGAIN_MS = 5 * 60 * 1000
HORIZON = "looked_ms"  # every task due up to it has had its look
# Where a reconciler with no horizon yet (a new stack) starts reading.
FIRST_LOOK_BACK_MS = 60 * 60 * 1000
SETTLED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class Reconciled(StrEnum):
    STARTED_LATE = "started_late"  # found PENDING past its due time: nobody had started it
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
        late = (Reconciled.STARTED_LATE, Reconciled.REQUEUED, Reconciled.FAILED)
        stuck = sum(self.outcomes[o] for o in late)
        return {
            "stuck": stuck,
            Reconciled.STARTED_LATE.value: self.outcomes[Reconciled.STARTED_LATE],
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
    """What one reconciler run learns as it goes, and when it must end."""

    executions: Executions = field(default_factory=Executions)
    letters: Letters = field(default_factory=Letters)
    deadline: float = math.inf  # a time.monotonic() value

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline


def _once_settled(item: dict[str, Any], now_ms: int, config: Settings) -> dict[str, Any]:
    """The check shard keys of a task started now (or at its due time, or its flow's slot,
    if later): looked at again once its execution should have settled it."""
    look_ms = max(due_task(item).fires_ms, now_ms) + LOOK_AFTER_MS
    return check_keys(item["task_id"], look_ms, config)


def _look_again_later(
    store: TaskStore, item: dict[str, Any], now_ms: int, config: Settings
) -> None:
    """Look at a task again CHECK_AGAIN_MS from now: its execution still runs, or SQS
    refused its dead letter."""
    task_id = item["task_id"]
    keys = check_keys(task_id, now_ms + CHECK_AGAIN_MS, config)
    store.look_again(task_id, int(item["version"]), keys)


def _start_late(
    store: TaskStore, item: dict[str, Any], config: Settings, now_ms: int, run: RunState
) -> Reconciled:
    """Start a PENDING task nobody started, after putting it in a check shard for a look
    once its execution should have settled it (or, if the start fails, at that time)."""
    task = due_task(item)
    store.look_again(task.task_id, task.version, _once_settled(item, now_ms, config))
    started = not dispatch_all([task], config, run.deadline).left
    return Reconciled.STARTED_LATE if started else Reconciled.FAULT


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
        _look_again_later(store, item, now_ms, config)
        return Reconciled.STILL_RUNNING
    if int(item.get("lease_until", 0)) >= now_ms:  # its execution is gone (stopped by an
        # operator, say), its invocation may still be sending: never requeued under it
        _look_again_later(store, item, now_ms, config)
        return Reconciled.STILL_RUNNING
    requeues = int(item.get("requeues", 0))
    if requeues - int(item.get("retried", 0)) < MAX_REQUEUES:  # a retry's execution settled
        look = _once_settled(item, now_ms, config)
        requeued = store.requeue(task_id, version, requeues, look, now_ms)
        if requeued is None:
            return Reconciled.CHANGED
        dispatch_all([due_task(requeued)], config, run.deadline)  # else started at its look
        return Reconciled.REQUEUED
    error = {
        "Error": "TaskStuck",
        "Cause": f"{requeues + 1} executions ended without settling it (last: {execution})",
    }
    fields = {
        "error": json.dumps(error),
        "expires_at": config.expires_at(int(item["due_ms"])),
        **owed_letter_keys(task_id, now_ms, config),
    }
    callback = callback_item(item, TaskStatus.FAILED, fields, now_ms, now_ms, config)
    if not store.fail_in_flight(task_id, version, now_ms, fields, callback):
        return Reconciled.CHANGED
    run.letters.send(store, item, execution or "", error)
    if callback is not None:  # one not started now is started at its look, as any task
        dispatch_all([due_task(callback)], config, run.deadline)
    return Reconciled.FAILED


def _held_by(item: dict[str, Any], config: Settings) -> str | None:
    """The ARN of the execution a task in flight names (its claim's)."""
    name = item.get("execution")
    return execution_arn(config.state_machine_arn, name) if name else None


def _send_owed_letter(
    store: TaskStore, item: dict[str, Any], config: Settings, now_ms: int, letters: Letters
) -> Reconciled:
    execution = _held_by(item, config) or ""
    if letters.send(store, item, execution, json.loads(item["error"])):
        return Reconciled.LETTER_SENT
    _look_again_later(store, item, now_ms, config)
    return Reconciled.LETTER_OWED


def reconcile(config: Settings, until_ms: int, deadline: float | None = None) -> ReconcileReport:
    """Look at every task in a check shard to look at by `until_ms`, and at every one due
    past the horizon up to LOOK_AFTER_MS before `until_ms`; until `deadline` (a
    time.monotonic() value), if given."""
    store, now_ms, report = TaskStore(config.tasks_table), clock.now_ms(), ReconcileReport()
    run = RunState(deadline=math.inf if deadline is None else deadline)
    try:
        if run.out_of_time():
            _cut_short(report)
            return report
        for entry in _check_entries(store, config, until_ms):
            if run.out_of_time():
                _cut_short(report)
                return report
            _settle_entry(store, entry, config, now_ms, run, report)
        horizon, band_end = store.horizon(HORIZON), until_ms - LOOK_AFTER_MS
        after = band_end - FIRST_LOOK_BACK_MS if horizon is None else horizon
        looked = _look_at_due(store, config, (after, band_end), now_ms, run, report)
        store.advance_horizon(HORIZON, looked)
    except (BotoCoreError, ClientError, Busy) as fault:  # a shard's read refused or throttled
        report.cut_short = True
        logger.warning("reconciler stopped: the rest waits for the next run", fault=repr(fault))
    return report


def _cut_short(report: ReconcileReport) -> None:
    report.cut_short = True
    logger.warning("reconciler out of time: the rest waits for the next run")


def _look_at_due(
    store: TaskStore,
    config: Settings,
    band: tuple[int, int],
    now_ms: int,
    run: RunState,
    report: ReconcileReport,
) -> int:
    """Look at the tasks due in `band` (after its first time, up to its second) not
    settled yet, earliest first; the due time up to which every one has had its look."""
    looked = band[1]
    for entries in _due_entries(store, config, *band):
        if run.out_of_time():
            _cut_short(report)
            return min(looked, int(entries[0]["gsi_due_ms"]) - 1)
        statuses = store.statuses([entry["task_id"] for entry in entries])
        for entry in entries:
            due = int(entry["gsi_due_ms"])
            if _settled(statuses.get(entry["task_id"]), int(entry["version"])):
                continue
            if run.out_of_time():
                _cut_short(report)
                return min(looked, due - 1)
            if _settle_entry(store, entry, config, now_ms, run, report) is Reconciled.FAULT:
                looked = min(looked, due - 1)
    return looked


def _settled(read: tuple[str, int] | None, version: int) -> bool:
    """Whether an eventually consistent read shows the entry's task settled, or a later
    version (with an entry of its own); a read that shows nothing or an earlier version
    may be stale, and the closer look reads the task again, consistently."""
    if read is None:
        return False
    status, read_version = read
    return read_version > version or (read_version == version and status in SETTLED)


def _due_entries(
    store: TaskStore, config: Settings, after_ms: int, until_ms: int
) -> Iterator[list[dict[str, Any]]]:
    """The due shards' entries after `after_ms` up to `until_ms`, earliest first, a
    BatchGetItem's worth at a time."""
    shards = (store.in_shard(str(shard), until_ms, after_ms) for shard in range(config.shards))
    entries: list[dict[str, Any]] = []
    for entry in heapq.merge(*shards, key=lambda entry: int(entry["gsi_due_ms"])):
        entries.append(entry)
        if len(entries) == BATCH_GET_MAX:
            yield entries
            entries = []
    if entries:
        yield entries


def _settle_entry(
    store: TaskStore,
    entry: dict[str, Any],
    config: Settings,
    now_ms: int,
    run: RunState,
    report: ReconcileReport,
) -> Reconciled | None:
    """Look at one entry's task, and count what came of it."""
    try:
        outcome = _reconcile_one(store, entry, config, now_ms, run)
    except (BotoCoreError, ClientError) as fault:
        logger.warning("reconcile fault", task_id=entry["task_id"], fault=repr(fault))
        outcome = Reconciled.FAULT
    if outcome is None:
        return None
    report.outcomes[outcome] += 1
    report.tasks.append((entry["task_id"], outcome))
    if outcome not in (Reconciled.STILL_RUNNING, Reconciled.FAULT):
        logger.warning("task reconciled", task_id=entry["task_id"], outcome=outcome)
    return outcome


def _check_entries(store: TaskStore, config: Settings, until_ms: int) -> Iterator[dict[str, Any]]:
    """The check shards' entries to look at by `until_ms`, shard by shard, each shard read
    whole before its entries are looked at (a look moves entries within the shards)."""
    for shard in range(config.shards):
        yield from list(store.in_shard(check_shard(shard), until_ms))


def _reconcile_one(
    store: TaskStore, entry: dict[str, Any], config: Settings, now_ms: int, run: RunState
) -> Reconciled | None:
    """One index entry's outcome; None if its task changed or settled since the read."""
    item = store.get(entry["task_id"])
    if not item or int(item["version"]) != int(entry["version"]):
        return None  # changed since the index was read
    status = item["status"]
    if status in (TaskStatus.SUCCEEDED, TaskStatus.CANCELLED):
        if in_check_shard(item):  # no more looks needed
            store.forget(item["task_id"], int(item["version"]))
        return None
    if status == TaskStatus.FAILED and run.letters.refused:
        return Reconciled.LETTER_OWED  # for the next run
    if status == TaskStatus.FAILED:
        return _send_owed_letter(store, item, config, now_ms, run.letters)
    if status in (TaskStatus.PENDING, TaskStatus.RETRYING):
        return _start_late(store, item, config, now_ms, run)
    return _settle(store, item, config, now_ms, run)
