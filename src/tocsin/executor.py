"""What every typed executor does with its batch: claim, prepare, gate, send once, finish.

The state machine invokes the type's executor once per batch, with ids, versions and due
milliseconds only. The executor claims each task (the exactly-once lock, held by this
invocation until its end: `TaskStore.claim`), reads the task from the claim's reply, and
gives each call a thread of its own: a task alone, or the SQS, SNS and EventBridge tasks
due in one millisecond at one queue, topic or bus, ten to a call (`sends`). The thread
prepares the call, sleeps to the due millisecond, sends, retries transient failures
(a call's, or its entries') with backoff in the time the invocation has left, then marks
each task SUCCEEDED (the sent marker, conditional on this invocation), or FAILED with a
dead-letter message of its own, in one write with the callback task it owes so ended, if
any (`tocsin.callbacks`), which the invocation starts once its sends are done. A slow
target holds up only its own call, and a target's unforeseen error (neither transient
nor permanent) fails only its own call's tasks.

Only what concerns the whole batch fails the invocation, for the state machine to retry:
a claim or mark that could not be written in the time the invocation has
(`TableUnavailable`), a task a live invocation of this execution still holds
(`DeliveryInProgress`), or a task never tried for want of time (`NoTimeToSend`). Failing,
the invocation lets go of the tasks it has not finished, so the retry takes them over at
once; a task it sent but could not mark is written to the sent log (`tocsin.sent`), which
an invocation reads before it sends a task it takes over.
"""

import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, TypeVar

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as EndpointUnreachable
from pydantic import BaseModel, Field, ValidationError

from tocsin import aws, clock, cutoff, gate
from tocsin.callbacks import callback_item, callback_key, needed
from tocsin.dead_letter import send_letter
from tocsin.dispatch import (
    START_WITHIN_MS,
    DueTask,
    dispatch_all,
    due_task,
    execution_name,
    look_again_now,
    machine_of,
)
from tocsin.errors import Busy, PermanentTargetError, TransientTargetError
from tocsin.flow import (
    SLOT_SLACK_MS,
    TICKET_AHEAD_MS,
    Flow,
    Leases,
    NoLeaseInTime,
    RateLedger,
    flow_of,
)
from tocsin.index_keys import LOOK_AFTER_MS, check_keys, owed_letter_keys
from tocsin.model import (
    BATCH_ENTRIES,
    DEFAULT_MAX_ATTEMPTS,
    TASK_ID_PATTERN,
    TaskStatus,
    TaskType,
    idempotency_key,
)
from tocsin.observability import logger, metrics
from tocsin.sent import Fired, SentLog, Try
from tocsin.settings import settings
from tocsin.store import Claim, Holder, TaskStore
from tocsin.targets import TARGETS, Delivery, Target, parse_target
from tocsin.targets.base import BATCH_BYTES, Answer, BatchedTarget, entry_bytes

CLAIM_WORKERS = 32
FINISH_MARGIN_MS = 3000  # kept back from retries for the final marks and dead letters
CLAIMS_SHARE = 3  # of the time, for claims: then a fresh invocation beats sends out of time
MARK_MARGIN_MS = 1000  # kept back from the final marks' retries for a dead letter and the reply
WRITE_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # between tries of one claim or mark, with jitter
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # before the 2nd, 3rd, 4th and 5th attempt
Written = TypeVar("Written")  # what a claim or mark returns


class TableUnavailable(Exception):
    """A claim or a final mark could not be written in the invocation's time (the table is
    busy or down): the invocation is retried, and takes back what it holds."""


class DeliveryInProgress(Exception):
    """Another invocation is delivering a task of this batch: retry after it has ended."""


class HandOn(Exception):
    """A task of a flow cannot be sent in this invocation's time (its slot is past it, or
    no lease of its flow came free): it goes on, PENDING, to an execution that wakes at
    `planned_ms`."""

    def __init__(self, planned_ms: int):
        super().__init__(planned_ms)
        self.planned_ms = planned_ms


@dataclass(frozen=True)
class HandedOn:
    """A task this invocation handed on (`HandOn`); `given` once its item says so."""

    planned_ms: int
    given: bool


class NoTimeToSend(Exception):
    """A task of the batch was never tried and this invocation has no time left for one
    attempt (a failed init took its time, say): a fresh invocation tries it."""


class BatchTask(BaseModel):
    task_id: str = Field(pattern=TASK_ID_PATTERN)
    version: int = Field(ge=1)
    due_ms: int
    planned_ms: int = 0  # its flow's slot, when it was handed on to wake for it


class BatchEvent(BaseModel):
    """What the state machine passes: the execution, the type and the batch's ids."""

    execution: str
    task_type: TaskType
    tasks: list[BatchTask] = Field(min_length=1)


@dataclass(frozen=True)
class ClaimedTask:
    task_id: str
    version: int
    due_ms: int
    target: Target
    payload_json: bytes  # UTF-8, as a webhook sends it: no copy of a 200 KB body per send
    max_attempts: int
    requeues: int = 0
    flow: Flow | None = None  # the limits it shares with its key's tasks (tocsin.flow)
    planned_ms: int = 0  # its flow's slot, when later than its due time
    leases: Leases | None = None  # its flow's leases in this invocation, if it limits those
    ledger: RateLedger | None = None  # where its flow's sends take their slots, if a rate

    @property
    def fires_ms(self) -> int:
        """When its gate lets it go: its due time, or its flow's slot."""
        return max(self.due_ms, self.planned_ms)

    def delivery(self) -> Delivery:
        return Delivery(
            task_id=self.task_id,
            version=self.version,
            idempotency_key=(
                callback_key(self.task_id) or idempotency_key(self.task_id, self.version)
            ),
            payload_json=self.payload_json,
        )

    @cached_property
    def entry(self) -> dict[str, Any]:
        """Its entry of a batched target's call, built once: `sends` sizes it, `_call`
        sends it (its envelope re-encodes a payload of up to 200 KB)."""
        return self.target.entry(self.delivery())  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Failed:
    error: str  # the failure's kind, as the stored error's "Error"
    cause: str
    attempts: int
    tries: tuple[Try, ...] = ()  # the attempts that failed, the last one among them


Recorded = tuple[Fired | Failed, bool]  # a task's outcome, and whether its mark was written


def _deliver(tasks: list[ClaimedTask], lease_by_ms: int) -> tuple[int, int, list[Answer]]:
    """Build the call, sleep to the due millisecond (or the flow's slot, and a lease of
    its flow, if it needs one: waited for until `lease_by_ms`), then send: the time the
    gate let go, how long the flow held the call past its due time, and each task's
    answer."""
    first = tasks[0]
    try:
        call = _targets_own(_call, tasks)  # before the gate: after it only the request is left
        with _flow_turn(first, lease_by_ms) as (fired_ms, held_ms):
            if gate.WATCH:
                gate.WATCH.let_go()
            return fired_ms, held_ms, _targets_own(call)
    except (PermanentTargetError, TransientTargetError) as error:  # for the whole call
        return clock.now_ms(), 0, [error] * len(tasks)


# A send that needs a lease of its flow looks for one this long before its gate (a read and
# a write of the key's lease items): a lease held through a long wait for a rate's slot
# would keep it from the key's other sends.
LEASE_AHEAD_MS = 100


@contextmanager
def _flow_turn(task: ClaimedTask, lease_by_ms: int) -> Iterator[tuple[int, int]]:
    """Sleep until the task may be sent, and hold what its flow needs for the send: its
    planned slot (its due time without a flow), a lease of its flow if it limits sends in
    flight, and a slot of its flow's sends if it has a rate (`RateLedger.ticket`); a lease
    not had by `lease_by_ms`, or a slot past it, hands the task on (`HandOn`), for a send
    then could not end in this invocation's time. A gate late for its slot takes one more,
    a moment ahead (the write done by then), and goes in that one however late: on a CPU
    so busy that gates miss their slots again and again, taking a slot for each miss would
    move the flow's slots ahead faster than its sends, and no send would go. The
    millisecond its gate let go, and how long its flow held it: from its due time (or now,
    if later: an invocation that comes late is not its flow's doing) to its slot or lease."""
    came_ms = max(task.due_ms, clock.now_ms())
    with _leased(task, task.fires_ms, lease_by_ms) as free_ms:
        ready_ms = max(task.fires_ms, free_ms, came_ms)
        if task.ledger is None:
            yield gate.wait_until(ready_ms), ready_ms - came_ms
            return
        gate.wait_until(ready_ms - TICKET_AHEAD_MS)
        ready_ms = max(ready_ms, clock.now_ms() + task.ledger.lead_ms())  # if already due
        for last_try in (False, True):
            slot_ms = task.ledger.ticket(task.flow, ready_ms)  # type: ignore[arg-type]
            if slot_ms > lease_by_ms:  # a send then could not end in this invocation's time
                raise HandOn(slot_ms)
            fired_ms = gate.wait_until(slot_ms)
            if fired_ms <= slot_ms + SLOT_SLACK_MS or last_try:
                yield fired_ms, max(0, slot_ms - came_ms)
                return
            # The last try goes however late: its slot well ahead, so that it is on time.
            ready_ms = fired_ms + TICKET_AHEAD_MS


@contextmanager
def _leased(task: ClaimedTask, slot_ms: int, by_ms: int) -> Iterator[int]:
    """A lease of the task's flow held for its send in `slot_ms`, if it limits sends in
    flight: the millisecond one was free (0 when it needs none)."""
    if task.leases is None:
        yield 0
        return
    gate.wait_until(slot_ms - LEASE_AHEAD_MS)
    try:
        with task.leases.sending(by_ms) as free_ms:
            yield free_ms
    except NoLeaseInTime:
        raise HandOn(clock.now_ms()) from None


def _call(tasks: list[ClaimedTask]) -> Callable[[], list[Answer]]:
    """The call that sends `tasks`: a batched target's tasks in one, any other's alone."""
    target = tasks[0].target
    if not isinstance(target, BatchedTarget):
        [delivery] = [task.delivery() for task in tasks]
        return lambda: [target.send(delivery)]
    entries = [task.entry for task in tasks]
    return lambda: type(target).send_entries(target.batch_key(), entries)


Returned = TypeVar("Returned")


def _targets_own(call: Callable[..., Returned], *args: Any) -> Returned:
    """A target's call, whose unforeseen error (a host the resolver cannot encode, a bug)
    fails its tasks alone, for good: raised, it would fail the whole batch's invocation,
    and each retry would meet it again."""
    try:
        return call(*args)
    except (PermanentTargetError, TransientTargetError):
        raise
    except Exception as error:  # logged by name and place: its message may hold the target
        place = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{place.filename.rsplit('/', 1)[-1]}:{place.lineno}"
        logger.error("unforeseen target error", error=type(error).__name__, where=where)
        raise PermanentTargetError(f"unforeseen {type(error).__name__} in the target") from error


def fire(tasks: list[ClaimedTask], deadline_ms: int) -> list[Fired | Failed]:
    """Prepare, gate and send tasks due in one millisecond that share a call (`sends`), or
    one task alone; transient failures again after a backoff, while attempts allow another
    and it can end before `deadline_ms` (one attempt may take the target's
    `attempt_limit_s`: an invocation killed mid-attempt may have acted unrecorded, and
    its retry would act again). Each task's outcome, in order."""
    due_ms, limit_ms = tasks[0].fires_ms, int(tasks[0].target.attempt_limit_s * 1000)
    outcomes: dict[int, Fired | Failed] = {}
    tries: list[list[Try]] = [[] for _ in tasks]  # each failed attempt, when and why
    pending, prepared, attempts, fired_ms, held_ms = list(range(len(tasks))), set(), 0, due_ms, 0

    def failed(i: int, cause: str) -> None:
        outcomes[i] = Failed("PermanentTargetError", cause, attempts, tuple(tries[i]))

    while pending:
        if max(clock.now_ms(), due_ms) + limit_ms > deadline_ms:  # it begins at the gate
            if not attempts:  # never tried: a fresh invocation will have the time
                raise NoTimeToSend(", ".join(task.task_id for task in tasks))
            for i in pending:
                failed(i, f"out of time after {attempts} attempts")
            break
        attempts += 1
        began_ms = max(clock.now_ms(), due_ms)
        answers: dict[int, Answer] = {}
        for i in pending:
            if i not in prepared:
                try:
                    _targets_own(tasks[i].target.prepare)
                    prepared.add(i)
                except (PermanentTargetError, TransientTargetError) as error:
                    answers[i] = error
        ready = [i for i in pending if i not in answers]
        if ready and max(clock.now_ms(), due_ms) + limit_ms > deadline_ms:
            attempts -= 1  # preparing took the time an attempt needed
            continue
        if ready:
            lease_by_ms = deadline_ms - limit_ms
            try:
                fired_ms, held_ms, sent = _deliver([tasks[i] for i in ready], lease_by_ms)
            except HandOn:  # a flow's task, alone in its call
                if attempts == 1:  # never sent: it goes on with all its attempts ahead
                    raise
                attempts -= 1  # a retry its flow could not let go in time: out of time, as
                for i in pending:  # any retry, its tries kept (going on, it would start over)
                    failed(i, f"out of time after {attempts} attempts: its flow had no turn")
                break
            answers.update(zip(ready, sent, strict=True))
        pending = []
        for i, answer in sorted(answers.items()):
            if isinstance(answer, dict):
                outcomes[i] = Fired(fired_ms, answer, attempts, tuple(tries[i]), held_ms)
                continue
            tries[i].append(_failed_try(began_ms, answer))
            if isinstance(answer, PermanentTargetError):
                failed(i, str(answer))
            elif attempts >= tasks[i].max_attempts:
                failed(i, f"gave up after {attempts} attempts: {answer}")
            else:
                pending.append(i)
        if pending:
            pause_s = BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1]
            if clock.now_ms() + pause_s * 1000 + limit_ms > deadline_ms:
                for i in pending:
                    failed(i, f"out of time after {attempts} attempts: {answers[i]}")
                break
            time.sleep(pause_s)
    return [outcomes[i] for i in range(len(tasks))]


# A failed attempt's error as its history keeps it: enough to tell why, and a task's item
# stays small whatever a target answers (max_attempts is 5 at most).
TRY_ERROR_CHARS = 300


def _failed_try(began_ms: int, error: Exception) -> Try:
    return {"at": clock.to_iso(began_ms), "error": str(error)[:TRY_ERROR_CHARS]}


def _claimed(item: dict[str, Any], asked: BatchTask, task_type: TaskType) -> ClaimedTask | Failed:
    """The claimed item as a task to fire; a stored task that does not parse fails for good."""
    try:
        if item["task_type"] != task_type:
            raise ValueError(f"a {item['task_type']} task reached the {task_type} executor")
        return ClaimedTask(
            task_id=asked.task_id,
            version=asked.version,
            due_ms=asked.due_ms,
            target=parse_target(task_type, json.loads(item["target"])),
            payload_json=item["payload"].encode(),
            max_attempts=int(item.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
            requeues=int(item.get("requeues", 0)),
            flow=flow_of(item),
            planned_ms=int(item.get("planned_ms", 0)),
        )
    except (ValidationError, KeyError, ValueError, TypeError, AttributeError) as error:
        return Failed("PermanentTargetError", f"malformed stored task: {error}", 0)


def written(task_id: str, deadline_ms: int, write: Callable[[], Written]) -> Written:
    """A claim or final mark, tried again while the invocation has time before `deadline_ms`
    for another try as long as the last (a try may hold botocore's own retries); then
    TableUnavailable, for the invocation to be retried.

    botocore's standard mode shares one retry quota per client, and stops retrying when it
    is spent: in a brownout, a batch's hundreds of writes spend it in a few dozen retried
    500s, and every write after that would fail on its first refusal, failing the whole
    batch. Each write here keeps its own tries. Claims and marks are safe to repeat: a try
    that committed unseen is found by the next (`TaskStore.claim`, `TaskStore.finish`).
    A fault no later try can mend (a malformed request, no credentials) is not retried,
    and a refusal that is not the table's state (a 4xx) is raised as it is.
    """
    tries = 0
    while True:
        tries += 1
        began = clock.now_ms()
        if began > deadline_ms:  # queued behind the batch's other writes past the deadline
            raise TableUnavailable(f"{task_id}: no time left to write")
        try:
            return write()
        except (BotoCoreError, ClientError) as fault:
            if isinstance(fault, ClientError) and not aws.is_transient(fault):
                raise
            pause_s = WRITE_PAUSES_S[min(tries, len(WRITE_PAUSES_S)) - 1] * random.uniform(0.5, 1)
            took_ms = clock.now_ms() - began
            if not _may_pass(fault) or clock.now_ms() + pause_s * 1000 + took_ms > deadline_ms:
                raise TableUnavailable(f"{task_id}: {type(fault).__name__}") from fault
            time.sleep(pause_s)


def answered_by(deadline_ms: int, write: Callable[[], Written]) -> Written:
    """`write`'s answer, or TableUnavailable at `deadline_ms` if it has none by then. A
    final mark's try could hang past the invocation's end (botocore's own retries, each up
    to its read timeout): Lambda would kill the invocation with the task sent and no record
    of it, and the retry would send it again. Cut off, the mark leaves the time to write
    the sent log (`execute`). A write that cannot outlast the deadline is made here,
    without a thread of its own."""
    if clock.now_ms() + aws.call_limit_s() * 1000 <= deadline_ms:
        return write()
    return cutoff.within(
        deadline_ms, write, TableUnavailable("no answer before the invocation's end")
    )


def _may_pass(fault: Exception) -> bool:
    """A fault a later try may not meet: throttling, a 5xx, a connection that failed."""
    if isinstance(fault, ClientError):
        return aws.is_transient(fault)
    return isinstance(fault, (EndpointUnreachable, HTTPClientError))


@dataclass(frozen=True)
class Held:
    """A task this invocation claimed: what to fire (or why it cannot be), and whether an
    earlier invocation held it (taken over, or requeued by the reconciler), which may have
    sent it: the sent log is read before sending it again."""

    asked: BatchTask
    task: ClaimedTask | Failed
    held_before: bool
    ending: dict[str, Any] | None = None  # what its callbacks need of it, if it names any


def sends(held: list[Held]) -> list[list[Held]]:
    """The calls a batch's tasks go out in: those of a batched target due in one
    millisecond at one queue, topic or bus, ten to a call and 256 KiB at most (an entry
    larger than that alone); any other task alone, as is each task of a flow (its limits
    count sends). In the batch's order."""
    calls: list[list[Held]] = []
    open_calls: dict[tuple[int, type, str], tuple[list[Held], int]] = {}
    for each in held:
        task = each.task
        if (
            isinstance(task, Failed)
            or not isinstance(task.target, BatchedTarget)
            or task.flow is not None
        ):
            calls.append([each])
            continue
        key = (task.due_ms, type(task.target), task.target.batch_key())
        size = entry_bytes(task.entry)
        call, used = open_calls.get(key, ([], 0))
        if not call or len(call) == BATCH_ENTRIES or used + size > BATCH_BYTES:
            call, used = [], 0
            calls.append(call)
        call.append(each)
        open_calls[key] = (call, used + size)
    return calls


def claim_batch(
    store: TaskStore, batch: BatchEvent, holder: Holder, deadline_ms: int
) -> tuple[list[Held], list[str]]:
    """Claim every task of the batch at once: the ones this invocation holds now, and the
    ids a live invocation of this execution holds (`DeliveryInProgress`). If a claim cannot
    be written, the tasks claimed are let go before `TableUnavailable` is raised, and so
    are those whose claims went unanswered: a write answered with a 500 or not answered at
    all may have gone through (a let-go is conditional on this attempt)."""

    def claim(asked: BatchTask) -> Claim:
        return written(
            asked.task_id,
            deadline_ms,
            lambda: store.claim(asked.task_id, asked.version, holder, clock.now_ms()),
        )

    with ThreadPoolExecutor(max_workers=min(CLAIM_WORKERS, len(batch.tasks))) as pool:
        futures = [pool.submit(claim, asked) for asked in batch.tasks]
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    claims = [
        (asked, f.result())
        for asked, f in zip(batch.tasks, futures, strict=True)
        if not f.exception()
    ]
    won = [(asked, claim) for asked, claim in claims if claim.before is not None]
    if failed is not None:  # a claim not answered may have been written all the same
        unanswered = [a for a, f in zip(batch.tasks, futures, strict=True) if f.exception()]
        _let_go(store, holder, [asked for asked, _ in won] + unanswered)
        raise failed
    try:  # the bodies kept apart, read at once (one BatchGetItem a hundred)
        items = store.whole([claim.before for _, claim in won])  # type: ignore[misc]
    except (BotoCoreError, ClientError, Busy) as fault:
        _let_go(store, holder, [asked for asked, _ in won])
        raise TableUnavailable(f"bodies: {type(fault).__name__}") from fault
    held = []
    for (asked, claim), item in zip(won, items, strict=True):
        task = _claimed(item, asked, batch.task_type)
        held.append(Held(asked, task, claim.taken_over or "requeues" in item, needed(item)))
        item.clear()  # its payload's text goes now: a batch's bodies are held once, as bytes
    return held, [asked.task_id for asked, claim in claims if claim.in_progress]


def plan_flows(
    store: TaskStore, held: list[Held], holder: Holder, deadline_ms: int
) -> tuple[list[Held], list[Held]]:
    """Give each claimed task of a flow with a rate its slot (`tocsin.flow`), all of one
    flow's in one write to its ledger, earliest due first; a task that keeps a slot from an
    earlier claim keeps it. A slot later than the task's due time is written on the task;
    one later than this invocation can wait for (a send must be able to end by
    `deadline_ms`) is handed on, for an execution that wakes for it. The tasks to fire
    now, with their slots and their flows' leases, and those handed on. A write that
    cannot be made in time lets go of every task and raises TableUnavailable, as a
    claim's does."""
    ledger = RateLedger(store.table_name)
    unplanned: dict[Flow, list[int]] = {}
    for i, each in enumerate(held):
        task = each.task
        if isinstance(task, ClaimedTask) and task.flow and task.flow.rate and not task.planned_ms:
            unplanned.setdefault(task.flow, []).append(i)
    later: dict[int, int] = {}  # the slots later than their tasks' due times
    try:
        for flow, members in unplanned.items():
            members.sort(key=lambda i: held[i].asked.due_ms)
            dues = [held[i].asked.due_ms for i in members]
            slots = written(flow.key, deadline_ms, lambda: ledger.plan(flow, dues))  # noqa: B023
            later |= {i: s for i, s, due in zip(members, slots, dues, strict=True) if s > due}
        handed_on = _write_slots(store, held, holder, later, deadline_ms)
    except TableUnavailable:
        _let_go(store, holder, [each.asked for each in held])
        raise
    slotted = [
        replace(each, task=replace(each.task, planned_ms=later[i])) if i in later else each  # type: ignore[type-var]
        for i, each in enumerate(held)
    ]
    firing = [each for i, each in enumerate(slotted) if i not in handed_on]
    return _with_limits(ledger, firing, holder), [slotted[i] for i in handed_on]


def _write_slots(
    store: TaskStore, held: list[Held], holder: Holder, later: dict[int, int], deadline_ms: int
) -> set[int]:
    """Write each slot on its task: handed on, PENDING, if its send could not end by
    `deadline_ms`; the tasks handed on."""

    def write(i: int) -> bool:
        asked, slot = held[i].asked, later[i]
        limit_ms = held[i].task.target.attempt_limit_s * 1000  # type: ignore[union-attr]
        if slot + limit_ms <= deadline_ms:
            plan = lambda: store.plan(asked.task_id, asked.version, holder.attempt, slot)  # noqa: E731
            written(asked.task_id, deadline_ms, plan)
            return False
        return _given_back(store, holder, asked, slot, deadline_ms)

    if not later:
        return set()
    with ThreadPoolExecutor(max_workers=min(CLAIM_WORKERS, len(later))) as pool:
        handed = dict(zip(later, pool.map(write, later), strict=True))
    return {i for i, on in handed.items() if on}


def _given_back(
    store: TaskStore, holder: Holder, asked: BatchTask, slot_ms: int, deadline_ms: int
) -> bool:
    """Hand a claimed task on for its slot (`TaskStore.hand_on`), in a check shard for a
    look once it should have fired; whether it was this attempt's to hand on."""
    keys = check_keys(asked.task_id, slot_ms + LOOK_AFTER_MS, settings())
    return written(
        asked.task_id,
        deadline_ms,
        lambda: store.hand_on(asked.task_id, asked.version, holder.attempt, slot_ms, keys),
    )


def _with_limits(ledger: RateLedger, held: list[Held], holder: Holder) -> list[Held]:
    """The tasks, each of a flow given what keeps its flow's limits in this invocation:
    its leases (one `Leases` a flow with a parallelism), and the ledger its sends take
    their slots on, if it has a rate."""
    flows = {
        each.task.flow
        for each in held
        if isinstance(each.task, ClaimedTask) and each.task.flow is not None
    }
    table, until_ms = ledger.table_name, holder.lease_until_ms
    limits = {
        flow: {
            "leases": Leases(table, flow, holder.attempt, until_ms) if flow.parallelism else None,
            "ledger": ledger if flow.rate else None,
        }
        for flow in flows
    }
    return [
        replace(each, task=replace(each.task, **limits[each.task.flow]))  # type: ignore[arg-type]
        if isinstance(each.task, ClaimedTask) and each.task.flow in limits
        else each
        for each in held
    ]


def _hand_on(held: list[Held], batch: BatchEvent, deadline_ms: int) -> None:
    """Start the executions that wake for the slots of the tasks handed on."""
    tasks = [
        DueTask(
            each.asked.due_ms,
            each.asked.task_id,
            each.asked.version,
            batch.task_type,
            each.task.requeues,  # type: ignore[union-attr]
            each.task.planned_ms,  # type: ignore[union-attr]
        )
        for each in held
    ]
    _start(tasks, batch.execution, deadline_ms, "handed on")


def _let_go(store: TaskStore, holder: Holder, tasks: list[BatchTask]) -> None:
    """End this invocation's hold on `tasks` (it is failing before finishing them), so that
    the retry takes them over at once rather than after the invocation's time. Once each,
    unchecked: a hold not let go ends with the invocation's time all the same."""
    for asked in tasks:
        try:
            store.let_go(asked.task_id, asked.version, holder.attempt)
        except (BotoCoreError, ClientError) as fault:
            logger.warning("hold not let go", task_id=asked.task_id, fault=type(fault).__name__)


def _finish(
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
    else:
        status = TaskStatus.FAILED
        error = {"Error": outcome.error, "Cause": outcome.cause}
        fields["error"] = json.dumps(error)
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
        outcomes: dict[int, Fired | Failed] = {}
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
                return [HandedOn(slot, _given_back(store, holder, each.asked, slot, by_ms))]
            outcomes.update(zip(to_fire, fired, strict=True))
        return [record(each, outcomes[i]) for i, each in enumerate(call)]

    def record(each: Held, outcome: Fired | Failed) -> Recorded | Exception:
        asked = each.asked
        try:
            mark_by = ends_ms - MARK_MARGIN_MS
            return outcome, _finish(store, batch, holder, each, outcome, mark_by, callbacks)
        except Exception as error:
            if isinstance(outcome, Fired):  # sent, and the table will not say so
                expires_at = config.expires_at(asked.due_ms)
                try:
                    sent_log.record(asked.task_id, asked.version, outcome, expires_at)
                except Exception as unlogged:
                    return unlogged
            return error

    counts = Counter(tasks=len(batch.tasks), claimed=len(held) + len(handed_on))
    callbacks: list[dict[str, Any]] = []  # the callback tasks the final marks made
    if handed_on:
        counts["handed_on"] = len(handed_on)
    with ThreadPoolExecutor(max_workers=1) as handing:  # beside the sends: their gates go on
        if handed_on:
            handing.submit(_hand_on, handed_on, batch, ends_ms - MARK_MARGIN_MS)
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
    leases = {each.task.leases for each in held if isinstance(each.task, ClaimedTask)} - {None}
    try:
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            futures = [pool.submit(run, call) for call in calls]
    finally:  # every send made: the flows' leases go back at once
        for flow_leases in leases:
            flow_leases.release()  # type: ignore[union-attr]
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
        _hand_on(onward, batch, ends_ms - MARK_MARGIN_MS)
    failed = [(each, result) for each, result in done if isinstance(result, BaseException)]
    if failed:  # the others are done; the retry takes these over at once
        _let_go(store, holder, [each.asked for each, _ in failed])
    if callbacks:  # those of the tasks that ended, whatever became of the others
        counts["callbacks"] = len(callbacks)
        tasks = [due_task(item) for item in callbacks]
        _start(tasks, batch.execution, ends_ms - MARK_MARGIN_MS, "callbacks")
    if failed:
        raise failed[0][1]
    for each, (outcome, recorded) in done:  # type: ignore[misc]
        _report(each.asked, outcome, counts)
        if not recorded:  # the task changed under the claim, or a later attempt took it
            counts["unrecorded"] += 1
            metrics.add_metric(name="OutcomeUnrecorded", unit=MetricUnit.Count, value=1)
            logger.warning("outcome not recorded", task_id=each.asked.task_id)
    _report_flows(done)


def _start(tasks: list[DueTask], execution: str, deadline_ms: int, what: str) -> None:
    """Start tasks this invocation made PENDING (the callback tasks its final marks made,
    the tasks it handed on), on the state machine that runs this batch (read from its
    execution's ARN: the template cannot give the executors the machine's, which names
    them), by `deadline_ms`; one not started goes to a check shard, for the reconciler to
    start (or, if even that write fails, to find where it was put: a callback past its
    placing, `tocsin.callbacks.callback_item`; a task handed on once its slot is past)."""
    config = settings().model_copy(update={"state_machine_arn": machine_of(execution)})
    until_ms = min(deadline_ms, clock.now_ms() + START_WITHIN_MS)
    deadline = time.monotonic() + max(until_ms - clock.now_ms(), 0) / 1000
    try:  # a start's retries could outlast the invocation: cut off, as a writer's start is
        started = cutoff.within(
            until_ms,
            lambda: dispatch_all(tasks, config, deadline),
            TimeoutError("no answer from StartExecution"),
        )
        look_again_now(started.left, config)
    except (BotoCoreError, ClientError, TimeoutError) as fault:
        logger.warning(f"{what} not started", fault=type(fault).__name__)


def _report(asked: BatchTask, outcome: Fired | Failed, counts: Counter[str]) -> None:
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


def _report_flows(done: list[tuple[Held, Recorded | BaseException]]) -> None:
    """Per flow key, the tasks its limits held past their due time and the longest hold,
    as metrics of their own (the key a dimension)."""
    held: dict[str, list[int]] = {}
    for each, recorded in done:
        task, outcome = each.task, recorded[0]  # type: ignore[index]
        if isinstance(task, ClaimedTask) and task.flow and isinstance(outcome, Fired):
            held.setdefault(task.flow.key, []).append(outcome.held_ms)
    for key, held_ms in held.items():  # one metric set a key: its dimension is the key's
        per_key = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
        per_key.add_dimension(name="FlowKey", value=key)
        held_count = sum(1 for ms in held_ms if ms > 0)
        per_key.add_metric(name="FlowHeld", unit=MetricUnit.Count, value=held_count)
        per_key.add_metric(name="FlowHeldMs", unit=MetricUnit.Milliseconds, value=max(held_ms))
        per_key.flush_metrics()


def executor_handler(task_type: TaskType) -> Callable[[dict[str, Any], LambdaContext], Any]:
    """The Lambda handler of one task type's executor; its SDK clients are made now, at init."""
    aws.resource("dynamodb")  # claims and marks on the Tasks table
    aws.client("dynamodb")  # a final mark with the callback task it makes
    aws.client("sqs")  # dead letters
    for service in TARGETS[task_type].aws_services:
        aws.target_client(service)

    @logger.inject_lambda_context(clear_state=True)
    @metrics.log_metrics
    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
        return execute(
            event, task_type, context.get_remaining_time_in_millis, context.aws_request_id
        )

    return handler
