"""Flow control: a flow's tasks share its rate and its parallelism across every executor
invocation at once; none fires early, none is lost or sent twice, and each delay shows
(tocsin.flow)."""

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any
from unittest import mock

import pytest

from tests.conftest import (
    call_api,
    hooked,
    runtime_with,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tests.integration.test_exactly_once import tables
from tests.integration.test_letting_go import refusal, watched_executor
from tocsin import aws, clock, gate
from tocsin.measure import most_within
from tocsin.settings import settings


def flowing(url: str, due_ms: int, task_id: str, **flow: object) -> dict:
    return webhook_task(url, due_ms, task_id) | {"flow": {"key": "one-host", **flow}}


def submitted(runtime, url: str, due_ms: int, ids: list[str], **flow: object) -> None:
    """Submit each task apart: each is its own execution and invocation."""
    for task_id in ids:
        assert call_api(runtime, "POST", "/tasks", flowing(url, due_ms, task_id, **flow))[0] == 201


def ended(ids: list[str]) -> list[dict]:
    return [wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60) for task_id in ids]


def through_a_slow_receiver(
    runtime, receiver, answer_s: float, count: int, parallelism: int
) -> tuple[int, list[dict]]:
    """`count` tasks due together, each submitted apart, through a flow of `parallelism`
    to a receiver that answers `answer_s` after each request: once they ended, each
    arrived once and that many were in flight at most. Their due time, and the tasks."""
    receiver.answer_after_s = answer_s
    due = clock.now_ms() + 2500
    ids = [f"slow{i}" for i in range(count)]
    submitted(runtime, receiver.url, due, ids, parallelism=parallelism)
    tasks = ended(ids)
    assert receiver.most_in_flight == parallelism
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)
    return due, tasks


def early_in_a_second(after_ms: int) -> int:
    """A due time 100 ms into the second after `after_ms`: tasks due within the next 900 ms
    are in one due window, one batch of the finder's."""
    return after_ms - after_ms % 1000 + 1100


def slot(task: dict) -> int:
    """When a stored task's flow let it go: its slot, if held, else its due time."""
    return int(task.get("planned_ms", task["due_ms"]))


def fired(task: dict) -> int:
    return int(task["due_ms"]) + int(task["lateness_ms"])


def ms(iso: str) -> int:
    return clock.to_ms(datetime.fromisoformat(iso))


def test_tasks_due_together_fire_at_their_flow_s_rate_in_due_order_none_early(runtime, receiver):
    """Eight tasks due in one millisecond, each submitted apart (each its own execution and
    invocation, planning at once): the flow's rate of 4 a second spaces their slots 260 ms
    apart (`spacing_us`), and no second holds more than 4 sends."""
    due = clock.now_ms() + 2500
    ids = [f"r{i}" for i in range(8)]
    submitted(runtime, receiver.url, due, ids, rate=4)

    tasks = ended(ids)
    slots = sorted(slot(t) for t in tasks)  # as planned, or later where a gate went late
    assert slots[0] >= due and all(b - a >= 260 for a, b in itertools.pairwise(slots))
    for task in tasks:  # lateness counts the hold (from its invocation's coming, if later)
        assert fired(task) >= slot(task) and 0 <= int(task["held_ms"]) <= fired(task) - due
        assert fired(task) == ms(task["fired_at"])
    arrivals = receiver.received()
    assert Counter(a.task_id for a in arrivals) == Counter(ids)
    assert min(a.arrival_ms for a in arrivals) >= due
    assert most_within([fired(t) for t in tasks], 1000) == 4


def wire_gates_late(late: Callable[[int], bool], late_s: float = 0.15) -> Any:
    """The wire's gates (which let requests go) `late_s` late where `late` says, by their
    order: a busy CPU."""
    calls, wait_until = itertools.count(), gate.wait_until

    def late_now_and_then(due_ms: int) -> int:
        fired_ms = wait_until(due_ms)
        if threading.current_thread().name == "wire" and late(next(calls)):
            time.sleep(late_s)
            return clock.now_ms()
        return fired_ms

    return mock.patch.object(gate, "wait_until", late_now_and_then)


def test_sends_that_go_late_take_later_slots_and_keep_to_the_rate(runtime, receiver):
    """A busy CPU lets one gate in three go 150 ms late (the wire's, which lets requests
    go): such a send takes the flow's next slot rather than bunching up with the next on
    time, so no second holds more than the rate's 5 sends, where they leave or where they
    arrive."""
    due = clock.now_ms() + 2500
    ids = [f"l{i}" for i in range(12)]
    with wire_gates_late(lambda call: call % 3 == 0):
        submitted(runtime, receiver.url, due, ids, rate=5)
        tasks = ended(ids)
    assert all(fired(t) >= slot(t) >= due for t in tasks)
    assert most_within([fired(t) for t in tasks], 1000) <= 5
    assert most_within([a.arrival_ms for a in receiver.received()], 1000) <= 5
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


def test_sends_whose_every_gate_goes_late_keep_to_the_rate_in_wide_slots(runtime, receiver):
    """A CPU so busy that every gate goes 400 ms late: each send misses its slot and the
    next, and its last try takes slots enough for twice that (`wide_slot`), so that going
    late again it goes beside no other send's. No second holds more than the rate's 5 (a
    last try written however late had made 6), and each task is sent once."""
    due = clock.now_ms() + 2500
    ids = [f"c{i}" for i in range(12)]
    with wire_gates_late(lambda call: True, late_s=0.4):
        submitted(runtime, receiver.url, due, ids, rate=5)
        tasks = ended(ids)
    assert all(fired(t) >= slot(t) >= due for t in tasks)
    assert most_within([fired(t) for t in tasks], 1000) <= 5
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


def test_a_send_late_past_its_wide_slot_is_handed_on_not_written_then(runtime, receiver):
    """One gate in three goes 1.2 s late, past the widest slot a last try takes (1 s): a
    send late for its slots is not written beside the sends in the slots after them, but
    handed on to an execution of its own, which sends it once."""
    due = clock.now_ms() + 2500
    ids = [f"w{i}" for i in range(12)]
    with wire_gates_late(lambda call: call % 3 == 0, late_s=1.2):
        submitted(runtime, receiver.url, due, ids, rate=5)
        tasks = ended(ids)
    assert any("h" in t["execution"].rsplit("-v1", 1)[1] for t in tasks)  # went on
    assert all(fired(t) >= slot(t) >= due for t in tasks)
    assert most_within([fired(t) for t in tasks], 1000) <= 5
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


def test_a_held_task_shows_when_it_will_fire_before_it_does(runtime, receiver):
    due = clock.now_ms() + 2500
    submitted(runtime, receiver.url, due, ["first", "second", "third"], rate=1)

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        views = [call_api(runtime, "GET", f"/tasks/{i}")[1] for i in ("first", "second", "third")]
        held = [v for v in views if v["status"] == "RUNNING" and v["planned_at"]]
        if held:
            break
        time.sleep(0.05)
    assert held, "no task showed when it will fire"
    [view] = held[-1:]
    assert view["flow"] == {"key": "one-host", "rate": 1, "parallelism": None}
    assert ms(view["planned_at"]) > due and clock.now_ms() < ms(view["planned_at"])
    ended = wait_for_status(view["id"], {"SUCCEEDED"})
    assert fired(ended) >= ms(view["planned_at"])


def test_a_held_task_ends_showing_the_slot_it_went_in(runtime, receiver):
    """Two tasks due together at a rate of 1 a second (slots 1,040 ms apart), the first
    answered 503 once: its retry takes a slot of the flow too, so one of them goes a slot
    later than it was planned to. Each ends showing the slot it went in, not its plan."""
    due = clock.now_ms() + 2500
    receiver.script_for["/a"] = [503]
    for task_id in ("a", "b"):
        task = flowing(f"{receiver.url}/{task_id}", due, task_id, rate=1)
        assert call_api(runtime, "POST", "/tasks", task)[0] == 201
    tasks = ended(["a", "b"])
    assert [int(t["attempts"]) for t in tasks] == [2, 1]
    first, second = sorted(slot(t) for t in tasks)
    assert first >= due and second - first >= 1040
    for task in tasks:  # a plan a slot off would show it 1,040 ms before it went
        assert 0 <= fired(task) - slot(task) < HALF_A_SLOT_MS, task
        shown = call_api(runtime, "GET", f"/tasks/{task['task_id']}")[1]["planned_at"]
        assert shown is None if "planned_ms" not in task else ms(shown) == slot(task)


HALF_A_SLOT_MS = 520


@pytest.mark.moto_tables  # the DynamoDB process's journal of writes
def test_sends_on_time_in_their_planned_slots_write_nothing_more_to_their_flow_s_ledger(
    runtime, receiver
):
    """Eight tasks of one flow (rate 10: slots 104 ms apart) in one batch: its invocation
    plans them in one write to the key's ledger, and each send on time goes in its slot,
    writing nothing more. Each had taken a slot of its own, a write a send on one item:
    a key's hot spot, since a partition takes 1,000 writes a second. A send late for its
    slot (a busy CPU) takes one or two more, past the plan's eight or off its grid (an
    atomic add each, and a conditional write when the key's slots are behind it)."""
    runtime.dynamodb.keep_journal()
    due = early_in_a_second(clock.now_ms() + 4000)  # its invocation ready well before
    ids = [f"w{i}" for i in range(8)]
    for task_id in ids:
        store_task(flowing(receiver.url, due, task_id, rate=10))
    assert runtime.run_finder()["executions"] == 1
    tasks = ended(ids)
    ledger = [  # every write to the key's items but its leases
        write["body"]
        for write in runtime.dynamodb.journal()
        if write["action"] == "UpdateItem"
        and write["body"]["Key"]["task_id"]["S"].startswith("~flow:")
        and not write["body"]["Key"]["task_id"]["S"].startswith("~flow:lease")
    ]
    plans = [w for w in ledger if w["UpdateExpression"].startswith("SET free_us = :free,")]
    moved = [t for t in tasks if slot(t) >= due + 8 * 104 or (slot(t) - due) % 104]
    assert len(plans) == 1
    assert len(moved) < len(tasks)  # most in the slots planned
    assert len(ledger) - len(plans) <= 2 * 2 * len(moved)
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


@pytest.mark.moto_tables  # the DynamoDB process's journal of writes
def test_an_invocation_that_comes_late_plans_its_sends_from_when_it_can_send(runtime, receiver):
    """Eight tasks of one flow (rate 10) due a second ago: their slots start once the
    invocation can send (PLAN_LEAD_MS after its plan), not at their due time, which has
    passed: each send goes in its planned slot, and none takes another (a ticket)."""
    runtime.dynamodb.keep_journal()
    due = clock.now_ms() - 1000
    ids = [f"p{i}" for i in range(8)]
    for task_id in ids:
        store_task(flowing(receiver.url, due, task_id, rate=10))
    planned_after = clock.now_ms()
    assert runtime.run_finder()["executions"] == 1
    tasks = ended(ids)
    tickets = [
        write
        for write in runtime.dynamodb.journal()
        if write["action"] == "UpdateItem"
        and write["body"]["Key"]["task_id"]["S"].startswith("~flow:rate")
        and write["body"]["UpdateExpression"].startswith("ADD")
    ]
    assert min(slot(t) for t in tasks) > planned_after
    assert len(tickets) <= 1  # a busy CPU may still miss a slot
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


@pytest.fixture
def short_invocations(runtime, monkeypatch):
    """Executors of 12 s and webhooks of 4 s at most: an invocation woken 2.5 s before its
    tasks' due time may send until about 2.5 s past it."""
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "1")
    settings.cache_clear()
    executor = runtime.functions["WebhookExecutorFunction"]
    runtime.functions["WebhookExecutorFunction"] = replace(executor, timeout_s=12)


@pytest.mark.parametrize("id_chars", [2, 64])
def test_a_slot_past_what_an_invocation_can_wait_for_is_handed_on_and_fires_at_it(
    runtime, receiver, short_invocations, id_chars
):
    """An executor of 12 s and webhooks of 4 s at most leave an invocation woken about 2 s
    before its task's due time room to send up to about 3 s past it: of seven tasks due
    together at a rate of 1 a second (slots 1,040 ms apart), the last, 6.24 s past, goes on
    to an execution that wakes for its slot (on a machine so busy that its invocation
    began more than 3 s late, it would not need to), and each fires once, at its slot (or
    later: a gate a busy machine lets go late takes a later one)."""
    due = clock.now_ms() + 2500
    ids = [f"{i}".rjust(id_chars, "h") for i in range(7)]  # the longest ids make the longest names
    submitted(runtime, receiver.url, due, ids, rate=1)
    tasks = ended(ids)

    last = max(tasks, key=slot)
    handed_on_to = int(last["execution"].rsplit("-v1h", 1)[1])  # an execution of its own
    assert slot(last) >= handed_on_to >= due + 6240  # past what its first could send in
    assert int(last["held_ms"]) >= slot(last) - due  # the whole hold, not its last leg's
    assert all(fired(task) >= slot(task) for task in tasks)
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


def test_a_send_that_gets_no_lease_in_its_invocation_s_time_goes_on_in_another(
    runtime, receiver, short_invocations
):
    """A receiver that takes 0.8 s to answer, one send in flight at a time, and invocations
    that may wait for a lease about 2.5 s past their tasks' due time: the later of five
    tasks go on to executions of their own, and each is sent once, one at a time."""
    _, tasks = through_a_slow_receiver(runtime, receiver, 0.8, 5, parallelism=1)
    assert any("h" in t["execution"].rsplit("-v1", 1)[1] for t in tasks)  # went on
    assert all(int(t["attempts"]) == 1 for t in tasks)


def test_a_retry_its_flow_cannot_let_go_in_time_goes_on_in_an_execution_of_its_own(
    runtime, receiver, short_invocations, monkeypatch
):
    """One invocation, one send in flight at a time: the first task's send answers 500 at
    once, and the eight after it each hold the flow's lease until the webhooks' 1 s
    timeout. The first task's retry waits in line behind them until its invocation's time
    for a lease is up, about 3 s past their due time (8 s before its turn would come): it
    goes back RETRYING with the one attempt it made, and an execution of its own sends it
    again. No task is sent more often than its attempts say: counted once every task has
    ended (the eight's retries too), as a task read RETRYING may be sent again before the
    receiver is read."""
    # The eight timeouts at one host would hold it back (tocsin.holds: test_holds.py), and
    # the first task's retry would wait on the hold, not on the lease.
    monkeypatch.setenv("HOST_HOLD_FAILURES", "0")
    settings.cache_clear()
    # Due soon enough that the invocation starts at once: its time is then about 3 s past
    # the first due time, whenever the finder's wake plan would have woken it.
    due = early_in_a_second(clock.now_ms() + 2000)
    ids = [f"t{i}" for i in range(9)]
    receiver.script_for["/t0"] = [500]  # then 200
    for task_id in ids[1:]:
        receiver.script_for[f"/{task_id}"] = ["hang"]
    for i, task_id in enumerate(ids):
        url = f"{receiver.url}/{task_id}"
        store_task(flowing(url, due + 20 * i, task_id, parallelism=1))
    assert runtime.run_finder()["executions"] == 1
    first = wait_for_status("t0", {"SUCCEEDED", "FAILED"}, timeout_s=60)
    tasks = [first] + [wait_for_status(i, {"SUCCEEDED"}, timeout_s=60) for i in ids[1:]]

    sent = Counter(a.task_id for a in receiver.received())
    for task in tasks:
        assert sent[task["task_id"]] == int(task["attempts"])
    assert (first["status"], int(first["attempts"])) == ("SUCCEEDED", 2)
    assert "500" in json.loads(first["tries"])[0]["error"]
    assert "-v1r1" in first["execution"]  # an execution of its own


def test_a_flow_s_parallelism_holds_across_invocations(runtime, receiver):
    """Six tasks due together, each in an invocation of its own, at a receiver that takes
    0.4 s to answer: at most two are in flight at once, and all six arrive once."""
    due, tasks = through_a_slow_receiver(runtime, receiver, 0.4, 6, parallelism=2)
    assert min(a.arrival_ms for a in receiver.received()) >= due
    held = sorted(int(t["held_ms"]) for t in tasks)
    assert held[1] < 400 <= held[2]  # the first pair took its leases, the next waited for them
    assert held[-1] >= 2 * 400  # the last pair waited for two answers


def test_a_batch_of_one_flow_shares_its_limits(receiver):
    """Tasks the finder packs into batches of its own making: one invocation plans them all
    in one write to the ledger, and sends no more at once than the flow's parallelism."""
    with runtime_with({"BurstSendsPerInvocation": "2"}) as runtime:
        receiver.answer_after_s = 0.2
        due = clock.now_ms() + 4000
        ids = [f"b{i}" for i in range(8)]
        for task_id in ids:
            store_task(flowing(receiver.url, due, task_id, rate=10, parallelism=1))
        assert runtime.run_finder()["executions"] >= 2
        tasks = ended(ids)

    slots = sorted(slot(t) for t in tasks)  # as planned, or later as they waited for the lease
    assert slots[0] >= due and all(b - a >= 104 for a, b in itertools.pairwise(slots))
    assert receiver.most_in_flight == 1
    assert Counter(a.task_id for a in receiver.received()) == Counter(ids)


def test_the_stack_s_host_flow_limits_webhooks_that_name_none_and_shows_on_each(receiver):
    """HostFlowParallelism 1: four webhook tasks that name no flow, due together and each
    sent by an invocation of its own, reach the receiver one at a time, and each task's view
    shows the flow its host gave it; a task that names its own keeps it."""
    with runtime_with({"HostFlowParallelism": "1"}) as runtime:
        receiver.answer_after_s = 0.3
        due = clock.now_ms() + 2500
        ids = [f"p{i}" for i in range(4)]
        for task_id in ids:
            task = webhook_task(receiver.url, due, task_id)
            assert call_api(runtime, "POST", "/tasks", task)[0] == 201
        own = flowing(receiver.url, due, "own", parallelism=2)
        assert call_api(runtime, "POST", "/tasks", own)[0] == 201
        ended([*ids, "own"])
        views = {i: call_api(runtime, "GET", f"/tasks/{i}")[1] for i in [*ids, "own"]}

    host = {"key": "host:127.0.0.1", "rate": None, "parallelism": 1}
    assert all(views[i]["flow"] == host for i in ids)
    assert views["own"]["flow"] == {"key": "one-host", "rate": None, "parallelism": 2}
    mine = sorted((a.arrival_ms, a.task_id) for a in receiver.received() if a.task_id in ids)
    assert all(b - a >= 300 for (a, _), (b, _) in itertools.pairwise(mine))  # one at a time
    assert Counter(a.task_id for a in receiver.received()) == Counter([*ids, "own"])


def test_sends_that_wait_for_a_lease_go_in_due_order(receiver):
    """Six tasks due 20 ms apart, in one invocation, one in flight at a time at a receiver
    that takes 0.2 s to answer: each waits in line for the lease and they arrive in the
    order they were due."""
    with runtime_with() as runtime:
        receiver.answer_after_s = 0.2
        due = early_in_a_second(clock.now_ms() + 4000)
        ids = [f"o{i}" for i in range(6)]
        for i, task_id in enumerate(ids):
            store_task(flowing(receiver.url, due + 20 * i, task_id, parallelism=1))
        assert runtime.run_finder()["executions"] == 1
        ended(ids)
    assert [a.task_id for a in sorted(receiver.received(), key=lambda a: a.arrival_ms)] == ids
    assert receiver.most_in_flight == 1


def test_a_task_without_a_flow_writes_no_slot(runtime, receiver):
    due = clock.now_ms() + 2000
    assert call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, due, "plain"))[0] == 201
    task = wait_for_status("plain", {"SUCCEEDED"})
    assert not {"flow", "planned_at", "planned_ms", "held_ms"} & set(task)
    assert stored("plain")["status"] == "SUCCEEDED"


def test_a_schedules_flow_is_each_occurrences_and_an_edit_that_drops_it_drops_it_there(
    runtime, receiver
):
    start = clock.now_ms() + 10_000  # the first occurrences are tasks, waiting
    schedule = {
        "id": "paced",
        "expression": "rate(2 seconds)",
        "start_at": clock.to_iso(start),
        "type": "webhook",
        "target": {"url": receiver.url},
        "flow": {"key": "one-host", "rate": 2},
    }
    status, view = call_api(runtime, "POST", "/schedules", schedule)
    assert status == 201 and view["flow"] == {"key": "one-host", "rate": 2, "parallelism": None}
    first = f"paced.{start}"
    assert json.loads(stored(first)["flow"]) == {"key": "one-host", "rate": 2}
    status, edited = call_api(runtime, "PATCH", "/schedules/paced", {"flow": None})
    assert status == 200 and edited["flow"] is None
    assert "flow" not in stored(first) and int(stored(first)["version"]) == 2
    refused = {**schedule, "id": "unpaced", "flow": {"key": "one-host", "rate": 0}}
    status, reply = call_api(runtime, "POST", "/schedules", refused)
    assert (status, reply["error"]["field"]) == (400, "flow.rate")
    assert call_api(runtime, "DELETE", "/schedules/paced")[0] == 200


def test_a_fault_in_a_flow_s_ledger_is_retried_by_fire_and_the_rest_of_the_batch_is_sent(
    runtime, receiver, no_backoff
):
    """The flow's ledger refuses a retry its slot (throttled, past botocore's retries): its
    invocation fails with what Fire retries (TableUnavailable), not a name that sends the
    whole batch to the dead-letter queue. The batch's task without a flow is sent all the
    same, and Fire's retry sends the flow's task again, in a slot planned anew."""
    due = early_in_a_second(clock.now_ms() + 2000)
    store_task(webhook_task(f"{receiver.url}/plain", due, "plain"))
    store_task(flowing(f"{receiver.url}/held", due + 10, "held", rate=5))
    receiver.script_for["/held"] = [500]  # its retry takes a slot of its own
    refused = {"left": aws.MAX_ATTEMPTS + 1}  # botocore's tries of one write, all refused

    def refuse_the_slot(request, **_: object):
        asked = json.loads(request.body)
        key = asked.get("Key", {}).get("task_id", {}).get("S", "")
        taking = asked.get("UpdateExpression", "").startswith("ADD free_us")  # not the plan
        if key.startswith("~flow:rate:") and taking and refused["left"]:
            refused["left"] -= 1
            return refusal(request, "ProvisionedThroughputExceededException", 400)
        return None

    with (
        watched_executor(runtime) as seen,
        hooked(tables(), ("before-send.dynamodb.UpdateItem", refuse_the_slot)),
    ):
        assert runtime.run_finder()["executions"] == 1
        plain, held = (wait_for_status(i, {"SUCCEEDED"}) for i in ("plain", "held"))
        assert runtime.wait_for_executions(30)  # the retry's invocation seen to its end
    assert [i.error for i in seen] == ["TableUnavailable", None]
    assert seen[0].after["plain"]["status"] == "SUCCEEDED"  # sent in the first invocation
    assert int(plain["attempts"]) == 1
    # Its 500 came in the first invocation (its second attempt's slot refused) or, where
    # its first attempt was late for its slot and that slot was refused, in the retry's.
    assert 1 <= int(held["attempts"]) <= 2
    assert Counter(a.task_id for a in receiver.received()) == {"plain": 1, "held": 2}
    assert [e.status for e in runtime.executions()] == ["SUCCEEDED"]  # no dead letter
