"""A target that fails for now: the task goes back RETRYING, due at its next attempt, and an
execution of its own tries it then, with the same idempotency key and the attempt's number;
a receiver's Retry-After sets that time, its "do not retry" ends the task, and a cancel
while it waits stands (tocsin.retry)."""

import json
import time
from datetime import datetime

from tests.conftest import call_api, hooked, stored, wait_for_status, webhook_task
from tocsin import aws, clock
from tocsin.settings import settings

# Backoffs longer than the executor waits in an invocation: each retry is RETRYING first.
LONG = {"min_backoff_s": 6, "max_backoff_s": 8}


def retried(url: str, due_ms: int, task_id: str, **retry: object) -> dict:
    return webhook_task(url, due_ms, task_id) | {"retry": retry}


def test_a_target_down_for_now_is_tried_again_by_an_execution_of_its_own(runtime, receiver):
    receiver.script_for["/down"] = [503]  # then 200
    due = clock.now_ms() + 2000
    body = retried(f"{receiver.url}/down", due, "down", **LONG)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    waiting = wait_for_status("down", {"RETRYING"})
    _, view = call_api(runtime, "GET", "/tasks/down")
    next_ms = clock.to_ms(datetime.fromisoformat(view["next_attempt_at"]))
    first = receiver.received()[0]
    assert 6000 <= next_ms - first.arrival_ms <= 8000 + 500  # its policy's backoff
    assert view["attempts"] == 1 and "503" in view["tries"][0]["error"]
    assert int(waiting["requeues"]) == 1  # its next execution's name is its own

    sent_log_reads = []  # its attempts are on its item: the retry need not read the sent log

    def count(params: dict, **_: object) -> None:
        sent_log_reads.append(params.get("TableName") == settings().sent_table)

    client = aws.resource("dynamodb").meta.client
    with hooked(client, ("before-parameter-build.dynamodb.GetItem", count)):
        done = wait_for_status("down", {"SUCCEEDED"}, timeout_s=60)
    assert not any(sent_log_reads)
    arrivals = receiver.received()
    assert [a.headers["Tocsin-Attempt"] for a in arrivals] == ["1", "2"]
    assert len({a.idempotency_key for a in arrivals}) == 1
    assert arrivals[1].arrival_ms >= next_ms  # never early, for a retry either
    assert int(done["attempts"]) == 2 and "next_attempt_ms" not in done
    assert done["execution"].endswith("-v1r1")


def test_retry_after_sets_the_next_attempt(runtime, receiver):
    receiver.script_for["/busy"] = [503]
    receiver.headers_for["/busy"] = {"Retry-After": "7"}
    body = retried(f"{receiver.url}/busy", clock.now_ms() + 2000, "busy", min_backoff_s=0.5)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    waiting = wait_for_status("busy", {"RETRYING"})
    first = receiver.received()[0]
    assert 7000 <= int(waiting["next_attempt_ms"]) - first.arrival_ms <= 7500
    assert int(waiting["throttled"]) == 1  # a 503 with Retry-After: counted in age only
    wait_for_status("busy", {"SUCCEEDED"}, timeout_s=60)


def test_a_receiver_that_says_not_to_retry_fails_the_task_at_once(runtime, receiver):
    receiver.status_for["/gone"] = 503
    receiver.headers_for["/gone"] = {"Tocsin-No-Retry": "1"}
    body = webhook_task(f"{receiver.url}/gone", clock.now_ms() + 2000, "gone")
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    failed = wait_for_status("gone", {"FAILED"})
    assert failed["exhausted_by"] == "permanent" and int(failed["attempts"]) == 1
    assert "not to retry" in json.loads(failed["error"])["Cause"]
    assert len(receiver.received()) == 1


def test_a_retry_past_the_tasks_age_ends_it(runtime, receiver):
    receiver.status_for["/later"] = 503
    receiver.headers_for["/later"] = {"Retry-After": "120"}
    body = retried(f"{receiver.url}/later", clock.now_ms() + 2000, "later", max_age_s=60)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    failed = wait_for_status("later", {"FAILED"})
    assert failed["exhausted_by"] == "age" and int(failed["attempts"]) == 1
    _, view = call_api(runtime, "GET", "/tasks/later")
    assert view["exhausted_by"] == "age"


def test_a_task_cancelled_while_retrying_is_never_sent_again(runtime, receiver):
    receiver.status_for["/down"] = 503
    body = retried(f"{receiver.url}/down", clock.now_ms() + 2000, "stop", **LONG)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    waiting = wait_for_status("stop", {"RETRYING"})
    status, cancelled = call_api(runtime, "DELETE", "/tasks/stop")
    assert status == 200 and cancelled["status"] == "CANCELLED"
    time.sleep(max(0, int(waiting["next_attempt_ms"]) - clock.now_ms()) / 1000 + 3)
    assert runtime.wait_for_executions(30)
    assert len(receiver.received()) == 1 and stored("stop")["status"] == "CANCELLED"


def test_a_task_rescheduled_while_retrying_starts_over_as_its_next_version(runtime, receiver):
    receiver.script_for["/down"] = [503]  # then 200
    body = retried(f"{receiver.url}/down", clock.now_ms() + 2000, "moved", **LONG)
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    wait_for_status("moved", {"RETRYING"})
    change = {"due_at": clock.to_iso(clock.now_ms() + 3000)}
    status, moved = call_api(runtime, "PATCH", "/tasks/moved", change)
    assert status == 200 and moved["status"] == "PENDING" and moved["version"] == 2
    assert moved["attempts"] == 0 and moved["next_attempt_at"] is None and moved["tries"] is None
    done = wait_for_status("moved", {"SUCCEEDED"}, timeout_s=60)
    assert int(done["version"]) == 2 and int(done["attempts"]) == 1
    assert [a.idempotency_key for a in receiver.received()] == ["moved:1", "moved:2"]
