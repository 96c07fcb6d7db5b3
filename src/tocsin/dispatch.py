"""How due tasks get their Step Functions execution, one per batch.

Due tasks are packed into batches (see `pack`); each batch is one execution, whose input
carries ids, versions and due milliseconds only, never a payload. StartExecution takes
the batch's deterministic name: a second start of the same name is refused
(`ExecutionAlreadyExists`) or answered with the same execution. Nothing is written to the
task: who started it is known from where it sits (`tocsin.index_keys`), and a task
started twice, packed differently by two runs, still fires once, for the executor's claim
decides which execution fires a task, not the name.
"""

import hashlib
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws, clock, cutoff
from tocsin.index_keys import check_keys, writers_own
from tocsin.model import BATCH_ENTRIES, BATCHED_TYPES, TaskType
from tocsin.observability import logger
from tocsin.settings import Settings
from tocsin.store import TaskStore

EXECUTORS = list(TaskType)  # the order of the state machine's executor array (Fire)
NAME_LIMIT = 80  # characters of an execution's name


@dataclass(frozen=True, order=True)
class DueTask:
    due_ms: int
    task_id: str
    version: int
    task_type: TaskType
    requeues: int = 0  # executions that ended without settling it (see tocsin.reconcile)
    planned_ms: int = 0  # when flow control lets it go, if later than due (tocsin.flow)
    # The call it goes out in, for a batched type: its target's batch key, or its own id if
    # its flow sends it alone; "" where not read (`tocsin.call_keys`). Not part of its identity.
    batch_key: str = field(default="", compare=False)

    @property
    def fires_ms(self) -> int:
        """When its gate lets it go: its due time, or its flow's slot."""
        return max(self.due_ms, self.planned_ms)

    @property
    def member(self) -> str:
        """The task in an execution name: a requeued task, or one handed on to wake for its
        flow's slot, needs a name not yet taken.

        An occurrence's or a callback's `.` becomes `_` and a digest of the id follows, so
        that the name keeps to the characters CloudWatch Logs accepts and no submitted id
        can take it. So does any id whose name would be longer than Step Functions takes
        (80: a 64-character id handed on for a slot, `-v1h<ms>`, is 81): it loses the end
        of the id, and the digest keeps the names of ids alike but for their ends apart."""
        again = f"r{self.requeues}" if self.requeues else ""
        held = f"h{self.planned_ms}" if self.planned_ms else ""
        suffix = f"-v{self.version}{again}{held}"
        name = self.task_id
        if "." in name or len(name) + len(suffix) > NAME_LIMIT:
            digest = "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
            name = f"{name.replace('.', '_')[: NAME_LIMIT - len(suffix) - len(digest)]}{digest}"
        return f"{name}{suffix}"

    def as_input(self) -> dict[str, Any]:
        planned = {"planned_ms": self.planned_ms} if self.planned_ms else {}
        return {"task_id": self.task_id, "version": self.version, "due_ms": self.due_ms, **planned}


@dataclass(frozen=True, order=True)
class Batch:
    """Tasks of one type that one execution wakes for and one executor invocation fires."""

    tasks: tuple[DueTask, ...]

    @property
    def task_type(self) -> TaskType:
        return self.tasks[0].task_type

    @property
    def first_due_ms(self) -> int:
        """When its first gate lets go (a task held by its flow's: that slot)."""
        return self.tasks[0].fires_ms

    @property
    def execution_name(self) -> str:
        """`<task_id>-v<version>` for a lone task (`r<requeues>` after it when requeued);
        else the type, the first due millisecond and a digest of the members (at most 80
        characters of [A-Za-z0-9_-] either way)."""
        if len(self.tasks) == 1:
            return self.tasks[0].member
        members = ",".join(t.member for t in self.tasks)
        digest = hashlib.sha256(members.encode()).hexdigest()[:24]
        return f"{self.task_type}-{self.first_due_ms}-{digest}"


# A webhook task holds a connection, a file descriptor, from before its gate to its answer,
# and a Lambda environment has 1,024 of them: a webhook batch holds at most this many tasks.
WEBHOOK_BATCH_MAX = 256

# What a gate lets go at once must fit the CPU an executor has to send it: a batch holds at
# most `burst_sends` sends due within any BURST_SPAN_MS, counted as the executor will make
# them (`calls`): a webhook is a send, a call of a batched type counts SENDS_PER_CALL. More
# due together go to more batches, whose executors, each with its own share of a core,
# send side by side.
BURST_SPAN_MS = 100
# A batch call costs an executor what two webhook sends do after the gate: in a 256 MB
# sandbox, alone, an SQS call of ten took 101-110 us of CPU (50 and 100 tasks due in one
# millisecond), a webhook 45-58 us (50 and 100), all of them arriving within 1-10 ms.
SENDS_PER_CALL = 2


def pack(tasks: list[DueTask], window_ms: int, batch_size: int, burst_sends: int) -> list[Batch]:
    """Tasks of one type whose due times fall in the same window (windows aligned to
    multiples of `window_ms`), in as few batches as keep each within `batch_size` tasks
    (WEBHOOK_BATCH_MAX for webhooks) and `burst_sends` sends for any BURST_SPAN_MS. A
    window's calls are dealt to its batches in turn, earliest first: each batch then holds
    its share of every span, and none more than the limits.

    Two finders that see different tasks may pack them differently: each task still fires
    once, for only one execution can claim it.
    """
    batches = []
    for (task_type, _), members in windows(tasks, window_ms).items():
        size = min(batch_size, WEBHOOK_BATCH_MAX) if task_type is TaskType.WEBHOOK else batch_size
        units = calls(task_type, members, size)
        weight = SENDS_PER_CALL if task_type in BATCHED_TYPES else 1
        burst = max(1, -(-burst_sends // weight))  # calls within a BURST_SPAN_MS
        count = max(-(-len(members) // size), -(-densest(units) // burst))
        batches += _dealt(units, min(count, len(units)), size, burst)
    return sorted(batches)


def _in_order(tasks: Iterable[DueTask]) -> tuple[DueTask, ...]:
    """Earliest to fire first."""
    return tuple(sorted(tasks, key=lambda task: (task.fires_ms, task)))


def windows(tasks: list[DueTask], window_ms: int) -> dict[tuple[TaskType, int], list[DueTask]]:
    """The tasks by type and window, each window's earliest first."""
    by_window: dict[tuple[TaskType, int], list[DueTask]] = {}
    for task in _in_order(tasks):
        by_window.setdefault((task.task_type, task.fires_ms // window_ms), []).append(task)
    return by_window


def calls(task_type: TaskType, tasks: list[DueTask], size: int) -> list[list[DueTask]]:
    """The calls `tasks` (earliest first) go out in, as `tocsin.fire.sends` makes them: a
    task each, or, of a batched type, those due in one millisecond with one batch key, up to
    BATCH_ENTRIES (and `size`) a call. Tasks whose keys were not read (`batch_key` "") are
    counted as sharing one."""
    if task_type not in BATCHED_TYPES:
        return [[task] for task in tasks]
    units: list[list[DueTask]] = []
    open_calls: dict[tuple[int, str], list[DueTask]] = {}
    for task in tasks:
        key = (task.due_ms, task.batch_key)
        call = open_calls.get(key)
        if call is None or len(call) == min(BATCH_ENTRIES, size):
            call = open_calls[key] = []
            units.append(call)
        call.append(task)
    return units


def _dealt(units: list[list[DueTask]], count: int, size: int, burst: int) -> list[Batch]:
    """The calls dealt in turn to `count` batches, or to more if they do not fit so: a
    batch would hold more than `burst` calls within a BURST_SPAN_MS (calls of unequal
    sizes can crowd one; one call a batch always fits), or the calls more than `size`
    tasks a batch (`_in_turn` cuts a call that only fits in parts)."""
    while True:
        dealt = _in_turn(units, count, size)
        if dealt and all(densest(calls) <= burst for calls in dealt):
            return [Batch(_in_order(task for unit in calls for task in unit)) for calls in dealt]
        count += 1


def _in_turn(units: list[list[DueTask]], count: int, size: int) -> list[list[list[DueTask]]]:
    """Each call to the next of `count` batches in turn that has room for it; one that none
    has room for in parts, to the next that have some ([] if they have too little)."""
    dealt: list[list[list[DueTask]]] = [[] for _ in range(count)]
    held, turn = [0] * count, 0
    for unit in units:
        order = [i % count for i in range(turn, turn + count)]
        whole = [i for i in order if held[i] + len(unit) <= size]
        rest = unit
        for i in whole[:1] or order:
            part, rest = rest[: size - held[i]], rest[size - held[i] :]
            if part:
                dealt[i].append(part)
                held[i] += len(part)
                turn = i + 1
        if rest:
            return []
    return dealt


def burst_tasks(task_type: TaskType, burst_sends: int) -> int:
    """The tasks due within BURST_SPAN_MS that one batch of `task_type` may hold, at one
    batch key (ten to a call)."""
    if task_type not in BATCHED_TYPES:
        return burst_sends
    return max(1, round(burst_sends / SENDS_PER_CALL)) * BATCH_ENTRIES


def densest(units: list[list[DueTask]]) -> int:
    """The most of `units` (calls, earliest first) due within any BURST_SPAN_MS."""
    most, start = 0, 0
    for end, unit in enumerate(units):
        while unit[0].fires_ms - units[start][0].fires_ms >= BURST_SPAN_MS:
            start += 1
        most = max(most, end - start + 1)
    return most


def crowded(tasks: list[DueTask], window_ms: int, burst_sends: int) -> list[DueTask]:
    """The tasks of a batched type whose windows hold more due within a BURST_SPAN_MS than
    a batch may send as calls of one: where knowing each task's batch key (`calls`) can
    change the packing."""
    alone = max(1, burst_sends // SENDS_PER_CALL)
    return [
        task
        for (task_type, _), members in windows(tasks, window_ms).items()
        if task_type in BATCHED_TYPES and densest([[t] for t in members]) > alone
        for task in members
    ]


class Outcome(StrEnum):
    STARTED = "started"
    ALREADY_STARTED = "already_started"
    # The batch's name was an execution's that had ended without settling these tasks (an
    # operator's stop, say): started again under a new name.
    RENAMED = "renamed"
    CLOSED = "closed"  # that ended execution, before the tasks are renamed (not reported)
    THROTTLED = "throttled"
    FAILED = "failed"
    DEFERRED = "deferred"  # not attempted: the time budget ran out first


def execution_input(batch: Batch, settings: Settings, stagger_s: int = 0) -> dict[str, Any]:
    """The execution input: ids only, the executor to invoke, and the wake time, `stagger_s`
    before the batch's own."""
    return {
        "task_type": batch.task_type.value,
        "executor": EXECUTORS.index(batch.task_type),
        "wake_at": clock.to_iso_second(wake_ms(batch, settings) - stagger_s * 1000),
        "tasks": [task.as_input() for task in batch.tasks],
    }


def wake_ms(batch: Batch, settings: Settings) -> int:
    """The second the batch's execution wakes unless staggered: the lead before its first
    task is due, and the preparation of every further task (claim, target,
    connection: CPU that an executor's share of a core spends before its first gate),
    floored."""
    preparing = settings.prepare_ms_per_task * (len(batch.tasks) - 1)
    wake = batch.first_due_ms - settings.lead_ms - preparing
    return wake - wake % 1000


# An executor sleeps the lead plus its stagger before its first gate: a wake at most this
# much earlier still leaves the invocation's timeout room for retries (see template.yaml).
MAX_STAGGER_S = 12


def attempt_limit_s(task_type: TaskType, settings: Settings) -> float:
    """The longest one send of a task of this type can take (its target's attempt_limit_s)."""
    if task_type is TaskType.WEBHOOK:
        return settings.webhook_attempt_limit_s
    return aws.target_attempt_limit_s()


# Lambda adds at most this many execution environments to one function in this many seconds
# (Lambda's developer guide, "Lambda scaling behavior"): each woken batch may need a new one.
NEW_ENVIRONMENTS, NEW_ENVIRONMENTS_S = 1000, 10


@dataclass
class WakePlan:
    """What the seconds before a window already hold: wakes, claims and environments."""

    settings: Settings
    wakes: Counter[int] = field(default_factory=Counter)
    claims: Counter[int] = field(default_factory=Counter)
    held: Counter[int] = field(default_factory=Counter)
    woken: dict[TaskType, Counter[int]] = field(default_factory=dict)  # by executor

    def fits(self, second: int, batch: Batch) -> bool:
        """Whether a wake of `batch` at `second` keeps every budget: Step Functions'
        wakes, the table's writes (a claim per task; a batch alone may exceed them), Lambda
        environments, each held from its wake until its last attempt can end, and the
        environments Lambda adds to the batch's executor in any 10 s."""
        config = self.settings
        return (
            self.wakes[second] < config.wakes_per_second
            and self.has_claims(second, batch)
            and all(self.held[s] < config.concurrency_budget for s in self._holding(second, batch))
            and self._scales_to(second, batch.task_type)
        )

    def has_claims(self, second: int, batch: Batch) -> bool:
        """Whether the table's writes at `second` leave room for the batch's claims (a
        batch alone may exceed them)."""
        claims = self.claims[second]
        return claims == 0 or claims + len(batch.tasks) <= self.settings.claims_per_second

    def add(self, second: int, batch: Batch) -> None:
        self.wakes[second] += 1
        self.claims[second] += len(batch.tasks)
        self.woken.setdefault(batch.task_type, Counter())[second] += 1
        for held in self._holding(second, batch):
            self.held[held] += 1

    def _holding(self, wake_second: int, batch: Batch) -> range:
        """The seconds an executor woken at `wake_second` holds its environment: until its
        last task's attempt can end, not only its gate (a slow target holds it that long)."""
        limit_ms = int(attempt_limit_s(batch.task_type, self.settings) * 1000)
        return range(wake_second, (batch.tasks[-1].fires_ms + limit_ms) // 1000 + 1)

    def _scales_to(self, second: int, task_type: TaskType) -> bool:
        """Whether one more wake of this executor at `second` leaves every 10 s span that
        holds it within the environments Lambda adds to a function in 10 s."""
        woken = self.woken.get(task_type, Counter())
        return all(
            sum(woken[s] for s in range(start, start + NEW_ENVIRONMENTS_S)) < NEW_ENVIRONMENTS
            for start in range(second - NEW_ENVIRONMENTS_S + 1, second + 1)
        )


def staggers(batches: list[Batch], settings: Settings, now_ms: int) -> dict[Batch, int]:
    """Seconds each batch wakes before its own wake second, so that no second wakes more
    executions than `wakes_per_second`, claims more tasks than the table's write rate, or
    holds more environments than `concurrency_budget`: a crowded second overflows to the
    latest one before it that has room (never before now, nor more than MAX_STAGGER_S
    early). A batch that fits nowhere wakes at its own second, where it holds an
    environment the shortest time, unless the table's writes there are spent: then it
    wakes at the first later second that has them, and fires late (a claim the table
    throttles past its retries would fail it). Only the gates then release together; a
    negative stagger is a late wake."""
    plan = WakePlan(settings)
    stagger = {}
    for batch in sorted(batches):
        own = wake_ms(batch, settings) // 1000
        earliest = max(own - MAX_STAGGER_S, now_ms // 1000)
        second = next((s for s in range(own, earliest - 1, -1) if plan.fits(s, batch)), None)
        if second is None:
            second = next(s for s in itertools.count(own) if plan.has_claims(s, batch))
        plan.add(second, batch)
        stagger[batch] = own - second
    return stagger


def execution_arn(state_machine_arn: str, name: str) -> str:
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"


def machine_of(execution: str) -> str:
    """The ARN of the state machine whose execution `execution` (an ARN) is."""
    return execution.rpartition(":")[0].replace(":execution:", ":stateMachine:", 1)


def execution_name(arn: str) -> str:
    """An execution's name, what a claim records of it (its ARN adds 100 bytes to each
    write of the item; the state machine's is in the settings)."""
    return arn.rsplit(":", 1)[1]


# A few attempts only (backoff ~1, 2, 4 s): a start still throttled after them waits for the
# next finder run rather than stalling this one.
SFN_RETRIES = 4  # botocore counts these after the first call
# A due-soon task's start in its writer's request waits this long at most: with its
# retries a start could take over a minute, past the API's 29 s. Left unanswered, the task
# goes to a check shard, as a start that failed does (the late start, if it comes, is the
# same execution: its name is the task's).
START_WITHIN_MS = 5_000


def _sfn() -> Any:
    # Standard mode: exponential backoff with jitter, bounded per call. Adaptive mode's
    # client-side limiter blocks a thread with no deadline; under sustained throttling it
    # held a finder run for minutes (`tocsin chaos --scenarios throttled-starts`).
    return aws.client("stepfunctions", retry_mode="standard", max_attempts=SFN_RETRIES)


def start(batch: Batch, settings: Settings, stagger_s: int = 0) -> tuple[Outcome, str | None]:
    """Start the batch's execution; the outcome and the execution's ARN (None if not started)."""
    sfn = _sfn()
    try:
        arn = sfn.start_execution(
            stateMachineArn=settings.state_machine_arn,
            name=batch.execution_name,
            input=json.dumps(execution_input(batch, settings, stagger_s), sort_keys=True),
        )["executionArn"]
        return Outcome.STARTED, arn
    except sfn.exceptions.ExecutionAlreadyExists:
        # Taken by a running execution (one started before, its input since restaggered), or
        # by one that has ended without settling them: then they start again, renamed.
        arn = execution_arn(settings.state_machine_arn, batch.execution_name)
        ended = _ended(sfn, arn)
        if ended is None:  # not known: tried again, as a start that failed
            return Outcome.FAILED, None
        return (Outcome.CLOSED, None) if ended else (Outcome.ALREADY_STARTED, arn)
    except Exception as error:  # left for the next finder run or the reconciler's look
        outcome = Outcome.THROTTLED if aws.is_transient(error) else Outcome.FAILED
        logger.warning(
            "start failed",
            execution=batch.execution_name,
            outcome=outcome,
            error=aws.error_code(error),
        )
        return outcome, None


def _ended(sfn: Any, arn: str) -> bool | None:
    """Whether DescribeExecution says the execution has ended (None: it refused to say)."""
    try:
        return bool(sfn.describe_execution(executionArn=arn)["status"] != "RUNNING")
    except (BotoCoreError, ClientError) as fault:
        logger.warning("execution not described", error=aws.error_code(fault))
        return None


def renamed(store: TaskStore, batch: Batch) -> Batch:
    """The batch's tasks counted in `requeues` (those still PENDING): a batch of a new name."""
    now_iso = clock.to_iso(clock.now_ms())
    return Batch(
        tuple(
            replace(task, requeues=task.requeues + 1)
            for task in batch.tasks
            if store.rename(task.task_id, task.version, task.requeues, now_iso)
        )
    )


STARTED = (Outcome.STARTED, Outcome.ALREADY_STARTED, Outcome.RENAMED)  # a batch's execution runs


@dataclass(frozen=True)
class DispatchReport:
    """What a finder run did, counted in tasks (a batch's outcome counts for each member)."""

    found: int
    outcomes: Counter[Outcome]
    executions: int = 0  # executions started (or found started)
    left: tuple[DueTask, ...] = ()  # not started: throttled, refused or deferred

    @property
    def backlog(self) -> int:
        """Tasks left PENDING for the next run."""
        return self.found - sum(self.outcomes[outcome] for outcome in STARTED)

    def as_dict(self) -> dict[str, int]:
        counts = {o.value: self.outcomes[o] for o in Outcome if o is not Outcome.CLOSED}
        return {
            "found": self.found,
            **counts,
            "backlog": self.backlog,
            "executions": self.executions,
        }


def dispatch_all(tasks: list[DueTask], settings: Settings, deadline: float) -> DispatchReport:
    """Pack, then dispatch earliest first, in parallel, until `deadline` (a time.monotonic()
    value); batches due together wake staggered.

    Once a start is throttled past botocore's retries, the run starts no more: the finder's
    next run reads again from the first task not started, and every batch started after
    it is started again then (the same name: no second execution, but a call of the same
    quota), so the fewer of those, the sooner the rest starts."""
    store = TaskStore(settings.tasks_table)
    batches = pack(tasks, settings.batch_window_ms, settings.batch_size, settings.burst_sends)
    stagger = staggers(batches, settings, clock.now_ms())

    spent = threading.Event()  # StartExecution's quota, past botocore's retries

    def one(batch: Batch) -> Outcome:
        if time.monotonic() >= deadline or spent.is_set():
            return Outcome.DEFERRED
        stagger_s = stagger[batch]
        outcome, arn = start(batch, settings, stagger_s)
        if outcome is Outcome.THROTTLED:
            spent.set()
        if outcome is Outcome.CLOSED:
            batch = renamed(store, batch)
            if not batch.tasks:  # none still PENDING: what changed them settles them
                return Outcome.ALREADY_STARTED
            outcome, arn = start(batch, settings, stagger_s)
            outcome = Outcome.RENAMED if arn is not None else outcome
        return outcome

    with ThreadPoolExecutor(max_workers=settings.dispatch_workers) as starting:
        outcomes = list(starting.map(one, batches))
    counted: Counter[Outcome] = Counter()
    left: list[DueTask] = []
    for batch, outcome in zip(batches, outcomes, strict=True):
        counted[outcome] += len(batch.tasks)
        if outcome not in STARTED:
            left += batch.tasks
    started = sum(o in (Outcome.STARTED, Outcome.ALREADY_STARTED) for o in outcomes)
    return DispatchReport(len(tasks), counted, started, tuple(left))


def due_task(item: dict[str, Any]) -> DueTask:
    """A stored task (or its due index entry) as the dispatcher sees it."""
    due = item.get("next_attempt_ms", item["due_ms"]) if "due_ms" in item else item["gsi_due_ms"]
    return DueTask(
        int(due),  # the item's (at its next attempt, RETRYING), or its index entry's
        item["task_id"],
        int(item["version"]),
        TaskType(item["task_type"]),
        int(item.get("requeues", 0)),
        int(item.get("planned_ms", 0)),
    )


def due_soon(item: dict[str, Any], settings: Settings) -> bool:
    """Whether a task is due within the look-ahead (and the index's lag) of now: its writer
    starts it, since the finder may not see it in time, and it may have an execution
    already. Every task its writer owns (`index_keys.writers_own`) is, as is one whose put
    took so long that a finder run may have read past it meanwhile: the same test, as of
    now rather than of its placing."""
    return writers_own(due_task(item).due_ms, clock.now_ms(), settings)


def dispatch_if_due_soon(item: dict[str, Any], settings: Settings) -> None:
    """Start a just-placed PENDING task now if it is due soon (`due_soon`), as a batch of
    its own. A start that fails puts the task in a check shard, where the reconciler's
    next look starts it. Started twice (a retried request), it is the same execution: its
    name and input are the task's."""
    if not due_soon(item, settings):
        return
    task = due_task(item)
    try:
        _, arn = cutoff.within(
            clock.now_ms() + START_WITHIN_MS,
            lambda: start(Batch((task,)), settings),
            TimeoutError("no answer from StartExecution"),
        )
    except TimeoutError:
        arn = None
    if arn is None:
        look_again_now((task,), settings)


def look_again_now(tasks: tuple[DueTask, ...], settings: Settings) -> None:
    """Put tasks their writer could not start in a check shard, for the reconciler's next
    look to start (the finder does not read what is not its own)."""
    store, now = TaskStore(settings.tasks_table), clock.now_ms()
    for task in tasks:
        store.look_again(task.task_id, task.version, check_keys(task.task_id, now, settings))


def stop_own_execution(item: dict[str, Any], reason: str, settings: Settings) -> None:
    """Stop the execution of a task that changed, if the task may have one of its own; a
    shared execution goes on for the rest of its batch, and its claim of this task fails
    anyway. Best effort: an execution that never started or already finished is harmless."""
    if not due_soon(item, settings):
        return
    arn = execution_arn(settings.state_machine_arn, Batch((due_task(item),)).execution_name)
    try:
        _sfn().stop_execution(executionArn=arn, cause=reason)
    except Exception as error:  # none, already finished, or the service is busy: harmless
        logger.info("stop skipped", execution=arn, error=aws.error_code(error))
