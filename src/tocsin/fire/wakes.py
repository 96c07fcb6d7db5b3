"""Wakes: the tasks waiting on a host's hold (`tocsin.holds`) due again, when the hold
ends (all of them, at the host's recovery rate) or when its prober gave up (one, to probe
next): each moved in the dispatch index to a slot of the hold's recovery flow
(`tocsin.flow.recovery_flow`), which it is sent through as any flow's task is, and those
due too soon for the finder started here."""

from concurrent.futures import ThreadPoolExecutor
from itertools import islice

from aws_lambda_powertools.metrics import MetricUnit

from tocsin import clock
from tocsin.dispatch import DueTask
from tocsin.fire.batch import BatchEvent
from tocsin.fire.claims import CLAIM_WORKERS
from tocsin.fire.plans import start_onward
from tocsin.flow import RateLedger, recovery_flow
from tocsin.holds import HostHold
from tocsin.index_keys import due_index_keys, writers_own
from tocsin.model import TaskType
from tocsin.observability import logger, metrics
from tocsin.settings import settings
from tocsin.store import TaskStore

WAKE_PAGE = 100  # tasks given their slots in one write to the ledger
WAKE_LEAD_MS = 1000  # the first woken is due this long after its wake: written and started


def wake_held(store: TaskStore, holds: set[HostHold], batch: BatchEvent, by_ms: int) -> None:
    """Wake what this invocation's holds owe: every waiting task of a hold it ended, one of
    a hold whose prober gave up here."""
    for hold in holds:
        if hold.began:
            metrics.add_metric(name="HostHeld", unit=MetricUnit.Count, value=1)
        if hold.released or hold.handed:
            woken = wake(store, hold, batch, by_ms, None if hold.released else 1)
            metrics.add_metric(name="WokenFromHold", unit=MetricUnit.Count, value=woken)
        if hold.released:
            metrics.add_metric(name="HostReleased", unit=MetricUnit.Count, value=1)


def wake(store: TaskStore, hold: HostHold, batch: BatchEvent, by_ms: int, limit: int | None) -> int:
    """Up to `limit` of the tasks waiting on `hold` (all, if None) due again, a page at a
    time, until `by_ms`: those not woken by then wake at their own time (their longest
    backoff). How many were woken."""
    config = settings()
    ledger, flow = RateLedger(store.table_name), recovery_flow(hold.id)
    ids = store.waiting_on(hold.id, limit)
    woken = 0
    while clock.now_ms() < by_ms and (page := list(islice(ids, WAKE_PAGE))):
        start_ms = clock.now_ms() + WAKE_LEAD_MS
        slots = ledger.plan(flow, [start_ms] * len(page))
        now_ms = clock.now_ms()

        def moved(task_id: str, slot_ms: int) -> DueTask | None:
            fields = {  # its slot its plan's: a send late past it takes the flow's next one
                "next_attempt_ms": slot_ms,
                "next_attempt_at": clock.to_iso(slot_ms),
                "planned_ms": slot_ms,
                "planned_at": clock.to_iso(slot_ms),
                "recovering": hold.id,
                "updated_at": clock.to_iso(now_ms),  # noqa: B023
                **due_index_keys(task_id, slot_ms, config, now_ms),  # noqa: B023
            }
            item = store.wake(task_id, hold.id, fields)
            if item is None:
                return None
            return DueTask(
                slot_ms,
                task_id,
                int(item["version"]),
                TaskType(item["task_type"]),
                int(item["requeues"]),
            )

        with ThreadPoolExecutor(max_workers=min(CLAIM_WORKERS, len(page))) as pool:
            due = [task for task in pool.map(moved, page, slots) if task is not None]
        woken += len(due)
        soon = [task for task in due if writers_own(task.due_ms, now_ms, config)]
        if soon:
            start_onward(soon, batch.execution, by_ms, "woken")
    logger.info("woken from a hold", host=hold.host, woken=woken)
    return woken
