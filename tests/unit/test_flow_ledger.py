"""A flow's rate ledger on the Tasks table (`tocsin.flow.RateLedger`): a plan takes a
batch's slots in one write, a ticket one send's, both from the same item, and two writers
racing never get one slot; and the flows a task gets from its host's hold and shows."""

import json
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import boto3
import pytest

from tocsin.flow import LEDGER_DAYS, Flow, RateLedger, flow_of, flow_view, wide_slot
from tocsin.flow_keys import ledger_key
from tocsin.settings import settings

FLOW = Flow(key="k", rate=4)  # slots 260 ms apart
TWO_DAYS_S = LEDGER_DAYS * 86_400
T = 1_765_000_000_000  # 2025-12-06T05:46:40Z: the epoch milliseconds tasks are due at


class RacedTable:
    """The ledger's table, another writer's turn made just before our `nth` update: what
    DynamoDB would see of two executors writing at once. Counts our updates."""

    def __init__(self, table: Any, nth: int, other: Callable[[], object]):
        self._table, self._nth, self._other, self.updates = table, nth, other, 0

    def update_item(self, **kwargs: Any) -> Any:
        self.updates += 1
        if self.updates == self._nth:
            self._other()
        return self._table.update_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)


def ledger_item(table: str) -> dict[str, Any]:
    return boto3.resource("dynamodb").Table(table).get_item(Key=ledger_key("k", "rate"))["Item"]


def counted(ledger: RateLedger, nth: int = 0, other: Callable[[], object] = lambda: None):
    ledger._table = RacedTable(ledger._table, nth, other)  # type: ignore[assignment]
    return ledger._table


def test_a_plan_takes_its_batch_s_slots_in_one_write(table):
    ledger = RateLedger(table)
    writes = counted(ledger)
    assert ledger.plan(FLOW, [T + 10_000, T + 10_000, T + 10_500]) == [
        T + 10_000,
        T + 10_260,
        T + 10_520,
    ]
    assert writes.updates == 1
    item = ledger_item(table)
    assert item["free_us"] == (T + 10_780) * 1000  # the slot after the last
    assert item["expires_at"] == T // 1000 + 10 + TWO_DAYS_S  # kept two days past it, then deleted


def test_a_plan_behind_the_ledger_follows_the_slots_taken_before_it(table):
    RateLedger(table).plan(FLOW, [T + 10_000, T + 10_000, T + 10_500])
    ledger = RateLedger(table)
    writes = counted(ledger)
    assert ledger.plan(FLOW, [T + 10_000]) == [T + 10_780]
    assert writes.updates == 2  # refused, then from the slot the ledger holds
    assert ledger_item(table)["free_us"] == (T + 11_040) * 1000


def test_a_plan_due_at_the_ledger_s_free_slot_takes_it_in_one_write(table):
    RateLedger(table).plan(FLOW, [T + 10_000])  # free at 10.26 s
    ledger = RateLedger(table)
    writes = counted(ledger)
    assert ledger.plan(FLOW, [T + 10_260]) == [T + 10_260]
    assert writes.updates == 1


def test_a_plan_raced_by_another_executor_s_plans_again_after_its_slots(table):
    """Refused at 10.26 s, this plan writes from there; another executor's plan takes
    that slot first: this one's is the next, once more from what the ledger holds."""
    RateLedger(table).plan(FLOW, [T + 10_000])
    other = RateLedger(table)
    ledger = RateLedger(table)
    writes = counted(ledger, nth=2, other=lambda: other.plan(FLOW, [T + 10_000]))
    assert ledger.plan(FLOW, [T + 10_000]) == [T + 10_520]
    assert writes.updates == 3
    assert ledger_item(table)["free_us"] == (T + 10_780) * 1000


def test_a_ticket_takes_the_slot_after_the_plan_s(table):
    """One item for both: no slot is given twice, whichever way it is taken."""
    ledger = RateLedger(table)
    ledger.plan(FLOW, [T + 10_000])
    assert ledger.ticket(FLOW, T + 10_000) == T + 10_260
    assert ledger.plan(FLOW, [T + 10_000]) == [T + 10_520]


def test_a_ticket_is_kept_two_days_past_the_send_it_is_for(table):
    RateLedger(table).ticket(FLOW, T + 10_000)
    assert ledger_item(table)["expires_at"] == T // 1000 + 10 + TWO_DAYS_S
    RateLedger(table).ticket(FLOW, T + 90_000_000)
    assert ledger_item(table)["expires_at"] == T // 1000 + 90_000 + TWO_DAYS_S


def test_a_ticket_ready_at_the_ledger_s_free_slot_takes_it(table):
    ledger = RateLedger(table)
    assert ledger.ticket(FLOW, T + 10_000) == T + 10_000
    writes = counted(ledger)
    assert ledger.ticket(FLOW, T + 10_260) == T + 10_260
    assert writes.updates == 1
    assert ledger_item(table)["free_us"] == (T + 10_520) * 1000


def test_a_ticket_s_slot_between_milliseconds_is_the_next_millisecond(table):
    ledger, flow = RateLedger(table), Flow(key="k", rate=3)  # 346.667 ms apart
    assert [ledger.ticket(flow, T) for _ in range(3)] == [T, T + 347, T + 694]


def test_two_tickets_racing_behind_the_ledger_get_slots_a_spacing_apart(table):
    """Both find the ledger behind their ready time; the other moves it on first: this
    one's conditional move is refused, and it takes the slot after the other's."""
    other, ledger = RateLedger(table), RateLedger(table)
    got = []
    counted(ledger, nth=2, other=lambda: got.append(other.ticket(FLOW, T + 10_000)))
    got.append(ledger.ticket(FLOW, T + 10_000))
    assert got == [T + 10_000, T + 10_260]
    assert ledger_item(table)["free_us"] == (T + 10_520) * 1000


class SlowTable(RacedTable):
    """A table whose every write takes `ms`: a DynamoDB far away."""

    def __init__(self, table: Any, ms: int):
        super().__init__(table, 0, lambda: None)
        self._ms = ms

    def update_item(self, **kwargs: Any) -> Any:
        time.sleep(self._ms / 1000)
        return super().update_item(**kwargs)


def test_a_send_asks_for_a_slot_as_far_ahead_as_two_of_the_last_writes_took(table):
    """20 ms ahead at first (writes of 10 ms guessed); after writes of 60 ms, about
    twice that, so that a slot asked for is still ahead when its write returns."""
    ledger = RateLedger(table)
    assert ledger.lead_ms() == 20
    ledger._table = SlowTable(ledger._table, 60)  # type: ignore[assignment]
    for ready_ms in range(T, T + 10_000, 1000):
        ledger.ticket(FLOW, ready_ms)
    assert 100 <= ledger.lead_ms() <= 400  # a moving average: 0.8 of it kept each write


@pytest.mark.parametrize(
    ("rate", "late_ms", "count", "slack_ms"),
    [
        (5, 0, 2, 228),  # 208 ms apart, 50 ms of slack: the first slot and one more
        (5, 400, 5, 852),  # 800 ms of slack: four more slots
        (3, 100, 2, 366),  # 346.667 ms apart: the last of them at 366.667, floored
        (3, 700, 4, 1060),  # twice 700 ms is past the cap of a second
        (1000, 0, 30, 50),  # 1.04 ms apart: 50 ms of them
        (1000, 36, 51, 72),  # 72 ms of slack: 50 spacings past the usual 20, exactly
    ],
)
def test_a_last_try_s_wide_slot_is_no_wider_than_its_lateness_needs(rate, late_ms, count, slack_ms):
    """As many slots as twice its gate's lateness spans past the usual slack, and that
    late it may go: each slot more is one another send does not get."""
    assert wide_slot(rate, late_ms) == (count, slack_ms)


@pytest.fixture
def host_settings(monkeypatch):
    """Set the stack's host flow settings by their environment names."""

    def setting(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings.cache_clear()

    yield setting
    monkeypatch.undo()
    settings.cache_clear()


@pytest.mark.parametrize(
    ("env", "rate"),
    [
        ({}, 20),  # HostRecoveryRate's default
        ({"HOST_RECOVERY_RATE": "7"}, 7),
        ({"HOST_FLOW_RATE": "5"}, 5),  # the host's own rate, lower
        ({"HOST_FLOW_RATE": "50"}, 20),
    ],
)
def test_a_task_woken_from_a_host_s_hold_goes_through_the_hold_s_recovery_flow(
    host_settings, env, rate
):
    host_settings(**env)
    item = {
        "task_type": "webhook",
        "target": json.dumps({"url": "https://a.example/"}),
        "recovering": "~hold:5d41402abc4b2a76b9719d911017c592",
    }
    assert flow_of(item) == Flow(key="recover:5d41402abc4b2a76b9719d911017c592", rate=rate)


def test_a_host_s_parallelism_alone_makes_its_flow(host_settings):
    host_settings(HOST_FLOW_PARALLELISM="3")
    item = {"task_type": "webhook", "target": json.dumps({"url": "https://a.example/"})}
    assert flow_of(item) == Flow(key="host:a.example", parallelism=3)


def test_a_host_too_long_for_a_key_is_keyed_by_its_digest(host_settings):
    """The key an operator reads in the logs: `host:` and 32 hex digits of its sha256."""
    host_settings(HOST_FLOW_RATE="50")
    host = f"{'a' * 60}.example.com"
    item = {"task_type": "webhook", "target": json.dumps({"url": f"https://{host}/"})}
    key = flow_of(item).key  # type: ignore[union-attr]
    assert key.startswith("host:") and len(key) == 37
    assert set(key.removeprefix("host:")) <= set("0123456789abcdef")


def test_a_task_s_view_shows_its_flow_its_planned_slot_and_its_hold(table):
    item = {
        "flow": Flow(key="tenant-7", rate=2).stored(),
        "planned_at": "2026-12-04T10:00:01.520Z",
        "held_ms": Decimal(1520),  # as DynamoDB gives it back
    }
    view = flow_view(item)
    assert json.loads(json.dumps(view)) == {
        "flow": {"key": "tenant-7", "rate": 2, "parallelism": None},
        "planned_at": "2026-12-04T10:00:01.520Z",
        "held_ms": 1520,
    }
    assert flow_view({"task_type": "sqs"}) == {}
