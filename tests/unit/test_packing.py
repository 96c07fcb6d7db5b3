"""Due tasks are packed by type and window into batches, whose input stays small."""

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from tocsin.dispatch import (
    BURST_SPAN_MS,
    Batch,
    DueTask,
    burst_tasks,
    calls,
    crowded,
    densest,
    execution_input,
    pack,
    staggers,
)
from tocsin.model import BATCHED_TYPES, TaskType
from tocsin.settings import BATCH_SIZE_LIMIT, Settings

SECOND = 1_800_000_000_000  # a window boundary
ANY_BURST = BATCH_SIZE_LIMIT  # no batch is split for its tasks due together


def task(
    offset_ms: int, name: str, task_type: TaskType = TaskType.WEBHOOK, key: str = ""
) -> DueTask:
    return DueTask(SECOND + offset_ms, name, 1, task_type, batch_key=key)


def test_tasks_of_one_type_in_one_window_share_a_batch():
    tasks = [
        task(999, "late-in-window"),
        task(0, "first"),
        task(500, "queue", TaskType.SQS),
        task(1000, "next-window"),
    ]
    batches = pack(tasks, window_ms=1000, batch_size=500, burst_sends=ANY_BURST)
    assert [[t.task_id for t in b.tasks] for b in batches] == [
        ["first", "late-in-window"],
        ["queue"],
        ["next-window"],
    ]


def test_a_crowded_window_is_dealt_evenly_to_as_few_batches_as_its_size_allows():
    tasks = [task(i, f"t{i:03d}") for i in range(250)]
    batches = pack(tasks, window_ms=1000, batch_size=100, burst_sends=ANY_BURST)
    assert [len(b.tasks) for b in batches] == [84, 83, 83]
    assert [t.task_id for t in batches[0].tasks[:3]] == ["t000", "t003", "t006"]
    assert sorted(t for b in batches for t in b.tasks) == sorted(tasks)


def test_tasks_due_together_are_split_so_that_no_executor_sends_more_than_its_burst():
    """500 tasks due in one millisecond: a 256 MB executor sends 60 webhooks in 50 ms with
    half its CPU to spare, so they go to 9 batches that send side by side; SQS tasks go ten
    to a call, and a call costs two sends: 300 a batch at most; a lone task stays whole."""
    webhooks = [task(0, f"w{i:03d}") for i in range(500)]
    queues = [task(0, f"q{i:03d}", TaskType.SQS) for i in range(500)]
    batches = pack(webhooks + queues + [task(5000, "lone")], 1000, 500, burst_sends=60)
    sizes = {kind: [len(b.tasks) for b in batches if b.task_type is kind] for kind in TaskType}
    assert sizes[TaskType.WEBHOOK] == [56] * 5 + [55] * 4 + [1]
    assert sizes[TaskType.SQS] == [250, 250]


def test_a_batch_call_counts_two_sends_and_a_batch_holds_whole_calls():
    """After the gate a ten-entry call costs about two webhook sends: a burst of N sends
    holds N webhook tasks, or N / 2 calls (one at least) of batched tasks."""
    assert [burst_tasks(TaskType.WEBHOOK, n) for n in (1, 15, 60)] == [1, 15, 60]
    for kind in BATCHED_TYPES:
        assert [burst_tasks(kind, n) for n in (1, 2, 15, 60)] == [10, 10, 80, 300]


def test_tasks_at_many_queues_count_the_calls_they_will_make():
    """40 SQS tasks due in one millisecond at 40 queues are 40 calls, 80 sends: two batches
    within a burst of 60. At one queue they are four calls, one batch; keys not read count
    as one queue's, as before (review F5)."""
    many = [task(0, f"q{i:02d}", TaskType.SQS, f"queue-{i}") for i in range(40)]
    assert [len(b.tasks) for b in pack(many, 1000, 500, burst_sends=60)] == [20, 20]
    one = [task(0, f"q{i:02d}", TaskType.SQS, "queue") for i in range(40)]
    assert [len(b.tasks) for b in pack(one, 1000, 500, burst_sends=60)] == [40]
    unread = [task(0, f"q{i:02d}", TaskType.SQS) for i in range(40)]
    assert [len(b.tasks) for b in pack(unread, 1000, 500, burst_sends=60)] == [40]


def test_a_call_holds_ten_tasks_due_in_one_millisecond_at_one_key():
    tasks = [task(0, f"a{i:02d}", TaskType.SNS, "a") for i in range(12)]
    tasks += [task(0, "b", TaskType.SNS, "b"), task(1, "a-later", TaskType.SNS, "a")]
    assert [len(call) for call in calls(TaskType.SNS, tasks, 500)] == [10, 2, 1, 1]
    assert [len(call) for call in calls(TaskType.SNS, tasks, 4)] == [4, 4, 4, 1, 1]
    assert [len(call) for call in calls(TaskType.WEBHOOK, tasks[:3], 500)] == [1, 1, 1]


def test_calls_of_unequal_sizes_get_another_batch_rather_than_crowd_one():
    """Ten tasks at one queue and three alone, in batches of ten, one call per 100 ms: two
    batches would hold them, but the second would take both calls due at 200 ms. A third
    batch keeps each within its size and its burst."""
    tasks = [task(0, f"a{i}", TaskType.SQS, "a") for i in range(10)]
    tasks += [task(0, "b", TaskType.SQS, "b"), task(200, "c", TaskType.SQS, "c")]
    tasks += [task(200, "d", TaskType.SQS, "d")]
    batches = pack(tasks, 1000, batch_size=10, burst_sends=2)
    assert sorted(len(b.tasks) for b in batches) == [1, 2, 10]
    for batch in batches:
        assert densest(calls(TaskType.SQS, list(batch.tasks), 10)) == 1
    # Six tasks in batches of three: a call of two and four of one, dealt by their tasks
    due = [(0, "c"), (0, "a"), (0, "b"), (0, "b"), (200, "a"), (200, "c")]
    tasks = [task(at, f"t{i}", TaskType.SQS, key) for i, (at, key) in enumerate(due)]
    assert [len(b.tasks) for b in pack(tasks, 1000, batch_size=3, burst_sends=60)] == [3, 3]


def test_a_batch_goes_in_the_order_its_tasks_fire_its_flows_slots_included():
    """A task its flow holds to a later slot fires after one due later than it: the batch's
    first gate, which its wake is planned from, is the earliest to fire."""
    held = DueTask(SECOND + 10, "held", 1, TaskType.WEBHOOK, planned_ms=SECOND + 500)
    [batch] = pack([held, task(100, "next")], 1000, 500, burst_sends=ANY_BURST)
    assert [t.task_id for t in batch.tasks] == ["next", "held"]
    assert batch.first_due_ms == SECOND + 100


def test_only_a_batched_window_more_crowded_than_calls_of_one_fit_asks_for_its_keys():
    """A burst of 60 sends holds 30 calls: a window with at most 30 tasks of a batched type
    due within 100 ms fits one batch however its calls fall, so its targets are not read."""
    fits = [task(i, f"s{i:02d}", TaskType.SQS) for i in range(30)]
    assert crowded(fits, 1000, burst_sends=60) == []
    more = [*fits, task(99, "s30", TaskType.SQS), task(3000, "apart", TaskType.SQS)]
    assert crowded(more, 1000, burst_sends=60) == sorted(more)[:31]
    webhooks = [task(0, f"w{i:02d}") for i in range(100)]
    assert crowded(webhooks, 1000, burst_sends=60) == []
    pair = [task(0, "x", TaskType.SNS), task(1, "y", TaskType.SNS)]  # a burst of 2: one call
    assert crowded(pair, 1000, burst_sends=2) == pair


@given(
    offsets=st.lists(  # at random milliseconds, or many in a few: calls of unequal sizes
        st.tuples(st.integers(0, 2999) | st.sampled_from([0, 200, 400, 600]), st.integers(0, 5)),
        min_size=1,
        max_size=600,
    ),
    batch_size=st.integers(1, 12) | st.integers(1, 500),
    burst_sends=st.integers(1, 40),
    batched=st.booleans(),
)
def test_every_task_is_packed_once_within_the_size_and_the_burst(
    offsets, batch_size, burst_sends, batched
):
    kind = TaskType.SQS if batched else TaskType.WEBHOOK
    tasks = [task(at, f"t{i:03d}", kind, f"key-{key}") for i, (at, key) in enumerate(offsets)]
    batches = pack(tasks, window_ms=1000, batch_size=batch_size, burst_sends=burst_sends)
    assert sorted(t for b in batches for t in b.tasks) == sorted(tasks)
    weight = 2 if batched else 1
    for batch in batches:
        sent = densest(calls(kind, list(batch.tasks), batch_size)) * weight
        assert len(batch.tasks) <= batch_size and sent <= max(weight, burst_sends + 1)
        assert len({t.due_ms // 1000 for t in batch.tasks}) == 1  # one window
        assert list(batch.tasks) == sorted(batch.tasks)


def test_the_densest_span_counts_calls_due_within_100_ms():
    tasks = [[task(offset, f"t{offset}")] for offset in (0, 50, 99, 100, 150, 400)]
    assert densest(tasks) == 3 and BURST_SPAN_MS == 100  # 0..99 and 50..149 hold three


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
    [batch] = pack(tasks, 1000, BATCH_SIZE_LIMIT, burst_sends=ANY_BURST)
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


def test_a_longest_id_handed_on_or_requeued_keeps_to_a_name_step_functions_takes():
    """A 64-character id handed on for its flow's slot (`-v1h<ms>`), or requeued, would make
    a name over 80 characters, which StartExecution refuses (ValidationException): it is
    cut, and a digest keeps apart ids alike but for their ends."""
    longest = "i" * 63
    names = {
        DueTask(SECOND, longest + end, 1, TaskType.WEBHOOK, requeues, planned).member
        for end in "ab"
        for requeues, planned in ((0, SECOND + 5000), (3, 0), (3, SECOND + 5000))
    }
    assert len(names) == 6
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,80}", name) for name in names)
    short = DueTask(SECOND, "order-7", 1, TaskType.WEBHOOK, 0, SECOND + 5000)
    assert short.member == f"order-7-v1h{SECOND + 5000}"  # an id that fits keeps its name


def test_a_table_warmed_below_a_new_tables_rate_plans_claims_at_that_rate():
    """A new on-demand table takes 4,000 writes a second: a smaller TableWarmWritesPerSecond
    (warm throughput cannot go below it) must not slow the plan down. Eight batches of 500
    claims due in one second all wake in their own second, as with no warming at all."""
    tasks = [task(i % 1000, f"t{i:04d}") for i in range(4000)]
    batches = pack(tasks, window_ms=1000, batch_size=500, burst_sends=ANY_BURST)
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
    batches = pack(webhooks + queues, window_ms=1000, batch_size=500, burst_sends=ANY_BURST)
    sizes = {kind: [len(b.tasks) for b in batches if b.task_type is kind] for kind in TaskType}
    assert sizes[TaskType.WEBHOOK] == [200] * 3 and sizes[TaskType.SQS] == [300] * 2


def test_the_batched_types_are_those_whose_targets_send_ten_to_a_call():
    from tocsin.targets import TARGETS
    from tocsin.targets.base import BatchedTarget

    assert {kind for kind, target in TARGETS.items() if issubclass(target, BatchedTarget)} == (
        BATCHED_TYPES
    )
