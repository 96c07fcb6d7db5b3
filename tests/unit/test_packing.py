"""Due tasks are packed by type and window into batches, whose input stays small."""

import json
import re

from tocsin.dispatch import Batch, DueTask, execution_input, pack, staggers
from tocsin.model import TaskType
from tocsin.settings import BATCH_SIZE_LIMIT, Settings

SECOND = 1_800_000_000_000  # a window boundary


def task(offset_ms: int, name: str, task_type: TaskType = TaskType.WEBHOOK) -> DueTask:
    return DueTask(SECOND + offset_ms, name, 1, task_type)


def test_tasks_of_one_type_in_one_window_share_a_batch():
    tasks = [
        task(999, "late-in-window"),
        task(0, "first"),
        task(500, "queue", TaskType.SQS),
        task(1000, "next-window"),
    ]
    batches = pack(tasks, window_ms=1000, batch_size=500)
    assert [[t.task_id for t in b.tasks] for b in batches] == [
        ["first", "late-in-window"],
        ["queue"],
        ["next-window"],
    ]


def test_a_crowded_window_is_split_at_the_batch_size_earliest_first():
    tasks = [task(i, f"t{i:03d}") for i in range(250)]
    batches = pack(tasks, window_ms=1000, batch_size=100)
    assert [len(b.tasks) for b in batches] == [100, 100, 50]
    assert [t.task_id for b in batches for t in b.tasks] == [f"t{i:03d}" for i in range(250)]


def test_a_batch_name_is_the_same_for_the_same_members_and_differs_otherwise():
    members = (task(0, "a"), task(10, "b"))
    same = Batch(members)
    assert same.execution_name == Batch(members).execution_name
    assert same.execution_name.startswith(f"webhook-{SECOND}-")
    assert Batch((*members, task(20, "c"))).execution_name != same.execution_name
    bumped = DueTask(SECOND + 10, "b", 2, TaskType.WEBHOOK)  # a reschedule's next version
    assert Batch((members[0], bumped)).execution_name != same.execution_name
    assert Batch((members[0],)).execution_name == "a-v1"  # a lone task keeps its own name


def test_the_largest_batch_of_the_longest_ids_stays_far_inside_the_state_limit():
    tasks = [
        DueTask(SECOND + i, f"{i:04d}".ljust(64, "x"), 10**9, TaskType.EVENTBRIDGE)
        for i in range(BATCH_SIZE_LIMIT)
    ]
    [batch] = pack(tasks, window_ms=1000, batch_size=BATCH_SIZE_LIMIT)
    name = batch.execution_name
    assert len(name) <= 80 and name.replace("-", "").replace("_", "").isalnum()
    given = json.dumps(execution_input(batch, Settings()))
    assert len(given.encode()) < 128 * 1024  # Step Functions' state is 256 KB at most


def test_an_occurrence_is_named_in_the_characters_cloudwatch_logs_accepts():
    """A schedule's occurrence id holds a `.`; its execution name does not, and no id a
    caller may submit (no `.`) takes the same name."""
    occurrence = Batch((DueTask(1000, "tick.1795596423182", 1, TaskType.SQS),))
    lookalike = Batch((DueTask(1000, "tick_1795596423182", 1, TaskType.SQS),))
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", occurrence.execution_name)
    assert occurrence.execution_name != lookalike.execution_name
    longest = Batch((DueTask(1000, f"{'s' * 48}.{1795596423182}", 2, TaskType.SQS, 9),))
    assert len(longest.execution_name) <= 80


def test_a_table_warmed_below_a_new_tables_rate_plans_claims_at_that_rate():
    """A new on-demand table takes 4,000 writes a second: a smaller TableWarmWritesPerSecond
    (warm throughput cannot go below it) must not slow the plan down. Eight batches of 500
    claims due in one second all wake in their own second, as with no warming at all."""
    tasks = [task(i % 1000, f"t{i:04d}") for i in range(4000)]
    batches = pack(tasks, window_ms=1000, batch_size=500)
    now_ms = SECOND - 60_000
    for warm in (0, 1000):
        config = Settings(TABLE_WARM_WRITES_PER_SECOND=warm, LEAD_MS=2000)
        assert config.claims_per_second == 4000
        assert set(staggers(batches, config, now_ms).values()) == {0}
    warmed = Settings(TABLE_WARM_WRITES_PER_SECOND=8000, LEAD_MS=2000)
    assert warmed.claims_per_second == 8000


def test_a_webhook_batch_holds_no_more_connections_than_a_lambda_has_descriptors_for():
    """Each webhook task holds a connection (a file descriptor, of Lambda's 1,024) from
    before its gate to its answer: a webhook batch stops at 256; other types at the size."""
    webhooks = [task(i, f"w{i:03d}") for i in range(600)]
    queues = [task(i, f"q{i:03d}", TaskType.SQS) for i in range(600)]
    batches = pack(webhooks + queues, window_ms=1000, batch_size=500)
    sizes = {kind: [len(b.tasks) for b in batches if b.task_type is kind] for kind in TaskType}
    assert sizes[TaskType.WEBHOOK] == [256, 256, 88] and sizes[TaskType.SQS] == [500, 100]
