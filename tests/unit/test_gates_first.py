"""In the embedded runtime a DynamoDB call waits for a gate about to let go, and only then."""

import json
import threading
import time

import pytest

from tocsin import clock, gate
from tocsin.local import gates_first
from tocsin.local.gates_first import GatesFirst

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python


def _sleeping_gate(first: GatesFirst, due_ms: int) -> tuple[threading.Thread, list[int]]:
    let_go: list[int] = []

    def sleep_and_record(due: int) -> int:  # recorded before the gate's deadline is dropped
        let_go.append(gate.wait_until(due))
        return let_go[-1]

    thread = threading.Thread(target=first.gate(sleep_and_record), args=(due_ms,))
    thread.start()
    while not first._due and not let_go:  # until the gate is asleep (or, late, let go)
        time.sleep(0.001)
    return thread, let_go


def test_a_call_waits_until_the_imminent_gate_has_let_go(monkeypatch):
    monkeypatch.setattr(gates_first, "WINDOW_MS", 1_000)
    monkeypatch.setattr(gates_first, "MAX_WAIT_S", 5.0)
    first = GatesFirst()
    due = clock.now_ms() + 300  # within the window
    thread, let_go = _sleeping_gate(first, due)
    first.yield_to_gates()
    assert let_go and let_go[0] >= due  # the call went on only once the gate had let go
    thread.join()


def test_a_gate_far_off_holds_nothing_up(monkeypatch):
    monkeypatch.setattr(gates_first, "MAX_WAIT_S", 30.0)  # a wrong wait would outlast the gate
    first = GatesFirst()
    due = clock.now_ms() + 3_000
    thread, let_go = _sleeping_gate(first, due)
    first.yield_to_gates()
    assert not let_go  # the gate still sleeps
    thread.join()
    assert let_go[0] >= due
    assert not first._due  # its deadline is forgotten once it let go


def test_a_call_waits_for_the_action_of_a_gate_that_just_let_go(monkeypatch):
    """The bookkeeping that waited for a gate does not all rush in as it lets go, into the
    way of the webhook request that the gate let through."""
    monkeypatch.setattr(gates_first, "WINDOW_MS", 1_000)
    monkeypatch.setattr(gates_first, "ACTION_MS", 300)
    monkeypatch.setattr(gates_first, "MAX_WAIT_S", 5.0)
    first = GatesFirst()
    thread, let_go = _sleeping_gate(first, clock.now_ms() + 50)
    first.yield_to_gates()
    assert let_go and clock.now_ms() >= let_go[0] + 300
    thread.join()
    time.sleep(0.35)  # the action's time is over: calls go at once again
    began = clock.now_ms()
    first.yield_to_gates()
    assert clock.now_ms() - began < 200


def test_a_call_sleeps_through_a_run_of_gates_in_one_go(monkeypatch):
    """Gates 10 ms apart for 200 ms, each within the window of the one before: a held call
    goes on after the last one, having slept a few times, not once per gate."""
    sleeps: list[float] = []
    real_sleep = time.sleep

    def counted_sleep(seconds: float) -> None:
        if threading.current_thread() is caller:  # the gates' own sleeps are not counted
            sleeps.append(seconds)
        real_sleep(seconds)

    caller = threading.current_thread()
    monkeypatch.setattr(gates_first, "MAX_WAIT_S", 5.0)

    first = GatesFirst()
    start = clock.now_ms() + 300  # every gate asleep before the call
    gates = [_sleeping_gate(first, start + 10 * i) for i in range(21)]
    time.sleep(max(start - 5 - clock.now_ms(), 0) / 1000)  # the call comes as the run begins
    monkeypatch.setattr(gates_first.time, "sleep", counted_sleep)
    first.yield_to_gates()
    monkeypatch.undo()
    assert all(let_go for _, let_go in gates)  # every gate had let go first
    assert len(sleeps) <= 3
    for thread, _ in gates:
        thread.join()


def test_gates_that_keep_coming_hold_a_call_no_longer_than_the_cap():
    """A steady stream (a gate every 10 ms for a second and a half) is one endless run: a
    call goes on after MAX_WAIT_S, while gates are still due, so that the claims of the
    batches to come keep up with the tasks due."""
    first = GatesFirst()
    start = clock.now_ms() + 300
    gates = [_sleeping_gate(first, start + 10 * i) for i in range(150)]
    time.sleep(max(start - clock.now_ms(), 0) / 1000)
    called = time.monotonic()
    first.yield_to_gates()
    held_s = time.monotonic() - called  # from the call: a late start of it is not a wait
    assert any(not let_go for _, let_go in gates)  # it did not wait for the run's end
    assert held_s >= gates_first.MAX_WAIT_S  # it waited its cap
    for thread, _ in gates:
        thread.join()


def _request(**body: object) -> dict:
    """A DynamoDB request as botocore's before-call hook is given it."""
    return {"body": json.dumps(body).encode()}


def test_a_flow_s_ledger_calls_go_at_once_the_rest_wait(monkeypatch):
    """A send waits for its flow's ledger before its gate: those calls are the gates' own
    and do not wait for the gates; a call on a task does, as any call."""
    monkeypatch.setattr(gates_first, "WINDOW_MS", 1_000)
    monkeypatch.setattr(gates_first, "MAX_WAIT_S", 5.0)
    first = GatesFirst()
    due = clock.now_ms() + 500
    thread, let_go = _sleeping_gate(first, due)
    ledger = [
        _request(TableName="tasks", Key={"task_id": {"S": "~flow:rate:one-host"}}),
        _request(RequestItems={"tasks": {"Keys": [{"task_id": {"S": "~flow:lease0:k"}}]}}),
    ]
    for request in ledger:
        first.yield_to_gates(params=request)
        assert not let_go  # at once: the gate still sleeps
    task = _request(TableName="tasks", Key={"task_id": {"S": "a-task"}})
    first.yield_to_gates(params=task)
    assert let_go and let_go[0] >= due
    thread.join()
