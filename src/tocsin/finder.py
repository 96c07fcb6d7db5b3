"""The coarse poll: look at tasks not settled in time, turn schedules' occurrences due
within the look-ahead into tasks, then start what is due within the look-ahead.

The due index is sharded and holds every task at its due time (`tocsin.index_keys`); the
finder reads only what lies past its horizon (the due time up to which it has started
everything), so each entry is read once, and a run reads what is due, never the table.
"""

import heapq
import time
from collections.abc import Iterator

from tocsin import aws, clock
from tocsin.call_keys import with_call_keys
from tocsin.dispatch import DueTask, dispatch_all, due_task, look_again_now
from tocsin.index_keys import LOOK_AFTER_MS, writers_own
from tocsin.occurrences import finish_all_leftovers, made_tasks, materialize_due
from tocsin.reconcile import ReconcileReport, reconcile
from tocsin.settings import Settings
from tocsin.store import DUE_INDEX, TaskStore

HORIZON = "finder_ms"  # every task due up to it is started, or is its writer's to start
# Where a finder with no horizon yet (a new stack) starts reading: the reconciler looks at
# anything due earlier.
FIRST_LOOK_BACK_MS = LOOK_AFTER_MS


def find_due(settings: Settings, after_ms: int, until_ms: int) -> list[DueTask]:
    """Every shard's tasks due after `after_ms` up to `until_ms` that are the finder's to
    start (not their writers'), merged earliest first."""
    store = TaskStore(settings.tasks_table)

    def finders(shard: int) -> Iterator[DueTask]:
        for entry in store.in_shard(str(shard), until_ms, after_ms):
            if not writers_own(int(entry["gsi_due_ms"]), int(entry.get("placed_ms", 0)), settings):
                yield due_task(entry)

    return list(heapq.merge(*(finders(shard) for shard in range(settings.shards))))


# Of a run's budget, the most the reconciler may take: dispatch, which is what keeps tasks
# on time, gets the rest whatever a flood of stuck tasks asks.
RECONCILE_SHARE = 0.25
# Of a run's budget, the most the schedules' occurrences may take, for the same reason.
SCHEDULES_SHARE = 0.25


def settle_stuck(settings: Settings, budget_s: float) -> ReconcileReport:
    """The reconciler's step, within its share of the run (a fault that stops it, such as a
    refused read of a shard, ends its step, not the run)."""
    return reconcile(settings, clock.now_ms(), time.monotonic() + budget_s * RECONCILE_SHARE)


def at_the_tables_rate(settings: Settings) -> Settings:
    """`settings` with the write units the Tasks table and its due index are provisioned
    for now (a claim writes both; auto scaling moves them), so that the wake plan spreads a
    crowded second's claims within them. An on-demand table reports none: its plan keeps
    the rate of `Settings.claims_per_second`."""
    table = aws.client("dynamodb").describe_table(TableName=settings.tasks_table)["Table"]
    indexes = table.get("GlobalSecondaryIndexes", [])
    parts = [table, *(index for index in indexes if index["IndexName"] == DUE_INDEX)]
    # DynamoDB Local leaves out an on-demand table's throughput (AWS answers 0 units)
    units = [part.get("ProvisionedThroughput", {}).get("WriteCapacityUnits", 0) for part in parts]
    return settings.model_copy(update={"provisioned_writes_per_second": min(units)})


def whole_windows(until_ms: int, window_ms: int) -> int:
    """The end of the last batch window that reaches no further than `until_ms`. A run
    reads up to it, so each window's tasks are found by one run, together: a window the
    look-ahead cut would go to two executions, its first part's now and the rest's at the
    next run (`dense` made 70 executions for 60 seconds of tasks so)."""
    return (until_ms + 1) // window_ms * window_ms - 1


def run_finder(settings: Settings, budget_s: float) -> dict[str, int]:
    """One finder run: tasks not settled in time looked at, schedules' occurrences made
    tasks and started, then what is due by now + look-ahead past the horizon, started
    within `budget_s`; what each did.

    The look-ahead's reach is cut to whole batch windows (`whole_windows`); a crowded
    window's tasks are packed by where each goes (`tocsin.call_keys`). The horizon
    moves up to the first task not started (throttled, or the budget ran out), which the
    next run reads again; an occurrence not started goes to a check
    shard, since it is not the finder's to find (its maker was its writer)."""
    deadline = time.monotonic() + budget_s
    reconciled = settle_stuck(settings, budget_s)
    store = TaskStore(settings.tasks_table)
    now = clock.now_ms()
    schedules_deadline = time.monotonic() + budget_s * SCHEDULES_SHARE
    leftovers = finish_all_leftovers(settings, now, schedules_deadline)
    made_ids, scheduled = materialize_due(settings, now, schedules_deadline)
    made = made_tasks(made_ids, settings)
    until = whole_windows(now + settings.lookahead_s * 1000, settings.batch_window_ms)
    horizon = store.horizon(HORIZON)
    found = find_due(settings, now - FIRST_LOOK_BACK_MS if horizon is None else horizon, until)
    due = with_call_keys(sorted({*found, *made}), settings, deadline)
    report = dispatch_all(due, at_the_tables_rate(settings), deadline)
    look_again_now(tuple(set(report.left) & set(made)), settings)
    left = set(report.left) & set(found)
    store.advance_horizon(HORIZON, min((t.due_ms - 1 for t in left), default=until))
    return {**report.as_dict(), **reconciled.as_dict(), **scheduled, **leftovers}
