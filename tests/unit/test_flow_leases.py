"""A flow's leases (`tocsin.flow.Leases`): a send that gives up waiting holds none."""

import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from tocsin import clock
from tocsin.flow import LEASE_GRANT_MS, Flow, Leases, NoLeaseInTime

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
    while not leases._busy:
        time.sleep(0.01)
    monkeypatch.setattr(Leases, "_turn", gives_up_as_the_first_ends)
    with pytest.raises(NoLeaseInTime), leases.sending(clock.now_ms(), clock.now_ms() + 100):
        pass
    holding.join()
    assert lease_held_until(table) == 0  # given back: free for any invocation's sends
    assert leases._busy == leases._idle == []


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
    while not leases._busy:
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


def lease_calls(leases: Leases) -> list[str]:
    """The DynamoDB calls the leases make, by name, as they are made."""
    calls: list[str] = []
    leases._table.meta.client.meta.events.register(
        "before-call.dynamodb", lambda model, **_: calls.append(model.name)
    )
    return calls


def sends_in_line(leases: Leases, places: list[int]) -> dict[int, int]:
    """A send at each place, all in line at once, each holding its lease 5 ms: when each
    had it."""
    had = {}

    def send(place_ms: int) -> None:
        with leases.sending(place_ms, place_ms + 10_000) as free_ms:
            had[place_ms] = free_ms
            time.sleep(0.005)

    threads = [threading.Thread(target=send, args=(place,)) for place in places]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return had


def test_a_run_of_sends_takes_a_lease_once_and_none_ahead_of_its_place(table):
    """Five sends of one invocation in line, their places 15 ms apart: the lease taken for
    the first is kept idle for the next and given back after the last, one read and two
    writes in all (not one of each a send); and no send has it before its place, where it
    would keep the flow's sends from the receiver while it waits."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    calls = lease_calls(leases)
    start = clock.now_ms() + 100
    places = [start + 15 * i for i in range(5)]
    had = sends_in_line(leases, places)
    assert sorted(had) == places
    assert all(had[place] >= place - LEASE_GRANT_MS for place in places)
    assert calls == ["BatchGetItem", "UpdateItem", "UpdateItem"]
    assert lease_held_until(table) == 0  # given back after the last


def test_a_lease_is_not_kept_for_a_send_not_due_soon(table):
    """Two sends in line 300 ms apart: the lease goes back between them, for another
    invocation's sends due meanwhile, and is taken again for the second."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    calls = lease_calls(leases)
    start = clock.now_ms() + 100
    assert sorted(sends_in_line(leases, [start, start + 300])) == [start, start + 300]
    assert calls == ["BatchGetItem", "UpdateItem", "UpdateItem"] * 2


def leases_held(table: str, holders: dict[str, tuple[str, int]]) -> None:
    """Lease items as other invocations left them: `lease<i>` held by a holder until a time."""
    items = boto3.resource("dynamodb").Table(table)
    for part, (holder, until_ms) in holders.items():
        items.put_item(
            Item={"task_id": f"~flow:{part}:one-host", "holder": holder, "until_ms": until_ms}
        )


def test_a_send_takes_a_lease_whose_holder_s_time_is_over_not_one_still_held(table):
    """Of two leases, one held by another invocation until a minute from now and one whose
    holder's time is over, a send takes the second, in one write, and leaves the first
    alone; the lease item it takes says whose it is until when, and lives two days past
    that (TTL deletes an idle key's)."""
    now = clock.now_ms()
    leases_held(table, {"lease0": ("another", now + 60_000), "lease1": ("another", now - 1)})
    until_ms = now + 30_000
    leases = Leases(table, Flow(key="one-host", parallelism=2), "invocation-1", until_ms)
    calls = lease_calls(leases)
    items = boto3.resource("dynamodb").Table(table)
    with leases.sending(now, now + 1000):
        taken = items.get_item(Key={"task_id": "~flow:lease1:one-host"})["Item"]
        assert calls == ["BatchGetItem", "UpdateItem"]
    assert taken["holder"] == "invocation-1" and taken["until_ms"] == until_ms
    assert taken["expires_at"] == until_ms // 1000 + 2 * 86_400
    other = items.get_item(Key={"task_id": "~flow:lease0:one-host"})["Item"]
    assert (other["holder"], other["until_ms"]) == ("another", now + 60_000)


def test_a_lease_the_table_will_not_take_back_fails_no_send(table):
    """The table refuses the give-back (a throttle, after botocore's retries): the send
    that held the lease is not failed, and the lease ends with its invocation's time."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)

    def refuse_the_give_back(params: dict, **_: object) -> None:
        if params.get("UpdateExpression") == "SET until_ms = :over":
            error = {"Error": {"Code": "ProvisionedThroughputExceededException"}}
            raise ClientError(error, "UpdateItem")

    leases._table.meta.client.meta.events.register(
        "before-parameter-build.dynamodb.UpdateItem", refuse_the_give_back
    )
    with leases.sending(clock.now_ms(), clock.now_ms() + 1000):
        pass
    assert lease_held_until(table) > clock.now_ms()


def test_a_send_takes_one_lease_of_many_and_two_at_once_take_two(table):
    """Three leases: a send alone takes one (one write), not every free one; a second send
    while the first holds its lease reads the items again and takes another, passing over
    the one its invocation holds."""
    leases = Leases(
        table, Flow(key="one-host", parallelism=3), "invocation-1", clock.now_ms() + 60_000
    )
    calls = lease_calls(leases)
    now = clock.now_ms()
    with leases.sending(now, now + 1000):
        assert calls == ["BatchGetItem", "UpdateItem"]
        with leases.sending(now, now + 1000):
            assert calls == ["BatchGetItem", "UpdateItem"] * 2
            assert len({item["task_id"] for item in leases._busy}) == 2


def test_a_look_the_table_refuses_is_logged_and_made_again(table, caplog):
    """The leases' read fails (a throttle, after botocore's retries): it is logged with the
    key and the fault's name, and the send looks again after a pause, and gets its lease."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    refusals = iter([True])

    def refuse_the_first_read(**_: object) -> None:
        if next(refusals, False):
            error = {"Error": {"Code": "ProvisionedThroughputExceededException"}}
            raise ClientError(error, "BatchGetItem")

    leases._table.meta.client.meta.events.register(
        "before-parameter-build.dynamodb.BatchGetItem", refuse_the_first_read
    )
    with leases.sending(clock.now_ms(), clock.now_ms() + 5000):
        assert lease_held_until(table) > clock.now_ms()
    [logged] = [r for r in caplog.records if r.getMessage() == "flow leases not read"]
    assert logged.levelname == "WARNING"
    assert (logged.key, logged.fault) == ("one-host", "ClientError")  # type: ignore[attr-defined]
