"""A flow's leases (`tocsin.flow.Leases`): a send that gives up waiting holds none."""

import threading
import time

import boto3
import pytest

from tocsin import clock
from tocsin.flow import Flow, Leases, NoLeaseInTime

FLOW = Flow(key="one-host", parallelism=1)


def lease_held_until(table: str) -> int:
    key = {"task_id": "~flow:lease0:one-host"}
    return int(boto3.resource("dynamodb").Table(table).get_item(Key=key)["Item"]["until_ms"])


def test_a_lease_handed_to_a_send_as_it_gives_up_goes_on_at_once(table, monkeypatch):
    """The send first in line gives up (its time is up) in the moment the send that holds
    the one lease ends and hands it to it: the lease goes back to the table at once, not
    when the invocation ends (another invocation's sends would wait for it until then)."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    first_ends, first_ended = threading.Event(), threading.Event()

    def first_send() -> None:
        with leases.sending(clock.now_ms(), clock.now_ms() + 1000):
            first_ends.wait(10)
        first_ended.set()

    turn = Leases._turn

    def gives_up_as_the_first_ends(self: Leases, me: object, by_ms: int) -> bool:
        try:
            return turn(self, me, by_ms)
        except NoLeaseInTime:  # the first send ends now, and hands its lease down the line
            first_ends.set()
            first_ended.wait(10)
            raise

    holding = threading.Thread(target=first_send)
    holding.start()
    while not leases._held:
        time.sleep(0.01)
    monkeypatch.setattr(Leases, "_turn", gives_up_as_the_first_ends)
    with pytest.raises(NoLeaseInTime), leases.sending(clock.now_ms(), clock.now_ms() + 100):
        pass
    holding.join()
    assert lease_held_until(table) == 0  # given back: free for any invocation's sends
    assert leases._held == []


def test_a_send_that_joins_the_line_late_goes_ahead_of_those_due_after_it(table):
    """The one lease held; the send of a later slot joins the line first (the thread of the
    earlier one was woken late): the lease goes to the earlier slot's send first."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    now, order = clock.now_ms(), []
    holder_ends = threading.Event()

    def send(slot_ms: int) -> None:
        with leases.sending(slot_ms, now + 10_000):
            order.append(slot_ms)
            if slot_ms == now:
                holder_ends.wait(10)

    holder = threading.Thread(target=send, args=(now,))
    holder.start()
    while not leases._held:
        time.sleep(0.01)
    waiting = []
    for slot_ms in (now + 40, now + 20):  # the later one first
        waiting.append(threading.Thread(target=send, args=(slot_ms,)))
        waiting[-1].start()
        while len(leases._line) < len(waiting):
            time.sleep(0.01)
    holder_ends.set()
    for thread in (holder, *waiting):
        thread.join(10)
    assert order == [now, now + 20, now + 40]
