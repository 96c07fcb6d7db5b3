"""Plans: a flow's slots taken for its claimed tasks, each written on its task, and the tasks
this invocation cannot send in its time handed on to executions that wake for their slots
(as are the callback tasks its final marks make: `start_onward`)."""

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import clock, cutoff
from tocsin.dispatch import START_WITHIN_MS, DueTask, dispatch_all, look_again_now, machine_of
from tocsin.fire.batch import BatchEvent, BatchTask, ClaimedTask, Held
from tocsin.fire.claims import CLAIM_WORKERS, let_go
from tocsin.fire.writes import TableUnavailable, written
from tocsin.flow import Flow, Leases, RateLedger
from tocsin.index_keys import LOOK_AFTER_MS, check_keys
from tocsin.observability import logger
from tocsin.settings import settings
from tocsin.store import Holder, TaskStore

# How long after its plan an invocation's first send of a flow can go: its slots written on
# its tasks, its threads started, a lease read and taken. A slot planned in the past (an
# invocation that came late) is missed, and its send takes another after all those planned.
PLAN_LEAD_MS = 250


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
    from_ms = clock.now_ms() + PLAN_LEAD_MS  # the first slot a send here can go in
    try:
        for flow, members in unplanned.items():
            members.sort(key=lambda i: held[i].asked.due_ms)
            dues = [held[i].asked.due_ms for i in members]
            ready = [max(due, from_ms) for due in dues]
            slots = written(flow.key, deadline_ms, lambda: ledger.plan(flow, ready))  # noqa: B023
            later |= {i: s for i, s, due in zip(members, slots, dues, strict=True) if s > due}
        handed_on = _write_slots(store, held, holder, later, deadline_ms)
    except TableUnavailable:
        let_go(store, holder, [each.asked for each in held])
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
        return given_back(store, holder, asked, slot, deadline_ms)

    if not later:
        return set()
    with ThreadPoolExecutor(max_workers=min(CLAIM_WORKERS, len(later))) as pool:
        handed = dict(zip(later, pool.map(write, later), strict=True))
    return {i for i, on in handed.items() if on}


def given_back(
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


def give_back_leases(held: list[Held]) -> None:
    """Give back every lease the invocation kept for its flows' sends: it sends no more."""
    for leases in {each.task.leases for each in held if isinstance(each.task, ClaimedTask)}:
        if leases is not None:
            leases.close()


def hand_on(held: list[Held], batch: BatchEvent, deadline_ms: int) -> None:
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
    start_onward(tasks, batch.execution, deadline_ms, "handed on")


def start_onward(tasks: list[DueTask], execution: str, deadline_ms: int, what: str) -> None:
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
