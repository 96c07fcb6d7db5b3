"""A schedule's occurrences turned into tasks, one at a time, as their time comes near.

The finder (and the API, for a schedule it has just created, edited or resumed) turns every
occurrence due within the look-ahead into a task with a deterministic id,
`<schedule id>.<due ms>` (a `.` no submitted task id may hold), each in one transaction with
the schedule's advance (tocsin.schedule_store). Occurrences further in the past than a
second when reached were missed (nothing ran): `catch_up` skips them, or fires the latest
at once. After an edit, a pause or a delete, the unclaimed tasks an older revision made
are cancelled; the occurrences the new revision shares with them are rewritten in place.
"""

import math
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tocsin import clock
from tocsin.bodies import naming
from tocsin.dispatch import DueTask, due_task, stop_own_execution
from tocsin.model import TaskStatus, TaskType, task_item
from tocsin.observability import logger
from tocsin.recurrence import Occurrences, parse
from tocsin.retry import policy_of
from tocsin.schedule_store import LEFTOVERS_SHARD, ScheduleState, ScheduleStore, Turned
from tocsin.settings import Settings
from tocsin.store import TaskStore

MISSED_AFTER_MS = 1000  # an occurrence this far in the past when reached was missed
MAX_MISSED_COUNTED = 100_000  # occurrences counted in one catch-up (a day of rate(1 second))
MAX_STEPS = 10_000  # occurrences and rereads in one schedule's turn: a bound, never met
# A schedule whose writes are refused this many times in a row (a transaction cancelled
# for throttling or a conflict, again and again) waits for the next run, after pauses of
# REREAD_PAUSE_S doubling, with jitter: once another finder has moved it, a reread goes on.
REFUSED_IN_A_ROW = 3
REREAD_PAUSE_S = 0.05


class ScheduleRefused(Exception):
    """The schedule's writes were refused REFUSED_IN_A_ROW times: the next run tries again.
    `written` holds the tasks made before, which stand."""

    def __init__(self, refused: int, written: list[str]) -> None:
        super().__init__(f"{refused} writes in a row refused")
        self.written = written


def occurrence_id(schedule_id: str, due_ms: int) -> str:
    return f"{schedule_id}.{due_ms}"


def occurrences_of(schedule: dict[str, Any]) -> Occurrences:
    """The stored schedule's rule within its start and end."""
    rule = parse(schedule["expression"], schedule["timezone"], int(schedule["anchor_ms"]))
    start, end = schedule.get("start_ms"), schedule.get("end_ms")
    return Occurrences(
        rule, None if start is None else int(start), None if end is None else int(end)
    )


def occurrence_task(
    schedule: dict[str, Any], due_ms: int, now_ms: int, config: Settings
) -> dict[str, Any]:
    task_id = occurrence_id(schedule["schedule_id"], due_ms)
    content = schedule.get("target", ""), schedule.get("payload", "")
    task_type, policy = TaskType(schedule["task_type"]), policy_of(schedule)
    item = task_item(task_id, due_ms, task_type, content, policy, schedule["owner"], now_ms, config)
    if "body" in schedule:  # kept apart: the occurrence names it too (tocsin.bodies)
        item = naming(item, schedule["body"])
    for name in ("callbacks", "flow", "tags"):  # each occurrence's own (callbacks, flow, tags)
        if name in schedule:
            item[name] = schedule[name]
    return {
        **item,
        "schedule_id": schedule["schedule_id"],
        "schedule_revision": schedule["revision"],
    }


def materialize(
    store: ScheduleStore,
    schedule: dict[str, Any] | None,
    config: Settings,
    now_ms: int,
    until_ms: int,
    deadline: float = math.inf,
) -> list[str]:
    """Turn the schedule's occurrences due by `until_ms` into tasks, until `deadline` (a
    time.monotonic() value; the next run goes on from where it stopped); the ids written."""
    written: list[str] = []
    refused = 0
    for _ in range(MAX_STEPS):
        if schedule is None or schedule["state"] != ScheduleState.ENABLED:
            break
        if time.monotonic() > deadline:
            break
        due = int(schedule["next_ms"])
        if due > until_ms:
            break
        occurrences = occurrences_of(schedule)
        if due < now_ms - MISSED_AFTER_MS:
            turned, task_id, next_ms = _catch_up(store, schedule, occurrences, now_ms, config)
        else:
            task = occurrence_task(schedule, due, now_ms, config)
            next_ms = occurrences.first_from(due + 1)
            turned, task_id = store.turn_into_task(schedule, task, next_ms, 0), task["task_id"]
        if turned is Turned.CHANGED:
            refused += 1
            if refused >= REFUSED_IN_A_ROW:
                raise ScheduleRefused(refused, written)
            time.sleep(random.uniform(0, REREAD_PAUSE_S * 2**refused))
            schedule = store.get(schedule["schedule_id"])
            continue
        refused = 0
        if turned is Turned.TASK:
            written.append(task_id)
        schedule = _advanced(schedule, next_ms)
    return written


def _advanced(schedule: dict[str, Any], next_ms: int | None) -> dict[str, Any]:
    """The schedule as the advance left it (what a read would give, without the read)."""
    if next_ms is None:
        return {**schedule, "state": ScheduleState.COMPLETED.value}
    return {**schedule, "next_ms": next_ms}


def _catch_up(
    store: ScheduleStore,
    schedule: dict[str, Any],
    occurrences: Occurrences,
    now_ms: int,
    config: Settings,
) -> tuple[Turned, str, int | None]:
    """Past the occurrences missed while nothing ran: skipped, or the latest made a task
    (due at its own time, so it fires at once and shows how late it is)."""
    cutoff, missed, last = now_ms - MISSED_AFTER_MS, 0, int(schedule["next_ms"])
    for moment in _until(occurrences, last, cutoff):  # counted, not kept: up to a day's
        missed, last = missed + 1, moment
    resume = occurrences.first_from(cutoff)
    logger.info("missed", schedule_id=schedule["schedule_id"], occurrences=missed)
    if schedule.get("catch_up") != "latest":
        turned = Turned.TAKEN if store.advance(schedule, resume, missed) else Turned.CHANGED
        return turned, "", resume
    latest = _latest_before(occurrences, last, cutoff)
    task = occurrence_task(schedule, latest, now_ms, config)
    turned = store.turn_into_task(schedule, task, resume, missed - 1)
    return turned, task["task_id"], resume


def _until(occurrences: Occurrences, first: int, cutoff: int) -> Iterator[int]:
    """Occurrences from `first` (one) to before `cutoff`, at most MAX_MISSED_COUNTED."""
    moment: int | None = first
    for _ in range(MAX_MISSED_COUNTED):
        if moment is None or moment >= cutoff:
            return
        yield moment
        moment = occurrences.first_from(moment + 1)


def _latest_before(occurrences: Occurrences, known: int, cutoff: int) -> int:
    """The last occurrence before `cutoff`, from one known before it (a bisection, for a
    catch-up longer than the occurrences counted)."""
    low, high = known, cutoff
    while high - low > 1:
        middle = (low + high) // 2
        found = occurrences.first_from(middle)
        if found is not None and found < cutoff:
            low = found
        else:
            high = middle
    return low


DELETED = "deleted"  # the suffix of a deleted schedule's leftovers record: `<id>@deleted`
CANCEL_WORKERS = 16  # cancels side by side: a per-second schedule leaves hundreds


def leftovers_key(schedule_id: str, suffix: str) -> str:
    """A leftovers record's key: `<id>@<revision>`, or `<id>@deleted` (no schedule id holds
    an `@`, so none is ever a schedule's; the finder's role may delete only these)."""
    return f"{schedule_id}@{suffix}"


def leftovers_record(
    before: dict[str, Any], revision: int, suffix: str, config: Settings, now_ms: int
) -> dict[str, Any]:
    """The record of the occurrences `before` made that its change to `revision` (an edit,
    or a delete) may not have: `before` under a key of its own, out of its owner's listing,
    in the DueIndex's leftovers shard from now, with how far its occurrences may reach."""
    kept = {k: v for k, v in before.items() if k not in ("owner", "gsi_pk", "gsi_next_ms")}
    reach = max(int(before.get("next_ms", 0)), now_ms + config.lookahead_s * 1000)
    return kept | {
        "schedule_id": leftovers_key(before["schedule_id"], suffix),
        "leftovers_of": before["schedule_id"],
        "leftovers_owner": before["owner"],
        "leftovers_revision": revision,
        "leftovers_until_ms": reach,
        "gsi_pk": LEFTOVERS_SHARD,
        "gsi_next_ms": now_ms,
    }


def as_it_was(record: dict[str, Any]) -> dict[str, Any]:
    """The schedule a leftovers record keeps, as it was stored."""
    kept = {k: v for k, v in record.items() if not k.startswith("leftovers_")}
    return kept | {"schedule_id": record["leftovers_of"], "owner": record["leftovers_owner"]}


def finish_leftovers(
    store: ScheduleStore, record: dict[str, Any], config: Settings, deadline: float
) -> bool:
    """Cancel the unclaimed tasks a changed schedule made that its new revision does not
    own, soonest first and side by side, until `deadline`; once every one is reached, the
    record goes. Whether it went."""
    before, revision = as_it_was(record), int(record["leftovers_revision"])
    now, until = clock.now_ms(), int(record["leftovers_until_ms"])
    occurrences = occurrences_of(before)
    due = list(_until(occurrences, occurrences.first_from(now) or until, until))
    now_iso, expires_at = clock.to_iso(now), config.expires_at(now)

    def cancel(moment: int) -> bool:
        if time.monotonic() >= deadline:
            return False
        task_id = occurrence_id(before["schedule_id"], moment)
        task = store.cancel_occurrence(task_id, revision, now_iso, expires_at)
        if task is not None:
            stop_own_execution(task, "its schedule changed", config)
        return True

    with ThreadPoolExecutor(max_workers=CANCEL_WORKERS, thread_name_prefix="cancel") as pool:
        reached = all(list(pool.map(cancel, due)))
    if reached:
        store.forget_leftovers(record["schedule_id"])
    return reached


def finish_all_leftovers(config: Settings, now_ms: int, deadline: float) -> dict[str, int]:
    """The finder's step: what edits and deletes left to cancel (their requests ran out of
    time, or were killed), until `deadline`; each record left is taken up by the next run."""
    store = ScheduleStore(config.schedules_table, config.tasks_table)
    finished = 0
    for key in list(store.due(LEFTOVERS_SHARD, now_ms)):
        record = store.get(key)
        if record is not None and time.monotonic() < deadline:
            finished += finish_leftovers(store, record, config, deadline)
    return {"leftovers_finished": finished}


def made_tasks(task_ids: list[str], config: Settings) -> list[DueTask]:
    """Occurrences just made into tasks, as the dispatcher sees them: read back, since one
    that replaced an older revision's task is its next version. Their maker starts them
    (they are due within the look-ahead of their placing: `index_keys.writers_own`)."""
    store = TaskStore(config.tasks_table)
    items = [store.get(task_id) for task_id in task_ids]
    return [
        due_task(item)
        for item in items
        if item is not None and item["status"] == TaskStatus.PENDING.value
    ]


def materialize_due(
    config: Settings, now_ms: int, deadline: float = math.inf
) -> tuple[list[str], dict[str, int]]:
    """The finder's step: every ENABLED schedule with an occurrence within the look-ahead
    turns it into tasks (each schedule on its own thread), until `deadline`; the tasks'
    ids, and what was done.

    A schedule that fails (its writes refused after botocore's retries, or refused again
    and again) is logged and counted, and taken up again by the next run, as is what the
    deadline leaves: it holds back neither the other schedules nor the finder's tasks."""
    store = ScheduleStore(config.schedules_table, config.tasks_table)
    until = now_ms + config.lookahead_s * 1000
    ids = [sid for shard in range(config.shards) for sid in store.due(str(shard), until)]

    def one(schedule_id: str) -> tuple[list[str], bool]:
        """The tasks written, and whether the schedule was turned as far as it could be."""
        try:
            return materialize(store, store.get(schedule_id), config, now_ms, until, deadline), True
        except ScheduleRefused as refused:  # another finder's, or throttling: the next run
            logger.warning("schedule not turned", schedule_id=schedule_id, reason=str(refused))
            return refused.written, False
        except Exception:
            logger.exception("schedule not turned", schedule_id=schedule_id)
            return [], False

    with ThreadPoolExecutor(max_workers=config.dispatch_workers) as pool:
        made = list(pool.map(one, ids))
    written = [task_id for task_ids, _ in made for task_id in task_ids]
    return written, {
        "schedules_due": len(ids),
        "occurrences_made": len(written),
        "schedule_errors": sum(not turned for _, turned in made),
    }
