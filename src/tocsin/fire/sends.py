"""Sends: a batch's tasks in calls (a batched target's due together, ten to a call; any
other alone), each prepared, gated to its millisecond (or its flow's slot), sent, and
tried again after a backoff while its attempts and the invocation's time allow."""

import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import clock, gate
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.fire import wire
from tocsin.fire.batch import ClaimedTask, Failed, Held, Later
from tocsin.fire.writes import TableUnavailable
from tocsin.flow import SLOT_SLACK_MS, TICKET_AHEAD_MS, NoLeaseInTime, wide_slot
from tocsin.holds import HostHold, Park
from tocsin.model import BATCH_ENTRIES
from tocsin.observability import logger
from tocsin.retry import KEPT_TRIES, SHORT_PAUSE_S, ExhaustedBy
from tocsin.sent import Fired, Try
from tocsin.settings import settings
from tocsin.targets.base import BATCH_BYTES, Answer, BatchedTarget, entry_bytes


class HandOn(Exception):
    """A task of a flow cannot be sent in this invocation's time (its slot is past it, or
    no lease of its flow came free): it goes on, PENDING, to an execution that wakes at
    `planned_ms`."""

    def __init__(self, planned_ms: int):
        super().__init__(planned_ms)
        self.planned_ms = planned_ms


class NoTimeToSend(Exception):
    """A task of the batch was never tried and this invocation has no time left for one
    attempt (a failed init took its time, say): a fresh invocation tries it."""


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


def _deliver(
    tasks: list[ClaimedTask], lease_by_ms: int, attempts: int
) -> tuple["_Turn", list[Answer]]:
    """Build the call's request whole, then have the wire write it at its turn (its due
    millisecond, or its flow's slot and lease: `_Turn`; its first attempt here goes in its
    plan's slot), as the invocation's `attempts`-th: the turn as it went (when its request
    was written, in which slot, how long the flow held it), and each task's answer."""
    turn = _Turn(tasks[0], lease_by_ms, attempts == 1)
    try:
        answers = _targets_own(_call, turn, tasks, attempts, turn=turn)
    except (PermanentTargetError, TransientTargetError) as error:  # for the whole call
        turn.went_ms = clock.now_ms()
        return turn, [error] * len(tasks)
    return turn, answers


# A send that needs a lease of its flow looks for one this long before its gate (a read and
# a write of the key's lease items): a lease held through a long wait for a rate's slot
# would keep it from the key's other sends.
LEASE_AHEAD_MS = 100


class _Turn:
    """A call's turn (`wire.Turn`): its request is written at its due millisecond, or as its
    flow lets it go. The flow's needs are held for the send: a lease of its flow if it
    limits sends in flight, and a slot of its flow's rate. A first attempt goes in the
    slot its plan took for it (`plan_flows`: one write for the invocation's tasks of a
    flow), writing nothing more; a retry, or a send whose lease or gate comes later than
    SLOT_SLACK_MS past its slot, takes the flow's next free one (`RateLedger.ticket`: one
    write). A lease not had by `lease_by_ms`, or a slot past it, hands the task on
    (`HandOn`), for a send then could not end in this invocation's time. A request the
    wire would write late for its slot is not written: it takes one more, a moment ahead
    (the write done by then), and then a last one, wide (`wide_slot`: slots enough for
    twice as late as its gate last went, LAST_SLACK_MS at least), which it may go in up
    to that late. On a CPU so busy that gates miss their slots again and again, taking
    one slot for each miss would move the flow's slots ahead faster than its sends, and
    no send would go; a last try written however late went beside the sends in the
    slots after it (with every gate 400 ms late, 6 in a second at a rate of 5:
    test_flow). Late even for that, the task is handed on.

    It keeps the millisecond its request was written, the slot it went in, and how long
    its flow held it: from its due time (or its coming, if later: an invocation that comes
    late is not its flow's doing, but one its flow handed it on to is) to its slot or
    lease."""

    def __init__(self, task: ClaimedTask, lease_by_ms: int, planned: bool):
        self.task, self.lease_by_ms, self.planned = task, lease_by_ms, planned
        self.went_ms = self.slot_ms = self.held_ms = 0
        self.raised: BaseException | None = None  # what the turn raised, not the target

    @property
    def fires_ms(self) -> int:
        return self.task.fires_ms

    def at_gate(self) -> None:
        gate.wait_until(self.task.fires_ms)

    def send(self, sent: wire.Sent) -> wire.Sent:
        try:
            return self._send(sent)
        except BaseException as error:  # HandOn, or the embedded runtime's stop
            self.raised = error
            raise

    def _send(self, sent: wire.Sent) -> wire.Sent:
        task = self.task
        came_ms = task.due_ms if task.flow_held else max(task.due_ms, clock.now_ms())
        with _leased(task, task.fires_ms, self.lease_by_ms, self.planned) as free_ms:
            ready_ms = max(task.fires_ms, free_ms, came_ms)
            if task.ledger is None:
                return self._written(sent, ready_ms, None, ready_ms - came_ms)
            if self.planned and ready_ms <= task.fires_ms + SLOT_SLACK_MS:
                slot_ms = task.fires_ms  # its plan's, already its own
                done = self._written(sent, slot_ms, SLOT_SLACK_MS, max(0, slot_ms - came_ms))
                if not done.missed_ms:
                    return done
            gate.wait_until(ready_ms - TICKET_AHEAD_MS)
            ready_ms = max(ready_ms, clock.now_ms() + task.ledger.lead_ms())  # if already due
            slot_ms = _ticket(task, ready_ms, 1, self.lease_by_ms)
            done = self._written(sent, slot_ms, SLOT_SLACK_MS, max(0, slot_ms - came_ms))
            if not done.missed_ms:
                return done
            # Its CPU late for its slot again: its last try, well ahead, in slots enough for
            # twice as late, so that even then it goes beside no other send.
            count, slack_ms = wide_slot(task.flow.rate, done.missed_ms)  # type: ignore[union-attr, arg-type]
            slot_ms = _ticket(task, clock.now_ms() + TICKET_AHEAD_MS, count, self.lease_by_ms)
            done = self._written(sent, slot_ms, slack_ms, max(0, slot_ms - came_ms))
            if done.missed_ms:  # written now, it could bunch with the sends after it
                raise HandOn(clock.now_ms())
            return done

    def _written(
        self, sent: wire.Sent, at_ms: int, slack_ms: int | None, held_ms: int
    ) -> wire.Sent:
        done = wire.WIRE.send(replace(sent, fires_ms=at_ms, slack_ms=slack_ms))
        if done.stopped is not None:
            raise done.stopped
        self.went_ms, self.held_ms = done.written_ms or clock.now_ms(), held_ms
        self.slot_ms = at_ms
        return done


def _ticket(task: ClaimedTask, ready_ms: int, count: int, by_ms: int) -> int:
    """`count` slots in a row of the task's flow's sends (`RateLedger.ticket`): when the
    first starts. A slot past `by_ms` hands the task on (`HandOn`), for a send then could
    not end in this invocation's time. The ledger's fault (a throttle or a 5xx after
    botocore's retries) fails the invocation for Fire to retry it (TableUnavailable): its
    other calls go on, this task is let go for the retry."""
    try:
        slot_ms = task.ledger.ticket(task.flow, ready_ms, count)  # type: ignore[arg-type, union-attr]
    except (BotoCoreError, ClientError) as fault:
        failure = f"{task.task_id}: its flow's ledger: {type(fault).__name__}"
        raise TableUnavailable(failure) from fault
    if slot_ms > by_ms:
        raise HandOn(slot_ms)
    return slot_ms


@contextmanager
def _leased(task: ClaimedTask, slot_ms: int, by_ms: int, first: bool) -> Iterator[int]:
    """A lease of the task's flow held for its send in `slot_ms`, if it limits sends in
    flight: the millisecond one was free (0 when it needs none). A first attempt waits in
    line at its slot, however late the CPU woke its thread, so the flow's sends go in due
    order; a retry at its coming, behind the sends due by then."""
    if task.leases is None:
        yield 0
        return
    gate.wait_until(slot_ms - LEASE_AHEAD_MS)
    place_ms = slot_ms if first else clock.now_ms()
    try:
        with task.leases.sending(place_ms, by_ms) as free_ms:
            yield free_ms
    except NoLeaseInTime:
        raise HandOn(clock.now_ms()) from None


def _call(turn: _Turn, tasks: list[ClaimedTask], attempts: int) -> list[Answer]:
    """Send `tasks` in their turn, as this invocation's `attempts`-th: a batched target's
    tasks in one call, any other's alone."""
    target = tasks[0].target
    if not isinstance(target, BatchedTarget):
        [task] = tasks
        return [target.send(task.delivery(task.attempts_before + attempts), turn)]
    entries = [task.entry_for(task.attempts_before + attempts) for task in tasks]
    return type(target).send_entries(target.batch_key(), entries, turn)


Returned = TypeVar("Returned")


def _targets_own(call: Callable[..., Returned], *args: Any, turn: _Turn | None = None) -> Returned:
    """A target's call, whose unforeseen error (a host the resolver cannot encode, a bug)
    fails its tasks alone, for good: raised, it would fail the whole batch's invocation,
    and each retry would meet it again. What its turn raised is raised as it is."""
    try:
        return call(*args)
    except (PermanentTargetError, TransientTargetError):
        raise
    except Exception as error:  # logged by name and place: its message may hold the target
        if turn is not None and error is turn.raised:
            raise
        place = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{place.filename.rsplit('/', 1)[-1]}:{place.lineno}"
        logger.error("unforeseen target error", error=type(error).__name__, where=where)
        raise PermanentTargetError(f"unforeseen {type(error).__name__} in the target") from error


def fire(tasks: list[ClaimedTask], deadline_ms: int) -> list[Fired | Failed | Later]:
    """Prepare, gate and send tasks due in one millisecond that share a call (`sends`), or
    one task alone, and try a failed one again after its policy's backoff (`tocsin.retry`):
    in this invocation while the pause is short and an attempt can end before
    `deadline_ms` (one attempt may take the target's `attempt_limit_s`: an invocation
    killed mid-attempt may have acted unrecorded, and its retry would act again), else
    `Later`, RETRYING. Each task's outcome, in order."""
    due_ms, limit_ms = tasks[0].fires_ms, int(tasks[0].target.attempt_limit_s * 1000)
    hold = tasks[0].hold  # a call's tasks share their host
    outcomes: dict[int, Fired | Failed | Later] = {}
    tries: list[list[Try]] = [list(task.tries_before) for task in tasks]
    throttled = [task.throttled_before for task in tasks]
    pending, prepared, attempts = list(range(len(tasks))), set(), 0
    went: _Turn | None = None  # the last attempt's turn
    next_ms: dict[int, int] = {}  # a pending task's next attempt

    def made(i: int) -> int:
        return tasks[i].attempts_before + attempts

    def failed(i: int, cause: str, by: ExhaustedBy = ExhaustedBy.PERMANENT) -> None:
        outcomes[i] = Failed("PermanentTargetError", cause, made(i), _kept(tries[i]), by)

    def later(i: int, cause: str) -> None:
        at_ms = next_ms.get(i, clock.now_ms() + int(tasks[i].policy.min_backoff_s * 1000))
        outcomes[i] = Later(at_ms, cause, made(i), throttled[i], _kept(tries[i]))

    def park(i: int, parked: Park) -> None:
        """Wait on the host's hold, counting no attempt: woken when it ends, else at the
        task's longest backoff (its age permitting)."""
        policy, now_ms = tasks[i].policy, clock.now_ms()
        until_ms = min(
            now_ms + int(policy.max_backoff_s * 1000),
            tasks[i].first_due_ms + policy.max_age_s * 1000,
        )
        cause = f"waiting: its host has failed since {clock.to_iso(parked.since_ms)}"
        if until_ms <= now_ms:
            failed(i, f"out of age after {made(i)} attempts, {cause}", ExhaustedBy.AGE)
            return
        kept = _kept(tries[i])
        outcomes[i] = Later(until_ms, cause, made(i), throttled[i], kept, parked.hold)

    while pending:
        if max(clock.now_ms(), due_ms) + limit_ms > deadline_ms:  # it begins at the gate
            if not attempts:  # never tried: a fresh invocation will have the time
                raise NoTimeToSend(", ".join(task.task_id for task in tasks))
            for i in pending:
                later(i, f"out of time after {made(i)} attempts")
            break
        if hold is not None and attempts:  # since the claim read it, it may have begun
            hold.refresh()
        if hold is not None and (
            parked := hold.verdict(tasks[0].task_id, due_ms + limit_ms, clock.now_ms())
        ):
            for i in pending:
                park(i, parked)
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
                went, sent = _deliver([tasks[i] for i in ready], lease_by_ms, attempts)
            except HandOn:  # a flow's task, alone in its call
                if attempts == 1:  # never sent here: it goes on with its attempts ahead
                    raise
                attempts -= 1  # a retry its flow could not let go in time: later, its
                for i in pending:  # tries kept
                    later(i, f"out of time after {made(i)} attempts: its flow had no turn")
                break
            answers.update(zip(ready, sent, strict=True))
        pending, gave_up = [], []
        for i, answer in sorted(answers.items()):
            if isinstance(answer, dict) and went is not None:
                outcomes[i] = Fired(
                    went.went_ms, answer, made(i), _kept(tries[i]), went.held_ms, went.slot_ms
                )
                continue
            tries[i].append(_failed_try(began_ms, answer))
            if isinstance(answer, PermanentTargetError):
                failed(i, str(answer))
                continue
            throttled[i] += getattr(answer, "throttled", False)
            why = _next_attempt(tasks[i], made(i) - throttled[i], answer)
            if isinstance(why, ExhaustedBy):
                done = "gave up" if why is ExhaustedBy.ATTEMPTS else "out of age"
                failed(i, f"{done} after {made(i)} attempts: {answer}", why)
                gave_up.append(i)
                continue
            next_ms[i] = why
            pending.append(i)
        if hold is not None and answers:
            _tell(hold, tasks[min(answers)].task_id, answers, next_ms)
            for i in gave_up:  # after its failure is told, which renews a prober's probe:
                hold.hand_probe_on(tasks[i].task_id)  # if it was the prober, another probes
        if pending:
            at_ms = max(next_ms[i] for i in pending)  # a call's tasks go again together
            pause_ms = at_ms - clock.now_ms()
            if pause_ms > SHORT_PAUSE_S * 1000 or at_ms + limit_ms > deadline_ms:
                for i in pending:
                    later(i, tries[i][-1]["error"])
                break
            time.sleep(max(pause_ms, 0) / 1000)
    return [outcomes[i] for i in range(len(tasks))]


def _tell(
    hold: HostHold, task_id: str, answers: dict[int, Answer], next_ms: dict[int, int]
) -> None:
    """Tell the host's hold how a call went: answered (any answer not a failure for now), or
    failed, to be tried again at the earliest of its tasks' next attempts."""
    now_ms = clock.now_ms()
    failures = [answer for answer in answers.values() if isinstance(answer, TransientTargetError)]
    if len(failures) < len(answers):
        hold.answered(now_ms)
        return
    again_ms = min(next_ms.values(), default=now_ms)
    hold.failed(task_id, str(failures[0]), again_ms, now_ms, settings().host_hold_failures)


def _next_attempt(task: ClaimedTask, counted: int, error: Exception) -> int | ExhaustedBy:
    """When a task that failed for now is tried next (its policy's backoff, or when the
    target asked: Retry-After), or the limit that ends it: its attempts (`counted`, a
    throttling answer's not among them), or its age at that attempt."""
    policy = task.policy
    if counted >= policy.max_attempts:
        return ExhaustedBy.ATTEMPTS
    after_s = getattr(error, "after_s", None)
    pause_s = after_s if after_s is not None else policy.backoff_s(max(counted, 1))
    at_ms = clock.now_ms() + int(pause_s * 1000)
    if at_ms > task.first_due_ms + policy.max_age_s * 1000:
        return ExhaustedBy.AGE
    return at_ms


def _kept(tries: list[Try] | tuple[Try, ...]) -> tuple[Try, ...]:
    """The failed attempts a task's item keeps: the latest KEPT_TRIES."""
    return tuple(tries[-KEPT_TRIES:])


# A failed attempt's error as its history keeps it: enough to tell why, and a task's item
# stays small whatever a target answers (KEPT_TRIES of them).
TRY_ERROR_CHARS = 300


def _failed_try(began_ms: int, error: Exception) -> Try:
    return {"at": clock.to_iso(began_ms), "error": str(error)[:TRY_ERROR_CHARS]}
