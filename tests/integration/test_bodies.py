"""A task's body (target and payload) stays on the task while small, and goes to the Bodies
table when large: a claim or a mark of a task whose payload is 10 KiB is one write unit,
not eleven, and the task still fires, reads and reschedules whole."""

import json

import boto3
import pytest

from tests.conftest import (
    all_schedules,
    call_api,
    stop_executions,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import clock
from tocsin.bodies import INLINE_BYTES, retired_at
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


def large_schedule(url: str, start_ms: int, payload: dict, **changes) -> dict:
    return {
        "id": "big",
        "expression": "rate(2 seconds)",
        "start_at": clock.to_iso(start_ms),
        "end_at": clock.to_iso(start_ms + 3_000),  # two occurrences
        "type": "webhook",
        "target": {"url": url},
        "payload": payload,
        **changes,
    }


def the_schedule(schedule_id: str = "big") -> dict:
    """The schedule's item as stored (not its leftovers records)."""
    [item] = [item for item in all_schedules() if item["schedule_id"] == schedule_id]
    return item


def test_a_large_schedules_body_is_kept_apart_once_and_its_occurrences_name_it(runtime, receiver):
    payload = {"blob": "s" * 2 * KIB}
    schedule = large_schedule(receiver.url, clock.now_ms() + 6_000, payload)
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201
    item = the_schedule()
    assert "payload" not in item and "target" not in item
    [apart] = bodies()  # the schedule's, and no occurrence's of its own
    assert item["body"] == apart["key"] and "expires_at" not in apart
    made = call_api(runtime, "GET", "/tasks?schedule=big")[1]["tasks"]
    assert len(made) == 2 and {stored(task["id"])["body"] for task in made} == {apart["key"]}
    assert call_api(runtime, "GET", "/schedules/big")[1]["payload"] == payload
    assert call_api(runtime, "GET", "/schedules")[1]["schedules"][0]["payload"] == payload
    assert call_api(runtime, "GET", f"/tasks/{made[0]['id']}")[1]["payload"] == payload
    for task in made:
        wait_for_status(task["id"], {"SUCCEEDED"})
    assert [json.loads(a.body) for a in receiver.received()] == [payload, payload]


def occurrence_writes(journal: list[dict], schedule_id: str) -> list[dict]:
    """What each transaction that made one of the schedule's occurrences was billed."""
    billed = []
    for write in journal:
        if write["action"] != "TransactWriteItems":
            continue
        first = write["body"]["TransactItems"][0]
        task = first.get("Put", {}).get("Item") or first.get("Update", {}).get("Key") or {}
        if task.get("task_id", {}).get("S", "").startswith(f"{schedule_id}."):
            billed.append(write["billed"])
    return billed


@pytest.mark.moto_tables
def test_a_large_schedules_occurrence_is_billed_what_a_small_ones_is(runtime, receiver):
    """Each occurrence is one transaction: its task, and its schedule's advance. With a
    10 KiB payload on the schedule's item, the advance was billed eleven units, twice (a
    transaction), and as much again in the owner index."""
    runtime.dynamodb.keep_journal()
    start = clock.now_ms() + 6_000
    large = large_schedule(receiver.url, start, {"blob": "x" * 10 * KIB})
    assert call_api(runtime, "POST", "/schedules", large)[0] == 201
    small = large_schedule(receiver.url, start, {"blob": "x"}, id="small")
    assert call_api(runtime, "POST", "/schedules", small)[0] == 201
    journal = runtime.dynamodb.journal()
    assert len(occurrence_writes(journal, "big")) == 2
    assert occurrence_writes(journal, "big") == occurrence_writes(journal, "small")
    stop_executions()


def test_a_schedules_body_no_revision_names_is_given_its_time_to_live(runtime, receiver):
    first, second = {"blob": "a" * 2 * KIB}, {"blob": "b" * 2 * KIB}
    schedule = large_schedule(receiver.url, clock.now_ms() + 3_600_000, first)
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201

    def by_payload() -> dict[str, dict]:
        return {json.loads(body["payload"])["blob"][0]: body for body in bodies()}

    before = clock.now_ms()
    assert call_api(runtime, "PATCH", "/schedules/big", {"payload": second})[0] == 200
    after = clock.now_ms()
    kept = by_payload()
    assert the_schedule()["body"] == kept["b"]["key"] and "expires_at" not in kept["b"]
    config = settings()
    assert retired_at(config, before) <= kept["a"]["expires_at"] <= retired_at(config, after)
    assert call_api(runtime, "PATCH", "/schedules/big", {"state": "PAUSED"})[0] == 200
    assert by_payload() == kept  # the same body: neither written nor retired
    assert call_api(runtime, "PATCH", "/schedules/big", {"payload": first})[0] == 200
    kept = by_payload()  # named again: written again, without its time to live
    assert the_schedule()["body"] == kept["a"]["key"] and "expires_at" not in kept["a"]
    assert "expires_at" in kept["b"]
    assert call_api(runtime, "DELETE", "/schedules/big")[0] == 200
    assert all("expires_at" in body for body in bodies())


def test_a_schedule_refused_for_another_body_writes_none(runtime, receiver):
    start = clock.now_ms() + 3_600_000
    first = large_schedule(receiver.url, start, {"blob": "a" * 2 * KIB})
    assert call_api(runtime, "POST", "/schedules", first)[0] == 201
    other = large_schedule(receiver.url, start, {"blob": "c" * 2 * KIB})
    assert call_api(runtime, "POST", "/schedules", other)[0] == 409
    assert [json.loads(body["payload"]) for body in bodies()] == [first["payload"]]
