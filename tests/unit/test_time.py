"""Milliseconds survive every conversion; the gate never lets go early; wake is floored."""

from collections import Counter
from datetime import UTC, datetime

from tocsin import clock, gate
from tocsin.dispatch import (
    MAX_STAGGER_S,
    Batch,
    DueTask,
    WakePlan,
    execution_input,
    pack,
    staggers,
    wake_ms,
)
from tocsin.model import TaskType
from tocsin.settings import Settings


def test_iso_round_trip_keeps_milliseconds():
    for ms in (0, 1_800_000_000_001, 1_800_000_000_999, 1_767_225_600_000):
        assert clock.to_ms(datetime.fromisoformat(clock.to_iso(ms))) == ms


def test_sub_millisecond_parts_are_floored():
    moment = datetime(2027, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC)
    assert clock.to_ms(moment) % 1000 == 999


def test_gate_never_releases_before_due():
    for offset in (0, 3, 17, 40):
        due = clock.now_ms() + offset
        released = gate.wait_until(due)
        assert released >= due
        assert clock.now_ms() >= due


def test_gate_lets_go_on_its_due_millisecond_itself(monkeypatch):
    """A clock that reads the due millisecond lets the gate go then, with no more sleep (a
    gate that waited for the millisecond after was one late on every task). The clock is
    played: it moves only when the gate sleeps, as far as it asked (a millisecond at least)."""
    start = 1_800_000_000_000
    now = [start]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += max(1, round(seconds * 1000))

    monkeypatch.setattr(clock, "now_ms", lambda: now[0])
    monkeypatch.setattr(gate.time, "sleep", sleep)
    assert (gate.wait_until(start), slept) == (start, [])
    assert (gate.wait_until(start + 25), slept) == (start + 25, [0.025])


def test_wake_is_the_lead_before_due_floored_to_the_second():
    config = Settings(LEAD_MS=2000, RETENTION_DAYS=30)
    task = DueTask(due_ms=1_800_000_001_500, task_id="t", version=3, task_type=TaskType.SQS)
    started = execution_input(Batch((task,)), config)
    assert started["wake_at"] == clock.to_iso_second(1_799_999_999_500)
    assert started["wake_at"].endswith(":59Z")
    assert Batch((task,)).execution_name == "t-v3"
    assert started["tasks"] == [{"task_id": "t", "version": 3, "due_ms": 1_800_000_001_500}]
    assert (started["task_type"], started["executor"]) == ("sqs", 3)


def test_a_crowded_due_second_wakes_over_the_seconds_before_it():
    config = Settings(LEAD_MS=2000, WAKES_PER_SECOND=3)
    due = 1_800_000_010_000
    burst = [Batch((DueTask(due + i * 7, f"b{i}", 1, TaskType.WEBHOOK),)) for i in range(8)]
    alone = Batch((DueTask(due + 60_000, "alone", 1, TaskType.WEBHOOK),))
    stagger = staggers([*burst, alone], config, now_ms=due - 30_000)
    assert [stagger[task] for task in burst] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert stagger[alone] == 0
    woken = Counter(execution_input(t, config, stagger[t])["wake_at"] for t in burst)
    assert max(woken.values()) == 3 and len(woken) == 3


def test_staggered_wakes_never_fall_before_now_nor_too_early():
    config = Settings(LEAD_MS=2000, WAKES_PER_SECOND=1)
    due = 1_800_000_010_000
    burst = [Batch((DueTask(due, f"b{i}", 1, TaskType.WEBHOOK),)) for i in range(40)]
    close = staggers(burst, config, now_ms=due - 4000)  # wake second is due - 2 s: 2 s to spare
    assert max(close.values()) == 2
    far = staggers(burst, config, now_ms=due - 600_000)
    assert max(far.values()) == MAX_STAGGER_S


def test_a_burst_wakes_no_faster_than_the_table_can_take_its_claims():
    # a new table (4,000 claims a second); batches whose wakes share one second
    config = Settings(LEAD_MS=2000, PREPARE_MS_PER_TASK=10, TABLE_WARM_WRITES_PER_SECOND=0)
    due = 1_800_000_010_000
    tasks = [DueTask(due + i % 1000, f"t{i}", 1, TaskType.SQS) for i in range(20_000)]
    batches = pack(tasks, window_ms=1000, batch_size=500, burst_sends=config.burst_sends)
    stagger = staggers(batches, config, now_ms=due - 60_000)
    claims = Counter()
    for batch in batches:
        claims[stagger[batch]] += len(batch.tasks)
    assert max(claims.values()) == config.claims_per_second == 4000
    assert sorted(claims) == [0, 1, 2, 3, 4]  # 40 batches, 8 a second
    warmed = Settings(LEAD_MS=2000, PREPARE_MS_PER_TASK=10, TABLE_WARM_WRITES_PER_SECOND=20_000)
    assert set(staggers(batches, warmed, now_ms=due - 60_000).values()) == {0}


def test_a_crowded_second_overflows_earlier_only_into_environments_to_spare():
    """Each woken batch holds an environment until its last gate, so waking earlier holds
    one longer: a batch overflows only while every second it would hold stays in budget,
    and else wakes at its own second."""
    due = 1_800_000_010_000
    three = [Batch((DueTask(due, f"b{i}", 1, TaskType.WEBHOOK),)) for i in range(3)]
    tight = Settings(LEAD_MS=2000, WAKES_PER_SECOND=1, CONCURRENCY_BUDGET=2)
    stagger = staggers(three, tight, now_ms=due - 60_000)
    assert [stagger[b] for b in three] == [0, 1, 0]  # the third would need a third one
    roomy = Settings(LEAD_MS=2000, WAKES_PER_SECOND=1, CONCURRENCY_BUDGET=900)
    stagger = staggers(three, roomy, now_ms=due - 60_000)
    assert [stagger[b] for b in three] == [0, 1, 2]


def test_claims_beyond_the_tables_write_units_wake_late_rather_than_be_throttled():
    """A provisioned table takes its write units a second: a crowded second's claims go
    earlier while a second from now on has room, then later, and fire late (a claim the
    table throttled past its retries failed its task). Only the claims make a batch late."""
    config = Settings(LEAD_MS=2000, PROVISIONED_WRITES_PER_SECOND=10)
    due = 1_800_000_010_000
    batches = [
        Batch(tuple(DueTask(due, f"b{b}t{t}", 1, TaskType.WEBHOOK) for t in range(10)))
        for b in range(6)
    ]
    own = wake_ms(batches[0], config) // 1000
    stagger = staggers(batches, config, now_ms=(own - 1) * 1000)
    assert sorted(stagger.values()) == [-4, -3, -2, -1, 0, 1]
    latest = min(batches, key=stagger.__getitem__)
    assert execution_input(latest, config, stagger[latest])["wake_at"] == clock.to_iso_second(
        (own + 4) * 1000
    )
    assert (own + 4) * 1000 > due  # its tasks fire when it wakes, a second late
    on_demand = Settings(LEAD_MS=2000)
    assert set(staggers(batches, on_demand, now_ms=(own - 1) * 1000).values()) == {0}


def test_a_batch_wakes_earlier_by_the_preparation_of_each_task_beyond_its_first():
    config = Settings(LEAD_MS=2000, PREPARE_MS_PER_TASK=10)
    due = 1_800_000_010_000
    alone = Batch((DueTask(due, "alone", 1, TaskType.WEBHOOK),))
    full = Batch(tuple(DueTask(due + i, f"t{i}", 1, TaskType.WEBHOOK) for i in range(500)))
    assert execution_input(alone, config)["wake_at"] == clock.to_iso_second(due - 2000)
    assert execution_input(full, config)["wake_at"] == clock.to_iso_second(due - 2000 - 4990)


def test_an_environment_is_held_until_its_last_attempt_can_end():
    """A batch holds its executor until its last task's send can end (a webhook 19 s after
    its gate, an AWS target 28 s), not only until the gate: with room for one environment,
    a batch due 10 s after another has none while the first may still be sending."""
    config = Settings(LEAD_MS=2000, CONCURRENCY_BUDGET=1, WAKES_PER_SECOND=100)
    due = 1_800_000_010_000
    first = Batch((DueTask(due, "first", 1, TaskType.WEBHOOK),))
    plan = WakePlan(config)
    plan.add(wake_ms(first, config) // 1000, first)
    after_gate = Batch((DueTask(due + 10_000, "after-gate", 1, TaskType.WEBHOOK),))
    after_attempt = Batch((DueTask(due + 22_000, "after-attempt", 1, TaskType.WEBHOOK),))
    assert not plan.fits(wake_ms(after_gate, config) // 1000, after_gate)
    assert plan.fits(wake_ms(after_attempt, config) // 1000, after_attempt)


def test_one_executor_wakes_no_more_environments_in_10_s_than_lambda_adds():
    """Lambda adds at most 1,000 environments to one function in 10 s: a thousand wakes of
    the webhook executor in one second leave no room for another in the next nine, and
    room after them, and for another executor throughout."""
    config = Settings(LEAD_MS=2000, CONCURRENCY_BUDGET=10_000, WAKES_PER_SECOND=2_000)
    due = 1_800_000_010_000
    plan, second = WakePlan(config), due // 1000
    for i in range(1000):
        plan.add(second, Batch((DueTask(due, f"w{i}", 1, TaskType.WEBHOOK),)))
    webhook = Batch((DueTask(due + 30_000, "one-more", 1, TaskType.WEBHOOK),))
    queue = Batch((DueTask(due + 30_000, "queue", 1, TaskType.SQS),))
    assert not plan.fits(second + 9, webhook) and plan.fits(second + 10, webhook)
    assert plan.fits(second + 9, queue)


def test_each_task_beyond_the_first_wakes_its_batch_its_preparation_earlier():
    """Three tasks at 10 ms of preparation each beyond the first: the wake is the lead and
    20 ms before the first task, floored to its second. Due 15 ms past a boundary, the
    20 ms move the wake into the second before; 10 ms would not."""
    config = Settings(LEAD_MS=2000, PREPARE_MS_PER_TASK=10)
    due = 1_800_000_012_015
    batch = Batch(tuple(DueTask(due + i, f"t{i}", 1, TaskType.WEBHOOK) for i in range(3)))
    assert wake_ms(batch, config) == 1_800_000_009_000
    lone = Batch(batch.tasks[:1])
    assert wake_ms(lone, config) == 1_800_000_010_000
