"""Marks: each task's outcome recorded on it (the sent marker: SUCCEEDED, or FAILED and its
dead letter), with the callback task it owes, and what the invocation reports of them."""

import json
from collections import Counter
from typing import Any

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from tocsin import clock
from tocsin.callbacks import callback_item
from tocsin.dead_letter import send_letter
from tocsin.fire.batch import BatchEvent, BatchTask, ClaimedTask, Failed, Held, Later, Recorded
from tocsin.fire.writes import answered_by, written
from tocsin.index_keys import due_index_keys, owed_letter_keys
from tocsin.model import TaskStatus
from tocsin.observability import logger, metrics
from tocsin.sent import Fired
from tocsin.settings import settings
from tocsin.store import Holder, TaskStore

MARK_MARGIN_MS = 1000  # kept back from the final marks' retries for a dead letter and the reply


def finish(
    store: TaskStore,
    batch: BatchEvent,
    holder: Holder,
    each: Held,
    outcome: Fired | Failed,
    deadline_ms: int,
    callbacks: list[dict[str, Any]],
) -> bool:
    """Record the outcome on the task, with the callback task it owes so ended, if any
    (added to `callbacks` once written, to be started); a failure also goes to the
    dead-letter queue (or is left owed, for the reconciler: a letter that cannot go out
    fails no other task)."""
    asked = each.asked
    expires_at = settings().expires_at(asked.due_ms)
    fields: dict[str, Any] = {"attempts": outcome.attempts, "expires_at": expires_at}
    if outcome.tries:  # written only when an attempt failed: a first send adds nothing
        fields["tries"] = json.dumps(outcome.tries)
    if isinstance(outcome, Fired):
        status = TaskStatus.SUCCEEDED
        fields["fired_at"] = clock.to_iso(outcome.fired_ms)
        fields["lateness_ms"] = outcome.fired_ms - asked.due_ms
        fields["result"] = json.dumps(outcome.result)
        if isinstance(each.task, ClaimedTask) and each.task.flow:
            fields["held_ms"] = outcome.held_ms
            if outcome.held_ms and outcome.slot_ms:  # its slot: a ticket may have moved it
                slot_ms = outcome.slot_ms  # (the sent log has none: the plan's stays)
                fields |= {"planned_ms": slot_ms, "planned_at": clock.to_iso(slot_ms)}
    else:
        status = TaskStatus.FAILED
        error = {"Error": outcome.error, "Cause": outcome.cause}
        fields["error"] = json.dumps(error)
        if outcome.exhausted_by is not None:
            fields["exhausted_by"] = outcome.exhausted_by.value
        fields |= owed_letter_keys(asked.task_id, clock.now_ms(), settings())
    callback = None
    if each.ending is not None:
        callback = callback_item(
            each.ending, status, fields, clock.now_ms(), deadline_ms, settings()
        )
    finished = written(
        asked.task_id,
        deadline_ms,
        lambda: answered_by(
            deadline_ms,
            lambda: store.finish(
                asked.task_id, asked.version, holder.attempt, status, fields, callback
            ),
        ),
    )
    if finished and callback:
        callbacks.append(callback)
    if isinstance(outcome, Failed) and finished:
        send_letter(store, asked.task_id, asked.version, batch.task_type, batch.execution, error)
    return finished


def retry_later(
    store: TaskStore, holder: Holder, asked: BatchTask, outcome: Later, deadline_ms: int
) -> bool:
    """Give the task back RETRYING, in the dispatch index at its next attempt, with the
    attempts made and the errors kept (`TaskStore.retry_later`); whether it was this
    attempt's to give. No callback and no dead letter: it has not ended."""
    now_ms = clock.now_ms()
    fields: dict[str, Any] = {
        "attempts": outcome.attempts,
        "throttled": outcome.throttled,
        "tries": json.dumps(outcome.tries),
        "next_attempt_ms": outcome.next_ms,
        "next_attempt_at": clock.to_iso(outcome.next_ms),
        "updated_at": clock.to_iso(now_ms),
        **due_index_keys(asked.task_id, outcome.next_ms, settings(), now_ms),
    }
    if outcome.held_on is not None:  # in HeldIndex, to be woken when its host's hold ends
        fields["held_on"] = outcome.held_on
    return written(
        asked.task_id,
        deadline_ms,
        lambda: answered_by(
            deadline_ms,
            lambda: store.retry_later(asked.task_id, asked.version, holder.attempt, fields),
        ),
    )


def report(asked: BatchTask, outcome: Fired | Failed | Later, counts: Counter[str]) -> None:
    if isinstance(outcome, Later) and outcome.held_on is not None:
        counts["waiting"] += 1
        metrics.add_metric(name="WaitingOnHost", unit=MetricUnit.Count, value=1)
        logger.info("waiting on its host", task_id=asked.task_id, until_ms=outcome.next_ms)
        return
    if isinstance(outcome, Later):
        counts["retrying"] += 1
        metrics.add_metric(name="Retrying", unit=MetricUnit.Count, value=1)
        logger.info("retrying", task_id=asked.task_id, next_attempt_ms=outcome.next_ms)
        return
    if isinstance(outcome, Failed):
        counts["failed"] += 1
        metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=1)
        logger.info("failed", task_id=asked.task_id, version=asked.version, error=outcome.error)
        return
    lateness_ms = outcome.fired_ms - asked.due_ms
    counts["fired"] += 1
    metrics.add_metric(name="Fired", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="LatenessMs", unit=MetricUnit.Milliseconds, value=lateness_ms)
    logger.info("fired", task_id=asked.task_id, version=asked.version, lateness_ms=lateness_ms)
    if outcome.held_ms:
        counts["held"] += 1


def report_flows(done: list[tuple[Held, Recorded | BaseException]]) -> None:
    """Per flow key, the tasks its limits held past their due time and the longest hold:
    one metric set a key, the key in its log record but not a dimension. As a dimension,
    each key was a custom metric of its own, and with host flows every webhook host is a
    key: some $3,000 a month at 10,000 hosts (CloudWatch's $0.30 a metric). Logs Insights
    reads a key's figures from the records (`filter FlowKey = ...`)."""
    held: dict[str, list[int]] = {}
    for each, recorded in done:
        task, outcome = each.task, recorded[0]  # type: ignore[index]
        if isinstance(task, ClaimedTask) and task.flow and isinstance(outcome, Fired):
            held.setdefault(task.flow.key, []).append(outcome.held_ms)
    for key, held_ms in held.items():
        per_key = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
        per_key.add_metadata(key="FlowKey", value=key)
        held_count = sum(1 for ms in held_ms if ms > 0)
        per_key.add_metric(name="FlowHeld", unit=MetricUnit.Count, value=held_count)
        per_key.add_metric(name="FlowHeldMs", unit=MetricUnit.Milliseconds, value=max(held_ms))
        per_key.flush_metrics()
