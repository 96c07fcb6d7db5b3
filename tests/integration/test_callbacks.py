"""Outcome callbacks: once a task ends, the target it names for that outcome is told, once,
by a task of its own; a callback's failure is its own (tocsin.callbacks)."""

import json
import time
from unittest import mock

import pytest

from tests.conftest import (
    ENDED,
    TEST_ATTEMPT,
    call_api,
    claim_as,
    dead_letters,
    hooked,
    stop_executions,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import aws, clock
from tocsin.callbacks import callback_item
from tocsin.fire.writes import TableUnavailable
from tocsin.index_keys import LOOK_AFTER_MS
from tocsin.local.dynamodb_process import Fault
from tocsin.model import TaskStatus
from tocsin.reconcile import MAX_REQUEUES, reconcile
from tocsin.settings import settings
from tocsin.store import TaskStore


def with_callbacks(url: str, due_ms: int, task_id: str, **extra: object) -> dict:
    """A webhook task to `url`/task that tells `url`/done of success, `url`/failed of failure."""
    return {
        **webhook_task(f"{url}/task", due_ms, task_id),
        "on_success": {"type": "webhook", "target": {"url": f"{url}/done"}},
        "on_failure": {"type": "webhook", "target": {"url": f"{url}/failed"}},
        **extra,
    }


def arrived(receiver, path: str) -> list:
    return [a for a in receiver.received() if a.path == path]


def test_a_task_that_succeeds_tells_its_on_success_target_once(runtime, receiver):
    due = clock.now_ms() + 2500
    status, view = call_api(runtime, "POST", "/tasks", with_callbacks(receiver.url, due, "ok"))
    assert status == 201 and view["on_success"]["target"]["url"] == f"{receiver.url}/done"

    callback = wait_for_status("ok.1.callback", {"SUCCEEDED"})
    time.sleep(0.3)  # room for a second callback, if there were one
    [told] = arrived(receiver, "/done")
    assert arrived(receiver, "/failed") == []
    task = stored("ok")
    outcome = json.loads(told.body)
    assert outcome == {
        "task_id": "ok",
        "version": 1,
        "status": "SUCCEEDED",
        "due_at": clock.to_iso(due),
        "attempts": 1,
        "fired_at": task["fired_at"],
        "lateness_ms": int(task["lateness_ms"]),
        "result": json.loads(task["result"]),
    }
    assert told.idempotency_key == "ok:1:callback"
    assert callback["callback_of"] == "ok" and callback["owner"] == task["owner"]
    _, seen = call_api(runtime, "GET", "/tasks/ok.1.callback")
    assert seen["callback_of"] == "ok" and seen["payload"] == outcome


def test_a_task_that_fails_after_its_retries_tells_its_on_failure_target(
    runtime, receiver, no_backoff
):
    receiver.status_for["/task"] = 503
    body = with_callbacks(receiver.url, clock.now_ms() + 2000, "bad", max_attempts=2)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201

    wait_for_status("bad.1.callback", {"SUCCEEDED"})
    [told] = arrived(receiver, "/failed")
    assert arrived(receiver, "/done") == []
    outcome = json.loads(told.body)
    assert outcome["status"] == "FAILED" and outcome["attempts"] == 2
    assert outcome["exhausted_by"] == "attempts"  # told once it ended, not while it retried
    assert "503" in outcome["error"]["message"] and "result" not in outcome
    assert stored("bad")["status"] == "FAILED"


def test_a_cancelled_task_tells_no_one(runtime, receiver):
    # due far enough out that a loaded machine cancels it before its execution claims it
    due = clock.now_ms() + 6000
    body = with_callbacks(receiver.url, due, "off")
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    assert call_api(runtime, "DELETE", "/tasks/off")[0] == 200

    time.sleep(max(0, due + 1500 - clock.now_ms()) / 1000)  # past its due time, and more
    assert receiver.received() == []
    assert call_api(runtime, "GET", "/tasks/off.1.callback")[0] == 404


def test_a_callback_that_fails_is_dead_lettered_and_its_task_stays_succeeded(
    runtime, receiver, no_backoff
):
    receiver.status_for["/done"] = 500
    body = with_callbacks(receiver.url, clock.now_ms() + 2000, "told")
    body["on_success"]["retry"] = {"max_attempts": 3, "min_backoff_s": 0.5}
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201

    callback = wait_for_status("told.1.callback", {"FAILED"})
    assert int(callback["attempts"]) == 3 and len(arrived(receiver, "/done")) == 3
    assert stored("told")["status"] == "SUCCEEDED"
    letters = dead_letters(runtime)
    assert [(letter["task_id"], letter["version"]) for letter in letters] == [
        ("told.1.callback", 1)
    ]


def test_a_retried_invocation_sends_neither_the_task_nor_its_callback_twice(runtime, receiver):
    """Fire's first invocation finishes its batch, then fails as a whole (its reply lost,
    say): Step Functions retries it, and the retry finds the task ended."""
    invoke, failed = runtime.invoke, []

    def first_fails_after(logical_id: str, event: dict) -> object:
        reply = invoke(logical_id, event)
        if logical_id == "WebhookExecutorFunction" and not failed:
            failed.append(event)
            raise TableUnavailable("injected: the reply was lost")
        return reply

    with mock.patch.object(runtime, "invoke", first_fails_after):
        body = with_callbacks(receiver.url, clock.now_ms() + 2000, "again")
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
        wait_for_status("again.1.callback", {"SUCCEEDED"})
        assert runtime.wait_for_executions(30)
    assert failed
    assert [a.path for a in receiver.received()] == ["/task", "/done"]


@pytest.mark.moto_tables
def test_a_final_mark_that_committed_unanswered_makes_one_callback_and_fails_nothing(
    runtime, receiver
):
    """The transaction of the final mark and its callback commits, then is answered with a
    500: botocore sends it again, the task's condition refuses it, and the executor reads
    its own first write in the refusal: the task ends once, with one callback, and the
    batch's invocation does not fail."""
    committed = Fault("InternalServerError", 500, 0.0, after_commit=True, when=("ok.1",), first=1)
    runtime.dynamodb.set_faults("TransactWriteItems", [committed], seed=1)
    body = with_callbacks(receiver.url, clock.now_ms() + 2000, "ok")
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201

    wait_for_status("ok.1.callback", {"SUCCEEDED"})
    assert runtime.dynamodb.usage()["injected"]["InternalServerError"] == 1
    assert [a.path for a in receiver.received()] == ["/task", "/done"]
    assert dead_letters(runtime) == []
    assert stored("ok")["status"] == "SUCCEEDED"


def test_a_task_failed_as_stuck_by_the_reconciler_tells_its_on_failure_target(runtime, receiver):
    store_task(with_callbacks(receiver.url, clock.now_ms() + 60_000, "stuck"))
    for requeues in range(MAX_REQUEUES + 1):
        assert claim_as(f"gone-{requeues}", "stuck", ENDED).before
        check = int(stored("stuck")["due_ms"]) + LOOK_AFTER_MS + 1
        [(_, outcome)] = reconcile(settings(), check).tasks
    assert str(outcome) == "failed_stuck"

    wait_for_status("stuck.1.callback", {"SUCCEEDED"})
    stop_executions()  # those the requeues started, waiting for the task's due time
    [told] = receiver.received()
    outcome = json.loads(told.body)
    assert (told.path, outcome["status"], outcome["error"]["type"]) == (
        "/failed",
        "FAILED",
        "TaskStuck",
    )


INTERNAL = {"url": "http://169.254.169.254/hook"}  # the instance metadata address


@pytest.mark.parametrize(
    ("callback", "field"),
    [
        ({"type": "webhook", "target": INTERNAL}, "on_success.target.url"),
        ({"type": "pigeon", "target": {}}, "on_success.type"),
        ({"type": "sqs", "target": {"queue_url": 7}}, "on_success.target.queue_url"),
        (
            {"type": "webhook", "target": {"url": "https://example.com"}, "when": 1},
            "on_success.when",
        ),
    ],
)
def test_a_callback_that_cannot_be_sent_is_refused_naming_its_field(runtime, callback, field):
    body = {**webhook_task("https://example.com/task", clock.now_ms() + 60_000, "asked")}
    status, reply = call_api(runtime, "POST", "/tasks", {**body, "on_success": callback})
    assert (status, reply["error"]["field"]) == (400, field)
    assert call_api(runtime, "GET", "/tasks/asked")[0] == 404  # nothing written


def test_the_same_callbacks_again_are_the_same_task_and_others_conflict(runtime, receiver):
    body = with_callbacks(receiver.url, clock.now_ms() + 60_000, "twice")
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    assert call_api(runtime, "POST", "/tasks", body)[0] == 200
    other = {**body, "on_failure": {"type": "webhook", "target": {"url": f"{receiver.url}/x"}}}
    assert call_api(runtime, "POST", "/tasks", other)[0] == 409


def telling_schedule(url: str, schedule_id: str, expression: str, start_ms: int) -> dict:
    """A webhook schedule to `url`/task whose occurrences tell `url`/done of success."""
    return {
        "id": schedule_id,
        "expression": expression,
        "start_at": clock.to_iso(start_ms),
        "type": "webhook",
        "target": {"url": f"{url}/task"},
        "on_success": {"type": "webhook", "target": {"url": f"{url}/done"}},
    }


def test_each_occurrence_of_a_schedule_tells_its_own_outcome(runtime, receiver):
    start = clock.now_ms() + 3000
    schedule = telling_schedule(receiver.url, "tick", "rate(1 minute)", start)
    status, view = call_api(runtime, "POST", "/schedules", schedule)
    assert status == 201 and view["on_success"]["target"]["url"] == f"{receiver.url}/done"
    occurrence = f"tick.{start}"

    wait_for_status(f"{occurrence}.1.callback", {"SUCCEEDED"})
    [told_of] = arrived(receiver, "/done")
    assert json.loads(told_of.body)["task_id"] == occurrence
    assert told_of.idempotency_key == f"{occurrence}:1:callback"
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 200  # the same request
    other = {**schedule, "on_failure": schedule["on_success"]}
    assert call_api(runtime, "POST", "/schedules", other)[0] == 409


def test_an_edit_that_drops_a_schedules_callback_drops_it_from_its_unclaimed_occurrences(
    runtime, receiver
):
    start = clock.now_ms() + 20_000  # the first occurrences are tasks, waiting (on CI too)
    schedule = telling_schedule(receiver.url, "quiet", "rate(2 seconds)", start)
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201
    first = f"quiet.{start}"
    assert "callbacks" in stored(first)
    status, edited = call_api(runtime, "PATCH", "/schedules/quiet", {"on_success": None})
    assert status == 200 and edited["on_success"] is None
    assert "callbacks" not in stored(first) and int(stored(first)["version"]) == 2

    wait_for_status(first, {"SUCCEEDED"}, timeout_s=35)
    time.sleep(0.5)
    assert arrived(receiver, "/done") == []
    assert call_api(runtime, "DELETE", "/schedules/quiet")[0] == 200


def test_a_schedules_callback_that_cannot_be_sent_is_refused_naming_its_field(runtime):
    schedule = {
        "expression": "rate(1 hour)",
        "type": "webhook",
        "target": {"url": "https://example.com/task"},
        "on_failure": {"type": "webhook", "target": INTERNAL},
    }
    status, reply = call_api(runtime, "POST", "/schedules", schedule)
    assert (status, reply["error"]["field"]) == (400, "on_failure.target.url")


def test_a_final_mark_cancelled_for_a_conflict_is_tried_again_and_ends_its_task_with_one_callback(
    runtime, receiver
):
    """DynamoDB cancels a transaction that meets another on one of its items (or its rate)
    with a 400, which botocore does not retry: the executor tries it again, as it does a
    throttled write, rather than fail the batch."""
    client, conflicts = aws.client("dynamodb"), []

    def conflict_once(params: dict, **_: object) -> None:
        if not conflicts:
            conflicts.append(params)
            reasons = [{"Code": "TransactionConflict"}, {"Code": "None"}]
            error = {"Error": {"Code": "TransactionCanceledException"}}
            raise client.exceptions.TransactionCanceledException(
                error | {"CancellationReasons": reasons}, "TransactWriteItems"
            )

    with hooked(client, ("before-parameter-build.dynamodb.TransactWriteItems", conflict_once)):
        body = with_callbacks(receiver.url, clock.now_ms() + 2000, "ok")
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
        wait_for_status("ok.1.callback", {"SUCCEEDED"})
    assert conflicts and [a.path for a in receiver.received()] == ["/task", "/done"]
    assert dead_letters(runtime) == []


def test_a_callback_whose_mark_committed_late_and_whose_writer_died_is_started_by_the_reconciler(
    runtime, receiver
):
    """The reconciler reads each due entry once, from where it read last: a callback placed
    where it had read already (its mark committed late, its writer then killed) would never
    be read. It is placed where its writer's writes end instead."""
    store_task(with_callbacks(receiver.url, clock.now_ms() - 1000, "late"))
    claim_as("gone", "late")
    asked_ms = clock.now_ms()  # the mark's first try
    written_by_ms = asked_ms + 60_000  # its invocation's end
    fields = {"attempts": 1, "result": json.dumps({"status": 200})}
    owed = callback_item(stored("late"), TaskStatus.SUCCEEDED, fields, asked_ms, written_by_ms,
                         settings())  # fmt: skip
    reconcile(settings(), asked_ms + LOOK_AFTER_MS + 5_000)  # reads past `asked_ms`
    store = TaskStore(settings().tasks_table)
    assert store.finish("late", 1, TEST_ATTEMPT, TaskStatus.SUCCEEDED, fields, owed)
    # ...and the writer died before it started the callback
    outcomes = reconcile(settings(), written_by_ms + LOOK_AFTER_MS + 1).tasks
    assert ("late.1.callback", "started_late") in [(t, str(o)) for t, o in outcomes]
    wait_for_status("late.1.callback", {"SUCCEEDED"})
    assert [a.path for a in receiver.received()] == ["/done"]
