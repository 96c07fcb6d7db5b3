"""A task's body (target and payload) stays on the task while small, and goes to the Bodies
table when large: a claim or a mark of a task whose payload is 10 KiB is one write unit,
not eleven, and the task still fires, reads and reschedules whole."""

import json

import boto3
import pytest

from tests.conftest import call_api, stored, wait_for_status, webhook_task
from tocsin import clock
from tocsin.bodies import INLINE_BYTES
from tocsin.settings import settings

KIB = 1024


def bodies() -> list[dict]:
    return boto3.resource("dynamodb").Table(settings().bodies_table).scan()["Items"]


def test_a_large_body_is_kept_apart_and_the_task_fires_whole(runtime, receiver):
    payload = {"blob": "x" * 10 * KIB}
    body = webhook_task(receiver.url, clock.now_ms() + 1500, "large", payload)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    item = stored("large")
    assert "payload" not in item and "target" not in item
    [apart] = bodies()
    assert item["body"] == apart["key"] and json.loads(apart["payload"]) == payload
    wait_for_status("large", {"SUCCEEDED"})
    [arrival] = receiver.received()
    assert json.loads(arrival.body) == payload  # the executor read the body and sent it
    status, task = call_api(runtime, "GET", "/tasks/large")
    assert status == 200 and task["payload"] == payload and task["target"]["url"]


@pytest.mark.moto_tables
def test_a_task_with_a_large_body_is_one_write_unit_a_mark(runtime, receiver):
    """The claim and the final mark of a task whose payload is 10 KiB: one unit each on
    the Tasks table (eleven each when the payload was on the task)."""
    runtime.dynamodb.keep_journal()
    body = webhook_task(receiver.url, clock.now_ms() + 1500, "large", {"blob": "x" * 10 * KIB})
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    wait_for_status("large", {"SUCCEEDED"})
    updates = [
        write["billed"]["table"]
        for write in runtime.dynamodb.journal()
        if write["action"] == "UpdateItem" and write["body"]["TableName"] == runtime.tasks_table
    ]
    assert len(updates) >= 2 and set(updates) == {1}


def test_a_small_body_stays_on_its_task(runtime, receiver):
    payload = {"n": 1}
    body = webhook_task(receiver.url, clock.now_ms() + 3_600_000, "small", payload)
    assert len(json.dumps(payload)) + len(receiver.url) < INLINE_BYTES
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    item = stored("small")
    assert "body" not in item and json.loads(item["payload"]) == payload and bodies() == []


def test_a_reschedule_moves_the_body_with_its_size(runtime, receiver):
    """A small payload rescheduled large goes apart as the next version's body; a large one
    rescheduled small comes back onto the task."""
    body = webhook_task(receiver.url, clock.now_ms() + 3_600_000, "moving", {"n": 1})
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    large = {"blob": "y" * 5 * KIB}
    status, task = call_api(runtime, "PATCH", "/tasks/moving", {"payload": large})
    assert status == 200 and task["payload"] == large and task["version"] == 2
    item = stored("moving")
    assert "payload" not in item and item["body"].startswith("moving:2:")
    assert call_api(runtime, "GET", "/tasks/moving")[1]["payload"] == large
    status, task = call_api(runtime, "PATCH", "/tasks/moving", {"payload": {"n": 3}})
    assert status == 200 and task["payload"] == {"n": 3}
    item = stored("moving")
    assert "body" not in item and json.loads(item["payload"]) == {"n": 3}


def test_a_schedules_large_occurrence_fires_with_its_body(runtime, receiver):
    payload = {"blob": "s" * 2 * KIB}
    schedule = {
        "id": "big",
        "expression": "rate(2 seconds)",
        "start_at": clock.to_iso(clock.now_ms() + 6_000),
        "end_at": clock.to_iso(clock.now_ms() + 7_000),
        "type": "webhook",
        "target": {"url": receiver.url},
        "payload": payload,
    }
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201
    runtime.run_finder()
    [occurrence] = call_api(runtime, "GET", "/tasks?schedule=big")[1]["tasks"]
    assert "body" in stored(occurrence["id"])
    wait_for_status(occurrence["id"], {"SUCCEEDED"})
    assert [json.loads(a.body) for a in receiver.received()] == [payload]
