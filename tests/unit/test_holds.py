"""A host's hold item (`tocsin.holds.HostHold`): failed sends in a row across one owner's
tasks begin it, whatever order their threads write in; its first answer ends it."""

from tocsin import clock
from tocsin.holds import HostHold, hold_id, read_holds

THRESHOLD = 5


def hold_of(table: str, owner: str = "alice", host: str = "example.com:443") -> HostHold:
    return read_holds(table, {hold_id(owner, host): (owner, host, "webhook")})[hold_id(owner, host)]


def test_failures_in_a_row_across_tasks_begin_the_hold_with_one_prober(table):
    hold, now = hold_of(table), clock.now_ms()
    tasks = [f"task-{i}" for i in range(THRESHOLD)]
    for task_id in tasks:
        assert not hold.began
        hold.failed(task_id, "503", now + 3000, now, THRESHOLD)
    assert hold.began and hold.state.held_since_ms is not None
    prober = hold.state.prober
    assert prober == tasks[-1]
    assert hold.verdict(prober, now + 3000, now) is None  # the prober goes on
    others = [hold.verdict(t, now + 3000, now) for t in tasks if t != prober]
    assert all(parked is not None and parked.hold == hold.id for parked in others)
    # a new invocation reads it held
    assert hold_of(table).verdict("newcomer", now + 3000, now) is not None


def test_a_reply_that_comes_after_a_later_write_s_changes_nothing(table):
    """Sends answer in threads of their own: an earlier write's reply may come last."""
    hold, now = hold_of(table), clock.now_ms()
    for i in range(THRESHOLD):
        hold.failed(f"task-{i}", "503", now, now, THRESHOLD)
    held = hold.state
    hold._seen({"task_id": hold.id, "failures": 1, "writes": 1})  # the first count's reply
    assert hold.state == held


def test_fewer_failures_than_the_threshold_hold_nothing_and_an_answer_starts_the_count_over(table):
    hold, now = hold_of(table), clock.now_ms()
    for i in range(THRESHOLD - 1):
        hold.failed(f"task-{i}", "503", now, now, THRESHOLD)
    hold.answered(now)
    hold.failed("task-x", "503", now, now, THRESHOLD)
    assert hold_of(table).state.failures == 1 and hold.state.held_since_ms is None


def test_the_first_answer_ends_the_hold_once(table):
    hold, now = hold_of(table), clock.now_ms()
    for i in range(THRESHOLD):
        hold.failed(f"task-{i}", "503", now, now, THRESHOLD)
    other = hold_of(table)
    hold.answered(now)
    other.answered(now)
    assert hold.released and not other.released  # one invocation wakes the waiting tasks
    assert hold_of(table).verdict("anyone", now, now) is None


def test_another_owner_s_failures_hold_nothing_of_yours(table):
    hold, now = hold_of(table, owner="mallory"), clock.now_ms()
    for i in range(THRESHOLD):
        hold.failed(f"task-{i}", "503", now, now, THRESHOLD)
    assert hold_of(table, owner="alice").verdict("mine", now, now) is None


def test_a_prober_that_gave_up_lets_the_next_task_probe(table):
    hold, now = hold_of(table), clock.now_ms()
    for i in range(THRESHOLD):
        hold.failed(f"task-{i}", "503", now + 3000, now, THRESHOLD)
    prober = hold.state.prober
    assert hold.verdict("waiting", now, now) is not None
    hold.hand_probe_on(prober)
    assert hold.handed
    assert hold_of(table).verdict("waiting", now, now) is None  # made the prober
    assert hold_of(table).state.prober == "waiting"
