"""Bulk actions (tocsin.bulk): every one of an owner's tasks a filter matches cancelled (and
each schedule carrying its tags deleted) or retried, by a job that goes on after the
request, idempotent under a client token, seen only by its owner."""

import time

from tests.conftest import call_api, runtime_with, stored, wait_for_status, webhook_task
from tests.integration.test_schedules import every_two_seconds, occurrences
from tocsin import clock
from tocsin.bulk import run_job
from tocsin.settings import settings


def finished(runtime, bulk_id: str, principal: str = "alice", timeout_s: float = 30) -> dict:
    """The job once DONE, its queue polled as Lambda's mapping would (the tests' runtimes
    run no poller)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runtime.poll_queues()
        status, job = call_api(runtime, "GET", f"/bulk/{bulk_id}", None, principal)
        assert status == 200
        if job["state"] == "DONE":
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def tagged(url: str, due_ms: int, task_id: str, **tags: str) -> dict:
    return webhook_task(url, due_ms, task_id) | {"tags": tags}


def test_a_bulk_cancel_of_a_users_tasks_and_schedules_leaves_none_to_fire(runtime, receiver):
    due = clock.now_ms() + 15_000  # claimed (RUNNING, no longer cancellable) seconds before
    for i in range(3):
        call_api(runtime, "POST", "/tasks", tagged(receiver.url, due, f"mine-{i}", user="42"))
    call_api(runtime, "POST", "/tasks", tagged(receiver.url, due, "other-user", user="7"))
    call_api(runtime, "POST", "/tasks", tagged(receiver.url, due, "bobs", user="42"), "bob")
    receiver.status_for["/down"] = 503  # a task RETRYING is cancelled as well
    waits = tagged(f"{receiver.url}/down", clock.now_ms() + 1000, "waiting", user="42")
    call_api(runtime, "POST", "/tasks", waits | {"retry": {"min_backoff_s": 60}})
    wait_for_status("waiting", {"RETRYING"})
    schedule = every_two_seconds(receiver.url, due, "reminders", tags={"user": "42"})
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201
    made = [task["id"] for task in occurrences(runtime, "reminders")]
    assert made

    cancel = {"action": "cancel", "filter": {"tags": {"user": "42"}}}
    status, dry = call_api(runtime, "POST", "/bulk", cancel | {"dry_run": True})
    assert status == 202 and dry["state"] == "RUNNING"
    counted = finished(runtime, dry["bulk_id"])
    assert counted["matched"] == 4 + len(made) and counted["done"] == 0  # nothing done
    assert stored("mine-0")["status"] == "PENDING"

    token = cancel | {"client_token": "user-42-deleted"}
    status, job = call_api(runtime, "POST", "/bulk", token)
    assert status == 202
    again_status, again = call_api(runtime, "POST", "/bulk", token)  # idempotent
    assert again_status == 200 and again["bulk_id"] == job["bulk_id"]
    assert call_api(runtime, "GET", f"/bulk/{job['bulk_id']}", None, "bob")[0] == 404
    done = finished(runtime, job["bulk_id"])
    # the schedule is deleted first, which cancels its occurrences: the tasks' pages meet
    # them cancelled already
    assert done["done"] == done["matched"] == 4 and done["failed"] == 0
    assert done["schedules_deleted"] == 1
    assert call_api(runtime, "GET", "/schedules/reminders")[0] == 404
    for task_id in ["mine-0", "mine-1", "mine-2", "waiting", *made]:
        assert stored(task_id)["status"] == "CANCELLED"

    wait_for_status("other-user", {"SUCCEEDED"}, timeout_s=60)
    wait_for_status("bobs", {"SUCCEEDED"}, timeout_s=60)  # another owner's: untouched
    time.sleep(3)  # past the schedule's next occurrences
    sent = {a.task_id for a in receiver.received() if a.status == 200}
    assert sent == {"other-user", "bobs"}


def test_a_bulk_request_names_what_is_wrong_and_writes_nothing(runtime):
    cases = [
        ({"action": "cancel", "filter": {}}, "filter"),
        ({"action": "cancel", "filter": {"status": ["SUCCEEDED"]}}, "filter"),
        ({"action": "archive", "filter": {"tags": {"a": "b"}}}, "action"),
        ({"action": "cancel", "filter": {"tags": {"a b": "c"}}}, "filter.tags"),
    ]
    for body, field in cases:
        status, reply = call_api(runtime, "POST", "/bulk", body)
        assert status == 400 and reply["error"]["field"].startswith(field), (body, reply)
    token = {"client_token": "t-1", "filter": {"tags": {"a": "b"}}}
    assert call_api(runtime, "POST", "/bulk", token | {"action": "cancel"})[0] == 202
    status, reply = call_api(runtime, "POST", "/bulk", token | {"action": "retry"})
    assert status == 409 and reply["error"]["field"] == "client_token"
    assert call_api(runtime, "GET", "/bulk/" + "0" * 32)[0] == 404


def test_a_bulk_retry_sends_failed_tasks_again_through_the_recovery_rate(receiver):
    rate, count = 2, 6
    with runtime_with({"HostRecoveryRate": str(rate)}) as runtime:
        receiver.status_for["/gone"] = 410  # fails for good, at once
        due = clock.now_ms() + 1000
        ids = [f"failed-{i}" for i in range(count)]
        for task_id in ids:
            body = tagged(f"{receiver.url}/gone", due, task_id, batch="b")
            call_api(runtime, "POST", "/tasks", body)
        for task_id in ids:
            wait_for_status(task_id, {"FAILED"})
        receiver.status_for["/gone"] = 200
        retry = {"action": "retry", "filter": {"tags": {"batch": "b"}, "status": ["FAILED"]}}
        status, job = call_api(runtime, "POST", "/bulk", retry)
        assert status == 202
        assert finished(runtime, job["bulk_id"])["done"] == count
        for task_id in ids:
            assert int(wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)["version"]) == 2
    again = sorted(a.arrival_ms for a in receiver.received() if a.status == 200)
    assert len(again) == count
    assert again[-1] - again[0] >= (count - 1) * 1000 / rate * 0.9  # spaced at the rate


def test_a_bulk_cancel_out_of_time_among_schedules_goes_on_from_the_last_it_deleted(
    runtime, receiver
):
    """Each schedule deleted cancels its occurrences, which takes a while: a job that runs
    short of the bulk function's time within a page of schedules writes where it reached,
    and the next run deletes the rest, each counted once."""
    due = clock.now_ms() + 30_000
    for schedule_id in ("a", "b", "c", "untagged"):
        tags = {} if schedule_id == "untagged" else {"tags": {"user": "42"}}
        body = every_two_seconds(receiver.url, due, schedule_id, **tags)
        assert call_api(runtime, "POST", "/schedules", body)[0] == 201
    status, job = call_api(
        runtime, "POST", "/bulk", {"action": "cancel", "filter": {"tags": {"user": "42"}}}
    )
    assert status == 202
    # Lambda's clock, as the function's context reads it: the job's first look and the first
    # schedule find time enough, the second does not
    left = iter([60_000, 60_000, 0, 0])
    run_job(job["bulk_id"], settings(), lambda: next(left))
    _, partway = call_api(runtime, "GET", f"/bulk/{job['bulk_id']}")
    assert (partway["state"], partway["schedules_deleted"]) == ("RUNNING", 1)
    assert call_api(runtime, "GET", "/schedules/a")[0] == 404
    assert call_api(runtime, "GET", "/schedules/b")[0] == 200

    done = finished(runtime, job["bulk_id"])  # queued again: the next run goes on
    assert done["schedules_deleted"] == 3
    for schedule_id in ("b", "c"):
        assert call_api(runtime, "GET", f"/schedules/{schedule_id}")[0] == 404
    assert call_api(runtime, "GET", "/schedules/untagged")[0] == 200
