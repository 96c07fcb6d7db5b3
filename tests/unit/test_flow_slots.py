"""A flow's rate as slots: none before its task's due time, none closer than its spacing,
which keeps any second within the rate; and the flow a webhook gets from its host."""

import json

import pytest

from tocsin.flow import (
    JITTER_MS,
    LAST_SLACK_MAX_MS,
    LAST_SLACK_MS,
    SLOT_SLACK_MS,
    Flow,
    RateLedger,
    flow_of,
    slots,
    spacing_us,
    wide_slot,
)
from tocsin.measure import most_within
from tocsin.settings import MAX_FLOW_RATE, settings


def test_the_spacing_leaves_a_second_room_for_a_late_send_and_jitter_within_the_rate():
    for rate in (1, 3, 4, 500, MAX_FLOW_RATE):
        assert rate * spacing_us(rate) >= 1000 * (1000 + SLOT_SLACK_MS + JITTER_MS)
        assert (rate - 1) * spacing_us(rate) < 1000 * (1000 + SLOT_SLACK_MS + JITTER_MS)


def test_tasks_due_together_are_spaced_the_first_at_its_due_time():
    planned, free_us = slots([1000, 1000, 1000, 1000], 0, rate=4)  # 260 ms apart
    assert planned == [1000, 1260, 1520, 1780]
    assert free_us == 2_040_000


def test_a_task_due_after_the_free_slot_keeps_its_due_time():
    planned, _ = slots([1000, 5000], 0, rate=1)
    assert planned == [1000, 5000]


def test_the_ledger_s_free_slot_holds_back_a_task_due_before_it():
    """Another invocation took the slots up to 1.5 s: this one's tasks follow them."""
    planned, free_us = slots([1000, 1000], 1_500_000, rate=2)
    assert planned == [1500, 2020]
    assert free_us == 2_540_000


def test_a_slot_between_milliseconds_is_rounded_up_never_down():
    planned, _ = slots([0, 0, 0, 0], 0, rate=3)  # 346.667 ms apart
    assert planned == [0, 347, 694, 1041]


@pytest.mark.parametrize("rate", [1, 5, 10, 100, 500, MAX_FLOW_RATE])
@pytest.mark.parametrize("late_ms", [0, 30, 400, 5000])
def test_a_last_try_s_wide_slot_lets_it_go_late_within_the_rate(rate, late_ms):
    """A last try's slots span twice its gate's lateness (within 50 ms and 1 s): in them
    it may go that late, and the sends in the slots before and after them, each as late
    as a slot allows, still make at most `rate` in any second."""
    count, slack_ms = wide_slot(rate, late_ms)
    assert slack_ms >= min(max(LAST_SLACK_MS, 2 * late_ms), LAST_SLACK_MAX_MS)
    spacing = spacing_us(rate)
    before = [i * spacing // 1000 + SLOT_SLACK_MS for i in range(rate)]  # late, as allowed
    first_us = rate * spacing
    after = [(first_us + (count + i) * spacing) // 1000 for i in range(rate)]  # on time
    last_try = first_us // 1000 + slack_ms  # as late as its slots allow
    assert most_within([*before, last_try, *after], 1000) <= rate


def test_a_wide_ticket_takes_its_slots_in_a_row_from_the_ledger(table):
    """Three slots for a last try: the next send's slot is three spacings on; behind the
    ledger, the slots start at the send's ready time and are as many."""
    ledger, flow = RateLedger(table), Flow(key="k", rate=4)  # 260 ms apart
    assert ledger.ticket(flow, 10_000) == 10_000
    assert ledger.ticket(flow, 10_000, count=3) == 10_260
    assert ledger.ticket(flow, 10_000) == 11_040
    assert ledger.ticket(flow, 20_000, count=2) == 20_000  # the ledger behind it
    assert ledger.ticket(flow, 20_000) == 20_520


@pytest.fixture
def host_flow_rate(monkeypatch):
    """The stack's HostFlowRate of 50."""
    monkeypatch.setenv("HOST_FLOW_RATE", "50")
    settings.cache_clear()
    yield
    monkeypatch.undo()
    settings.cache_clear()


def stored_task(task_type: str, target: dict, **more: str) -> dict:
    return {"task_type": task_type, "target": json.dumps(target), **more}


@pytest.mark.usefixtures("host_flow_rate")
@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://Hooks.Example.com:8443/x?y=1", "host:hooks.example.com"),
        ("https://[2001:db8::1]/x", "host:2001:db8::1"),
    ],
)
def test_a_webhook_that_names_no_flow_gets_its_host_s(url, key):
    assert flow_of(stored_task("webhook", {"url": url})) == Flow(key=key, rate=50)


@pytest.mark.usefixtures("host_flow_rate")
def test_hosts_too_long_for_a_key_get_keys_of_their_own():
    keys = {
        flow_of(stored_task("webhook", {"url": f"https://{'a' * 60}.{tail}/"})).key  # type: ignore[union-attr]
        for tail in ("example.com", "example.org")
    }
    assert len(keys) == 2 and all(len(key) <= 64 for key in keys)


@pytest.mark.usefixtures("host_flow_rate")
def test_a_task_s_own_flow_and_other_types_are_left_as_they_are():
    own = Flow(key="tenant-7", parallelism=3)
    named = stored_task("webhook", {"url": "https://a.example/"}, flow=own.stored())
    assert flow_of(named) == own
    assert flow_of(stored_task("sqs", {"queue_url": "https://sqs.example/q"})) is None


def test_without_host_limits_a_webhook_has_no_flow():
    assert flow_of(stored_task("webhook", {"url": "https://a.example/"})) is None
