"""The coarse poll: settle tasks stuck in flight, turn schedules' occurrences due within the
look-ahead into tasks, then find PENDING tasks due within the look-ahead and dispatch them.

The due index is sparse (only PENDING tasks are in its due shards; tasks in flight, and
FAILED ones owing a dead letter, are in its check shards) and sharded, so a run reads
what is due, never the whole table; overdue tasks are found too, so none is stranded.
"""

import heapq
import time

from tocsin import clock
from tocsin.dispatch import DueTask, dispatch_all, due_task
from tocsin.occurrences import materialize_due
from tocsin.reconcile import ReconcileReport, reconcile
from tocsin.settings import Settings
from tocsin.store import TaskStore


def find_due(settings: Settings, until_ms: int) -> list[DueTask]:
    """Every shard's due tasks, merged earliest first."""
    store = TaskStore(settings.tasks_table)
    shards = [
        (due_task(item) for item in store.in_shard(str(shard), until_ms))
        for shard in range(settings.shards)
    ]
    return list(heapq.merge(*shards))


# Of a run's budget, the most the reconciler may take: dispatch, which is what keeps tasks
# on time, gets the rest whatever a flood of stuck tasks asks.
RECONCILE_SHARE = 0.25


def settle_stuck(settings: Settings, budget_s: float) -> ReconcileReport:
    """The reconciler's step, within its share of the run (a fault that stops it, such as a
    refused read of a check shard, ends its step, not the run)."""
    return reconcile(settings, clock.now_ms(), time.monotonic() + budget_s * RECONCILE_SHARE)


def run_finder(settings: Settings, budget_s: float) -> dict[str, int]:
    """One finder run: tasks stuck in flight settled (those requeued are due at once),
    schedules' occurrences made tasks, then what is due by now + look-ahead, dispatched
    within `budget_s`; what each did."""
    deadline = time.monotonic() + budget_s
    reconciled = settle_stuck(settings, budget_s)
    scheduled = materialize_due(settings, clock.now_ms())
    due = find_due(settings, clock.now_ms() + settings.lookahead_s * 1000)
    dispatched = dispatch_all(due, settings, deadline).as_dict()
    return {**dispatched, **reconciled.as_dict(), **scheduled}
