"""Claims: the exactly-once lock taken on every task of a batch at once, the claimed items
read, and the hold let go when the invocation fails before finishing them."""

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from tocsin import clock
from tocsin.callbacks import needed
from tocsin.errors import Busy
from tocsin.fire.batch import BatchEvent, BatchTask, ClaimedTask, Failed, Held
from tocsin.fire.writes import TableUnavailable, written
from tocsin.flow import flow_of
from tocsin.holds import hold_id, read_holds
from tocsin.model import TaskType
from tocsin.observability import logger
from tocsin.retry import policy_of
from tocsin.settings import settings
from tocsin.store import Claim, Holder, TaskStore
from tocsin.targets import parse_target

CLAIM_WORKERS = 32


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
        let_go(store, holder, [asked for asked, _ in won] + unanswered)
        raise failed
    try:  # the bodies kept apart, read at once (one BatchGetItem a hundred)
        items = store.whole([claim.before for _, claim in won])  # type: ignore[misc]
    except (BotoCoreError, ClientError, Busy) as fault:
        let_go(store, holder, [asked for asked, _ in won])
        raise TableUnavailable(f"bodies: {type(fault).__name__}") from fault
    held, owners = [], []
    for (asked, claim), item in zip(won, items, strict=True):
        task = _claimed(item, asked, batch.task_type)
        held.append(Held(asked, task, claim.taken_over or _requeued(item), needed(item)))
        owners.append(item.get("owner", ""))
        item.clear()  # its payload's text goes now: a batch's bodies are held once, as bytes
    return _with_holds(store, held, owners, batch.task_type), [
        asked.task_id for asked, claim in claims if claim.in_progress
    ]


def _with_holds(
    store: TaskStore, held: list[Held], owners: list[str], task_type: TaskType
) -> list[Held]:
    """Each claimed task with its owner's host's hold (`tocsin.holds`), all read at once:
    one read a host of the batch, none when the stack holds no host back."""
    if not settings().host_hold_failures:
        return held
    wanted: dict[str, tuple[str, str, str]] = {}
    keyed: list[str | None] = []
    for each, owner in zip(held, owners, strict=True):
        task = each.task
        if not isinstance(task, ClaimedTask):
            keyed.append(None)
            continue
        key = hold_id(owner, task.target.host_key)
        wanted[key] = (owner, task.target.host_key, task_type.value)
        keyed.append(key)
    holds = read_holds(store.table_name, wanted)
    return [
        each if key is None else replace(each, task=replace(each.task, hold=holds[key]))  # type: ignore[type-var]
        for each, key in zip(held, keyed, strict=True)
    ]


def _requeued(item: dict[str, Any]) -> bool:
    """Whether an execution of this version ended without settling it (the reconciler
    requeued it), which may have sent it: a retry RETRYING recorded its attempts."""
    return int(item.get("requeues", 0)) > int(item.get("retried", 0))


def _claimed(item: dict[str, Any], asked: BatchTask, task_type: TaskType) -> ClaimedTask | Failed:
    """The claimed item as a task to fire; a stored task that does not parse fails for good.
    One that was RETRYING goes on from the attempts its item records."""
    try:
        if item["task_type"] != task_type:
            raise ValueError(f"a {item['task_type']} task reached the {task_type} executor")
        retrying = "next_attempt_ms" in item  # RETRYING, or claimed since it was
        return ClaimedTask(
            task_id=asked.task_id,
            version=asked.version,
            due_ms=asked.due_ms,
            target=parse_target(task_type, json.loads(item["target"])),
            payload_json=item["payload"].encode(),
            policy=policy_of(item),
            first_due_ms=int(item["due_ms"]),
            requeues=int(item.get("requeues", 0)),
            attempts_before=int(item.get("attempts", 0)) if retrying else 0,
            throttled_before=int(item.get("throttled", 0)) if retrying else 0,
            tries_before=tuple(json.loads(item.get("tries", "[]"))) if retrying else (),
            flow=flow_of(item),
            planned_ms=int(item.get("planned_ms", 0)) if _own_plan(item) else 0,
            flow_held="planned_ms" in item,
        )
    except (ValidationError, KeyError, ValueError, TypeError, AttributeError) as error:
        return Failed("PermanentTargetError", f"malformed stored task: {error}", 0)


def _own_plan(item: dict[str, Any]) -> bool:
    """Whether the slot on a task is its flow's: a task woken from a hold has a slot of its
    host's recovery flow, which a flow of its own plans anew."""
    return not ("recovering" in item and "flow" in item)


def let_go(store: TaskStore, holder: Holder, tasks: list[BatchTask]) -> None:
    """End this invocation's hold on `tasks` (it is failing before finishing them), so that
    the retry takes them over at once rather than after the invocation's time. Once each,
    unchecked: a hold not let go ends with the invocation's time all the same."""
    for asked in tasks:
        try:
            store.let_go(asked.task_id, asked.version, holder.attempt)
        except (BotoCoreError, ClientError) as fault:
            logger.warning("hold not let go", task_id=asked.task_id, fault=type(fault).__name__)
