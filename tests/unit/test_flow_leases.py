"""A flow's leases (`tocsin.flow.Leases`): no more sends at once than its parallelism, a lease
another invocation holds left to it, and a send that gives up waiting holds none."""

import io
import itertools
import json
import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

import tocsin.flow
from tests.conftest import hooked
from tocsin import clock
from tocsin.flow import (
    GRANT_AHEAD_MS,
    LEASE_KEEP_MS,
    LEASE_POLL_MAX_MS,
    LEASE_POLL_MS,
    LOOK_AHEAD_MS,
    Flow,
    Leases,
    NoLeaseInTime,
    _Waiter,
)
from tocsin.flow_keys import LEASE_PART, ledger_key
from tocsin.observability import logger

FLOW = Flow(key="one-host", parallelism=1)
BEFORE = "before-parameter-build.dynamodb."  # a DynamoDB call's parameters, before it goes


def lease_held_until(table: str) -> int:
    key = ledger_key(FLOW.key, f"{LEASE_PART}0")
    return int(boto3.resource("dynamodb").Table(table).get_item(Key=key)["Item"]["until_ms"])


def waiting_behind(leases: Leases, place_ms: int, had: list[int]) -> threading.Thread:
    """A send of `leases` at `place_ms`, started and in line (what it had, into `had`)."""

    def send() -> None:
        with leases.sending(place_ms, clock.now_ms() + 5_000) as had_ms:
            had.append(had_ms)

    thread = threading.Thread(target=send)
    in_line = len(leases._line)
    thread.start()
    while len(leases._line) == in_line:
        time.sleep(0.001)
    return thread


def test_a_lease_is_kept_for_a_send_in_line_due_soon_and_given_back_when_none_is(table):
    """Taken once, written once more when given back: not taken and given back for each
    send, each a write on the key's partition."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    calls: list[str] = []
    had: list[int] = []
    with hooked(
        leases._dynamodb.meta.client,
        (f"{BEFORE}BatchGetItem", lambda **_: calls.append("read")),
        (f"{BEFORE}UpdateItem", lambda **_: calls.append("write")),
    ):
        with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
            second = waiting_behind(leases, clock.now_ms() + LEASE_KEEP_MS // 2, had)
        second.join(10)
        assert had and calls == ["read", "write", "write"]  # taken, kept, given back
    assert lease_held_until(table) == 0
    assert leases._held == [] and leases._idle == []


def test_a_lease_kept_goes_to_its_send_as_its_place_comes_not_before(table):
    """A lease held through a send's wait for its slot is one no other send can use."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    had: list[int] = []
    with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
        place_ms = clock.now_ms() + LEASE_KEEP_MS - 5
        second = waiting_behind(leases, place_ms, had)
    second.join(10)
    assert had[0] >= place_ms - GRANT_AHEAD_MS


def test_a_lease_given_back_wakes_the_send_first_in_line_to_look_for_one(table):
    """The one lease in use, the next send due further off than a lease is kept for: the
    lease goes back to the table, and the send looks for one as its place nears, rather
    than sleep until its time is up."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    had: list[int] = []
    with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
        # its place 1 s off, its time 5 s: a loaded machine's pauses keep the two apart
        place_ms = clock.now_ms() + 1_000
        second = waiting_behind(leases, place_ms, had)
        time.sleep(2 * LEASE_KEEP_MS / 1000)  # it sleeps, until a lease is its own
    assert lease_held_until(table) == 0
    second.join(10)
    assert place_ms - LOOK_AHEAD_MS <= had[0] < place_ms + LOOK_AHEAD_MS


def test_an_invocation_done_gives_back_every_lease_it_kept(table, monkeypatch):
    """Two sends in flight and a third due soon: the first done keeps its lease for the
    third, the second gives its own back at once (one kept for the one send due soon is
    enough). Before the third is due, the invocation is done: the kept lease goes back
    then, not when the timer would have given it."""
    monkeypatch.setattr(tocsin.flow, "LEASE_KEEP_MS", 60_000)  # kept past the checks, however slow
    flow = Flow(key="two", parallelism=2)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    both = threading.Barrier(3, timeout=5)  # the two sends in flight, and the test
    third_in_line, first_done = threading.Event(), threading.Event()

    def send(first: bool) -> None:
        with leases.sending(clock.now_ms(), clock.now_ms() + 5_000):
            both.wait()
            third_in_line.wait(5)
            if not first:
                first_done.wait(5)
        if first:
            first_done.set()

    line = [threading.Thread(target=send, args=(first,)) for first in (True, False)]
    for thread in line:
        thread.start()
    both.wait()
    leases._line.append(_Waiter(clock.now_ms() + 30_000))  # a third, due soon, in line
    third_in_line.set()
    for thread in line:
        thread.join(10)
    untils = [int(item["until_ms"]) for item in lease_items(table, flow)]
    assert sorted(untils)[0] == 0 and sorted(untils)[1] > clock.now_ms()  # one kept
    leases._line.clear()  # it sends no more
    leases.close()
    assert [int(item["until_ms"]) for item in lease_items(table, flow)] == [0, 0]
    assert leases._held == [] and leases._idle == [] and leases._keeper is None


def test_a_send_waiting_while_its_invocation_holds_every_lease_reads_none(table):
    """The leases are all this invocation's, in use: the next is had when one is done, and
    reading the items meanwhile would find none free."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    reads: list[int] = []
    first_has, first_ends = threading.Event(), threading.Event()

    def first_send() -> None:
        with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
            first_has.set()
            first_ends.wait(10)

    with hooked(
        leases._dynamodb.meta.client, (f"{BEFORE}BatchGetItem", lambda **_: reads.append(1))
    ):
        holding = threading.Thread(target=first_send)
        holding.start()
        first_has.wait(10)
        threading.Timer(0.3, first_ends.set).start()
        with leases.sending(clock.now_ms(), clock.now_ms() + 5_000) as had_ms:
            assert first_ends.is_set() and had_ms > 0
        holding.join(10)
    assert reads == [1]
    leases.close()


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


def lease_items(table: str, flow: Flow) -> list[dict]:
    items = boto3.resource("dynamodb").Table(table)
    keys = [ledger_key(flow.key, f"{LEASE_PART}{i}") for i in range(flow.parallelism or 0)]
    return [items.get_item(Key=key).get("Item", {}) for key in keys]


def held_by_another(table: str, flow: Flow, i: int, until_ms: int) -> None:
    boto3.resource("dynamodb").Table(table).put_item(
        Item={**ledger_key(flow.key, f"{LEASE_PART}{i}"), "holder": "other", "until_ms": until_ms}
    )


def test_no_more_sends_than_the_parallelism_hold_a_lease_at_once(table):
    """Six sends at once through two leases: two at a time, each lease marked with its
    holder and its end until it is given back."""
    flow = Flow(key="two", parallelism=2)
    until_ms = clock.now_ms() + 60_000
    leases = Leases(table, flow, "invocation-1", until_ms)
    lock, in_flight, most, seen = threading.Lock(), [0], [0], []
    two_at_once = threading.Event()  # the first send waits for a second beside it

    def send() -> None:
        with leases.sending(clock.now_ms(), clock.now_ms() + 10_000):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
                if in_flight[0] == 2:
                    two_at_once.set()
                seen.append(lease_items(table, flow))
            two_at_once.wait(5)
            time.sleep(0.02)
            with lock:
                in_flight[0] -= 1

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    leases.close()
    assert most[0] == 2 and len(seen) == 6
    held = [item for items in seen for item in items if int(item.get("until_ms", 0))]
    assert {item["holder"] for item in held} == {"invocation-1"}
    assert {int(item["until_ms"]) for item in held} == {until_ms}
    assert {int(item["expires_at"]) for item in held} == {until_ms // 1000 + 2 * 86_400}
    assert [int(item["until_ms"]) for item in lease_items(table, flow)] == [0, 0]  # given back
    assert leases._held == [] and not leases._line and not leases._idle


def test_a_lease_another_invocation_holds_is_waited_for_until_its_time_is_over(table):
    flow = Flow(key="one", parallelism=1)
    other_until = clock.now_ms() + 300
    held_by_another(table, flow, 0, other_until)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    with leases.sending(clock.now_ms(), clock.now_ms() + 5_000) as had_ms:
        assert had_ms > other_until
        assert lease_items(table, flow)[0]["holder"] == "invocation-1"


def test_a_free_lease_is_taken_past_one_another_invocation_holds(table):
    flow = Flow(key="two", parallelism=2)
    held_by_another(table, flow, 0, clock.now_ms() + 60_000)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
        assert [item["holder"] for item in lease_items(table, flow)] == ["other", "invocation-1"]


def test_a_send_takes_one_lease_for_itself_not_every_free_one(table):
    flow = Flow(key="three", parallelism=3)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
        holders = [item.get("holder") for item in lease_items(table, flow)]
    assert holders == ["invocation-1", None, None]


def test_a_send_that_has_no_lease_by_its_time_gives_up_and_leaves_the_line(table):
    flow = Flow(key="one", parallelism=1)
    held_by_another(table, flow, 0, clock.now_ms() + 60_000)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    by_ms = clock.now_ms() + 200
    with pytest.raises(NoLeaseInTime), leases.sending(clock.now_ms(), by_ms):
        pass
    assert clock.now_ms() >= by_ms
    assert not leases._line and leases._held == []
    assert lease_items(table, flow)[0]["holder"] == "other"


def test_a_lease_taken_by_another_between_its_read_and_its_write_is_passed_by(table):
    """Both read lease 0 free; the other invocation's write is first: this one's is
    refused, and it takes lease 1."""
    flow = Flow(key="two", parallelism=2)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    raced: list[int] = []
    reads: list[int] = []

    def other_first(**_: object) -> None:
        if not raced:
            raced.append(1)
            held_by_another(table, flow, 0, clock.now_ms() + 60_000)

    with (
        hooked(
            leases._dynamodb.meta.client,
            (f"{BEFORE}BatchGetItem", lambda **_: reads.append(1)),
            (f"{BEFORE}UpdateItem", other_first),
        ),
        leases.sending(clock.now_ms(), clock.now_ms() + 1_000),
    ):
        assert [item["holder"] for item in lease_items(table, flow)] == ["other", "invocation-1"]
    assert len(reads) == 1  # in the same look, not after a pause


def test_a_lease_whose_time_ran_out_and_was_taken_is_not_given_back_for_its_new_holder(table):
    flow = Flow(key="one", parallelism=1)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 100)
    with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
        time.sleep(0.15)  # its invocation's time is over: another takes the lease
        later = Leases(table, flow, "invocation-2", clock.now_ms() + 60_000)
        with later.sending(clock.now_ms(), clock.now_ms() + 1_000):
            pass
        held_by_another(table, flow, 0, clock.now_ms() + 60_000)
    assert lease_items(table, flow)[0]["holder"] == "other"
    assert int(lease_items(table, flow)[0]["until_ms"]) > clock.now_ms()


def test_the_leases_read_while_none_is_free_are_fewer_and_fewer(table, monkeypatch):
    """Held elsewhere for 1.2 s: read after pauses of 50 ms doubling to 400 (not every
    50 ms: 24 reads), back to 50 once one is had. A read that fails (DynamoDB's fault) is
    logged, with its key and the fault's name, and made again after a pause."""
    flow = Flow(key="one", parallelism=1)
    held_by_another(table, flow, 0, clock.now_ms() + 1_200)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    pauses: list[int] = []
    read_at: list[float] = []
    log = io.StringIO()
    monkeypatch.setattr(logger.registered_handler, "stream", log)

    def read(**_: object) -> None:
        pauses.append(leases._pause_ms)  # the pause this read came after
        read_at.append(time.monotonic() * 1000)
        if len(pauses) == 1:
            raise ClientError({"Error": {"Code": "InternalServerError"}}, "BatchGetItem")

    with (
        hooked(leases._dynamodb.meta.client, (f"{BEFORE}BatchGetItem", read)),
        leases.sending(0, clock.now_ms() + 5_000),
    ):
        pass
    assert pauses[:4] == [LEASE_POLL_MS, 100, 200, LEASE_POLL_MAX_MS]
    assert set(pauses[4:]) <= {LEASE_POLL_MAX_MS}
    gaps = [later - earlier for earlier, later in itertools.pairwise(read_at)]
    assert all(gap >= pause - 2 for gap, pause in zip(gaps, pauses[1:], strict=True))  # waited
    assert leases._pause_ms == LEASE_POLL_MS
    [warning] = [json.loads(line) for line in log.getvalue().splitlines()]
    assert (warning["message"], warning["key"], warning["fault"]) == (
        "flow leases not read",
        "one",
        "ClientError",
    )


def test_the_sends_in_line_read_the_items_one_look_at_a_time(table):
    """Three sends in line, the one lease held elsewhere for 1 s, each read of the items
    slow (50 ms): never two reads at once, one for each send waiting."""
    flow = Flow(key="one", parallelism=1)
    held_by_another(table, flow, 0, clock.now_ms() + 1_000)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    reading = most = 0
    count = threading.Lock()
    had: list[int] = []

    def read(**_: object) -> None:
        nonlocal reading, most
        with count:
            reading += 1
            most = max(most, reading)
        time.sleep(0.05)
        with count:
            reading -= 1

    with hooked(leases._dynamodb.meta.client, (f"{BEFORE}BatchGetItem", read)):
        place_ms = clock.now_ms()
        line = [waiting_behind(leases, place_ms + i, had) for i in range(3)]
        for send in line:
            send.join(10)
    assert len(had) == 3  # each in turn, once the lease was free
    assert most == 1


def test_a_look_that_finds_every_lease_held_writes_nothing(table):
    """Each write to a key's lease items is one more on its hot partition."""
    flow = Flow(key="two", parallelism=2)
    for i in range(2):
        held_by_another(table, flow, i, clock.now_ms() + 60_000)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    writes: list[int] = []
    with (
        hooked(leases._dynamodb.meta.client, (f"{BEFORE}UpdateItem", lambda **_: writes.append(1))),
        pytest.raises(NoLeaseInTime),
        leases.sending(clock.now_ms(), clock.now_ms() + 300),
    ):
        pass
    assert writes == []


@pytest.mark.parametrize(
    "fault",
    [
        ClientError({"Error": {"Code": "ThrottlingException"}}, "UpdateItem"),
        EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com"),
    ],
)
def test_a_lease_dynamodb_fails_to_take_back_ends_with_its_invocation(table, fault):
    """The send it was for is done all the same: the lease ends at its invocation's end."""
    flow = Flow(key="one", parallelism=1)
    until_ms = clock.now_ms() + 60_000
    leases = Leases(table, flow, "invocation-1", until_ms)

    def give_back_fails(params: dict, **_: object) -> None:
        if params.get("ConditionExpression") == "holder = :me":
            raise fault

    with (
        hooked(leases._dynamodb.meta.client, (f"{BEFORE}UpdateItem", give_back_fails)),
    ):
        with leases.sending(clock.now_ms(), clock.now_ms() + 1_000):
            pass
        leases.close()
    assert int(lease_items(table, flow)[0]["until_ms"]) == until_ms


def test_when_the_first_in_line_gives_up_the_next_looks_in_its_place(table):
    """Only the first in line looks for a free lease; the others sleep until theirs is
    due. The first gives up: the next, now first, looks, and has the lease once it is
    free, long before its own time is up."""
    flow = Flow(key="one", parallelism=1)
    leases = Leases(table, flow, "invocation-1", clock.now_ms() + 60_000)
    had: list[int] = []
    first_by_ms, free_ms = clock.now_ms() + 150, clock.now_ms() + 400
    held_by_another(table, flow, 0, free_ms)

    def gives_up() -> None:
        with pytest.raises(NoLeaseInTime), leases.sending(0, first_by_ms):
            pass

    first = threading.Thread(target=gives_up)
    first.start()
    while not leases._line:
        time.sleep(0.005)
    with leases.sending(1, clock.now_ms() + 10_000) as had_ms:
        had.append(had_ms)
    first.join(10)
    assert free_ms < had[0] < free_ms + 5_000


def test_a_lease_taken_for_a_send_that_gave_up_meanwhile_goes_back_unused(table):
    """The first in line's time runs out while it takes a lease: no send of the
    invocation is near, and the lease goes back to the table within LEASE_KEEP_MS, not
    when the invocation ends."""
    leases = Leases(table, FLOW, "invocation-1", clock.now_ms() + 60_000)
    by_ms = clock.now_ms() + 100

    def read_slowly(**_: object) -> None:
        time.sleep(max(by_ms - clock.now_ms(), 0) / 1000)

    with (
        hooked(leases._dynamodb.meta.client, (f"{BEFORE}BatchGetItem", read_slowly)),
        pytest.raises(NoLeaseInTime),
        leases.sending(clock.now_ms(), by_ms),
    ):
        pass
    assert lease_items(table, FLOW)[0]["holder"] == "invocation-1"  # taken as it gave up
    deadline = time.monotonic() + 5
    while lease_held_until(table) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert lease_held_until(table) == 0
    assert leases._held == [] and leases._idle == []
