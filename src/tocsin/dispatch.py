"""Start, then mark: how a due task gets its Step Functions execution exactly once.

1. StartExecution with the deterministic name `<task_id>-v<version>`: a second start of the
   same name is refused (`ExecutionAlreadyExists`) or answered with the same execution.
2. Conditionally mark the task SCHEDULED and drop it from the due index (the marks of a
   finder run trail its starts, so a slow write never holds back the next start).

A crash between the two leaves the task PENDING in the index; the next finder run starts
the same name again (no duplicate) and marks it. The Claim in the state machine accepts
PENDING too, so a task whose mark never happened still fires.
"""

import json
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tocsin import aws, clock
from tocsin.observability import logger
from tocsin.settings import Settings
from tocsin.store import TaskStore


@dataclass(frozen=True, order=True)
class DueTask:
    due_ms: int
    task_id: str
    version: int

    @property
    def execution_name(self) -> str:
        return f"{self.task_id}-v{self.version}"


class Outcome(StrEnum):
    STARTED = "started"
    ALREADY_STARTED = "already_started"
    THROTTLED = "throttled"
    FAILED = "failed"
    DEFERRED = "deferred"  # not attempted: the time budget ran out first


def execution_input(task: DueTask, settings: Settings, stagger_s: int = 0) -> dict[str, Any]:
    """The execution input: the task's, and its wake time, `stagger_s` before its own."""
    return {
        "task_id": task.task_id,
        "version": task.version,
        "due_ms": task.due_ms,
        "due_at": clock.to_iso(task.due_ms),
        "wake_at": clock.to_iso_second(wake_ms(task, settings) - stagger_s * 1000),
        "expires_at": task.due_ms // 1000 + settings.retention_days * 86_400,
    }


def wake_ms(task: DueTask, settings: Settings) -> int:
    """The second the task's execution wakes unless staggered: the lead before due, floored."""
    wake = task.due_ms - settings.lead_ms
    return wake - wake % 1000


# An executor sleeps the lead plus its stagger in the gate, then sends: with a 30 s function
# timeout and a 10 s webhook timeout, a wake at most this much earlier still fits.
MAX_STAGGER_S = 12


def staggers(tasks: list[DueTask], settings: Settings, now_ms: int) -> dict[DueTask, int]:
    """Seconds each task wakes before its own wake second, so that no second wakes more than
    `wakes_per_second`: a crowded second overflows to the ones before it (never before now,
    nor more than MAX_STAGGER_S early). Only the gates then release together."""
    woken: Counter[int] = Counter()
    stagger = {}
    for task in sorted(tasks):
        own = wake_ms(task, settings) // 1000
        second = own
        earliest = max(own - MAX_STAGGER_S, now_ms // 1000)
        while woken[second] >= settings.wakes_per_second and second > earliest:
            second -= 1
        woken[second] += 1
        stagger[task] = own - second
    return stagger


def execution_arn(state_machine_arn: str, name: str) -> str:
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"


# A few attempts only (backoff ~1, 2, 4 s): a start still throttled after them waits for the
# next finder run rather than stalling this one.
SFN_RETRIES = 4  # botocore counts these after the first call


def _sfn() -> Any:
    # Standard mode: exponential backoff with jitter, bounded per call. Adaptive mode's
    # client-side limiter blocks a thread with no deadline; under sustained throttling it
    # held a finder run for minutes (`tocsin chaos --scenarios throttled-starts`).
    return aws.client("stepfunctions", retry_mode="standard", max_attempts=SFN_RETRIES)


def start(task: DueTask, settings: Settings, stagger_s: int = 0) -> tuple[Outcome, str | None]:
    """Start the task's execution; the outcome and the execution's ARN (None if not started)."""
    sfn = _sfn()
    try:
        arn = sfn.start_execution(
            stateMachineArn=settings.state_machine_arn,
            name=task.execution_name,
            input=json.dumps(execution_input(task, settings, stagger_s), sort_keys=True),
        )["executionArn"]
        return Outcome.STARTED, arn
    except sfn.exceptions.ExecutionAlreadyExists:
        arn = execution_arn(settings.state_machine_arn, task.execution_name)
        return Outcome.ALREADY_STARTED, arn
    except Exception as error:  # the task stays PENDING: the next finder run tries again
        outcome = Outcome.THROTTLED if aws.is_transient(error) else Outcome.FAILED
        logger.warning(
            "start failed", task_id=task.task_id, outcome=outcome, error=aws.error_code(error)
        )
        return outcome, None


@dataclass(frozen=True)
class DispatchReport:
    found: int
    outcomes: Counter[Outcome]

    @property
    def backlog(self) -> int:
        """Tasks left PENDING for the next run."""
        done = self.outcomes[Outcome.STARTED] + self.outcomes[Outcome.ALREADY_STARTED]
        return self.found - done

    def as_dict(self) -> dict[str, int]:
        counts = {outcome.value: self.outcomes[outcome] for outcome in Outcome}
        return {"found": self.found, **counts, "backlog": self.backlog}


def dispatch_all(tasks: list[DueTask], settings: Settings, deadline: float) -> DispatchReport:
    """Dispatch earliest first, in parallel, until `deadline` (a time.monotonic() value);
    tasks due together wake staggered.

    Marks trail the starts in a pool of their own: a start waits for StartExecution's
    quota, never for the write before it. The run ends when every mark is written.
    """
    store = TaskStore(settings.tasks_table)
    stagger = staggers(tasks, settings, clock.now_ms())
    marks: list[Future[Any]] = []

    with (
        ThreadPoolExecutor(max_workers=settings.dispatch_workers) as marking,
        ThreadPoolExecutor(max_workers=settings.dispatch_workers) as starting,
    ):

        def one(task: DueTask) -> Outcome:
            if time.monotonic() >= deadline:
                return Outcome.DEFERRED
            outcome, arn = start(task, settings, stagger[task])
            if arn is not None:
                mark = marking.submit(store.mark_scheduled, task.task_id, task.version, arn)
                marks.append(mark)
            return outcome

        outcomes = Counter(starting.map(one, sorted(tasks)))
    for mark in marks:
        mark.result()  # a mark that failed fails the run, like a crash: its task stays PENDING
    return DispatchReport(found=len(tasks), outcomes=outcomes)


def dispatch_if_due_soon(
    item: dict[str, Any], settings: Settings, store: TaskStore
) -> dict[str, Any]:
    """Dispatch a just-written PENDING task now if the finder would miss it; the stored task.

    The finder only sees tasks due within its look-ahead at its next run: a task due sooner
    than that is started here, by the request that wrote it.
    """
    due_ms = int(item["due_ms"])  # an int, or a Decimal when read back from DynamoDB
    if due_ms > clock.now_ms() + settings.lookahead_s * 1000:
        return item
    _, arn = start(DueTask(due_ms, item["task_id"], int(item["version"])), settings)
    if arn is None:
        return item
    # Marked, the task as it now is; not marked, its execution (or a cancel) got there first.
    marked = store.mark_scheduled(item["task_id"], int(item["version"]), arn, "ALL_NEW")
    return marked or store.get(item["task_id"]) or item


def stop_execution(execution_arn: str, reason: str) -> None:
    """Stop an execution whose task changed; best effort, since its claim fails regardless."""
    try:
        _sfn().stop_execution(executionArn=execution_arn, cause=reason)
    except Exception as error:  # already finished, or the service is busy: harmless
        logger.info("stop skipped", execution=execution_arn, error=aws.error_code(error))
