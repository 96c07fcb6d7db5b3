"""What every typed executor does with its batch: claim, plan, send once, mark, in that
order (`tocsin.fire`); the Lambda handler of each type's executor."""

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from tocsin import aws, clock
from tocsin.dispatch import DueTask, due_task, execution_name
from tocsin.fire.batch import BatchEvent, ClaimedTask, Failed, Held, Later, Recorded
from tocsin.fire.claims import claim_batch, let_go
from tocsin.fire.marks import MARK_MARGIN_MS, finish, report, report_flows, retry_later
from tocsin.fire.plans import give_back_leases, given_back, hand_on, plan_flows, start_onward
from tocsin.fire.sends import HandOn, fire, sends
from tocsin.fire.wakes import wake_held
from tocsin.fire.writes import answered_by
from tocsin.index_keys import writers_own
from tocsin.model import TaskType
from tocsin.observability import logger, metrics
from tocsin.sent import Fired, SentLog
from tocsin.settings import settings
from tocsin.store import Holder, TaskStore
from tocsin.targets import TARGETS

FINISH_MARGIN_MS = 3000  # kept back from retries for the final marks and dead letters
# Kept back from the sent log's write for the invocation's reply: at 256 MB a thread runs
# about a seventh of each 100 ms, and on a loaded test machine 200 ms was 3 ms short.
REPLY_MARGIN_MS = 1000
CLAIMS_SHARE = 3  # of the time, for claims: then a fresh invocation beats sends out of time


class DeliveryInProgress(Exception):
    """Another invocation is delivering a task of this batch: retry after it has ended."""


@dataclass(frozen=True)
class HandedOn:
    """A task this invocation handed on (`HandOn`); `given` once its item says so."""

    planned_ms: int
    given: bool


def execute(
    event: dict[str, Any],
    expected_type: TaskType,
    remaining_ms: Callable[[], int],
    attempt: str,
) -> dict[str, int]:
    """Claim, fire and finish every task of the batch, as the invocation `attempt`; counts
    of what happened."""
    batch = BatchEvent.model_validate(event)
    if batch.task_type is not expected_type:
        raise ValueError(f"a {batch.task_type} batch reached the {expected_type} executor")
    config = settings()
    store, sent_log = TaskStore(config.tasks_table), SentLog(config.sent_table)
    began_ms = clock.now_ms()
    ends_ms = began_ms + remaining_ms()
    deadline_ms = ends_ms - FINISH_MARGIN_MS
    holder = Holder(execution_name(batch.execution), attempt, lease_until_ms=ends_ms)
    held, in_progress = claim_batch(
        store, batch, holder, began_ms + (deadline_ms - began_ms) // CLAIMS_SHARE
    )
    held, handed_on = plan_flows(store, held, holder, deadline_ms)

    def run(call: list[Held]) -> list[Recorded | Exception | HandedOn]:
        """Fire a call's tasks (but one that failed already, or that the sent log shows an
        earlier invocation sent) and record each task's outcome."""
        outcomes: dict[int, Fired | Failed | Later] = {}
        for i, each in enumerate(call):
            if isinstance(each.task, Failed):
                outcomes[i] = each.task
            elif each.held_before and (
                sent := sent_log.find(each.asked.task_id, each.asked.version)
            ):
                outcomes[i] = sent
        to_fire = [i for i in range(len(call)) if i not in outcomes]
        if to_fire:
            try:
                fired = fire([call[i].task for i in to_fire], deadline_ms)  # type: ignore[misc]
            except HandOn as past:  # a flow's task: alone in its call
                [each] = call
                slot, by_ms = past.planned_ms, ends_ms - MARK_MARGIN_MS
                return [HandedOn(slot, given_back(store, holder, each.asked, slot, by_ms))]
            outcomes.update(zip(to_fire, fired, strict=True))
        return [record(each, outcomes[i]) for i, each in enumerate(call)]

    def record(each: Held, outcome: Fired | Failed | Later) -> Recorded | Exception:
        asked = each.asked
        try:
            mark_by = ends_ms - MARK_MARGIN_MS
            if isinstance(outcome, Later):
                return outcome, retry_later(store, holder, asked, outcome, mark_by)
            return outcome, finish(store, batch, holder, each, outcome, mark_by, callbacks)
        except Exception as error:
            if isinstance(outcome, Fired):  # sent, and the table will not say so
                expires_at = config.expires_at(asked.due_ms)
                log = lambda: sent_log.record(asked.task_id, asked.version, outcome, expires_at)  # noqa: E731
                try:  # cut off before the invocation's end, as the mark was: Lambda would
                    answered_by(ends_ms - REPLY_MARGIN_MS, log)  # kill it unanswered
                except Exception as unlogged:
                    return unlogged
            return error

    counts = Counter(tasks=len(batch.tasks), claimed=len(held) + len(handed_on))
    callbacks: list[dict[str, Any]] = []  # the callback tasks the final marks made
    if handed_on:
        counts["handed_on"] = len(handed_on)
    with ThreadPoolExecutor(max_workers=1) as handing:  # beside the sends: their gates go on
        if handed_on:
            handing.submit(hand_on, handed_on, batch, ends_ms - MARK_MARGIN_MS)
        if held:
            _send_all(held, run, store, holder, batch, counts, callbacks, ends_ms)
    if in_progress:  # the rest is done; the retry takes these over once that attempt ended
        raise DeliveryInProgress(", ".join(in_progress))
    return dict(counts)


def _send_all(
    held: list[Held],
    run: Callable[[list[Held]], list[Recorded | Exception | HandedOn]],
    store: TaskStore,
    holder: Holder,
    batch: BatchEvent,
    counts: Counter[str],
    callbacks: list[dict[str, Any]],
    ends_ms: int,
) -> None:
    """Run every call of the held tasks, each in a thread of its own, then start the
    callbacks their final marks made and count what became of each; raise the first
    failure, once the others are done and the failed tasks let go."""
    calls = sends(held)
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, call) for call in calls]
    give_back_leases(held)
    done: list[tuple[Held, Recorded | BaseException]] = []
    onward: list[Held] = []  # handed on, for want of time (`HandOn`)
    for call, future in zip(calls, futures, strict=True):
        error = future.exception()  # before any send: the whole call failed
        results = [error] * len(call) if error else future.result()
        for each, result in zip(call, results, strict=True):
            if not isinstance(result, HandedOn):
                done.append((each, result))
            elif result.given:
                onward.append(replace(each, task=replace(each.task, planned_ms=result.planned_ms)))  # type: ignore[type-var]
    if onward:
        counts["handed_on"] += len(onward)
        hand_on(onward, batch, ends_ms - MARK_MARGIN_MS)
    failed = [(each, result) for each, result in done if isinstance(result, BaseException)]
    if failed:  # the others are done; the retry takes these over at once
        let_go(store, holder, [each.asked for each, _ in failed])
    if callbacks:  # those of the tasks that ended, whatever became of the others
        counts["callbacks"] = len(callbacks)
        tasks = [due_task(item) for item in callbacks]
        start_onward(tasks, batch.execution, ends_ms - MARK_MARGIN_MS, "callbacks")
    if retries := _started_here(done, batch):
        start_onward(retries, batch.execution, ends_ms - MARK_MARGIN_MS, "retries")
    holds = {each.task.hold for each in held if isinstance(each.task, ClaimedTask)} - {None}
    wake_held(store, holds, batch, ends_ms - MARK_MARGIN_MS)  # type: ignore[arg-type]
    if failed:
        raise failed[0][1]
    for each, (outcome, recorded) in done:  # type: ignore[misc]
        report(each.asked, outcome, counts)
        if not recorded:  # the task changed under the claim, or a later attempt took it
            counts["unrecorded"] += 1
            metrics.add_metric(name="OutcomeUnrecorded", unit=MetricUnit.Count, value=1)
            logger.warning("outcome not recorded", task_id=each.asked.task_id)
    report_flows(done)


def _started_here(
    done: list[tuple[Held, Recorded | BaseException]], batch: BatchEvent
) -> list[DueTask]:
    """The tasks given back RETRYING whose next attempt is too near for the finder to see
    it in time (`writers_own`): this invocation starts their executions, as a writer
    does. Each needs a name of its own: its `requeues`, one more."""
    now_ms, config = clock.now_ms(), settings()
    return [
        DueTask(
            outcome.next_ms,
            each.asked.task_id,
            each.asked.version,
            batch.task_type,
            each.task.requeues + 1,  # type: ignore[union-attr]
        )
        for each, recorded in done
        if not isinstance(recorded, BaseException)
        and isinstance(outcome := recorded[0], Later)
        and recorded[1]
        and writers_own(outcome.next_ms, now_ms, config)
    ]


def executor_handler(task_type: TaskType) -> Callable[[dict[str, Any], LambdaContext], Any]:
    """The Lambda handler of one task type's executor; its SDK clients are made now, at init."""
    aws.resource("dynamodb")  # claims and marks on the Tasks table
    aws.client("dynamodb")  # a final mark with the callback task it makes
    aws.client("sqs")  # dead letters
    for service in TARGETS[task_type].aws_services:
        aws.target_client(service)
    for service in TARGETS[task_type].own_services:
        aws.client(service)

    @logger.inject_lambda_context(clear_state=True)
    @metrics.log_metrics
    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
        return execute(
            event, task_type, context.get_remaining_time_in_millis, context.aws_request_id
        )

    return handler
