"""Recurring schedules through the real API handler, finder, state machine and executors on
the embedded runtime: occurrences fire once each, never early, at their milliseconds; edits,
pauses, resumes and deletes take effect on occurrences already made tasks; racing finders
and failed or ambiguous writes still make one task per occurrence."""

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from moto.core.botocore_stubber import MockRawResponse

from tests.conftest import (
    all_schedules,
    all_tasks,
    assert_on_time,
    call_api,
    hooked,
    runtime_with,
    serve,
    stop,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import Client, aws, clock, schedules
from tocsin.local.dynamodb_process import Fault
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.occurrences import REFUSED_IN_A_ROW, materialize_due
from tocsin.schedule_store import SCHEDULE_DUE_INDEX
from tocsin.settings import settings

RATE_MS = 2000
EVENTS = Path(__file__).parents[2] / "events"


def every_two_seconds(url: str, start_ms: int, schedule_id: str = "tick", **changes: Any):
    return {
        "id": schedule_id,
        "expression": "rate(2 seconds)",
        "start_at": clock.to_iso(start_ms),
        "type": "webhook",
        "target": {"url": url},
        "payload": {"n": 1},
        **changes,
    }


def occurrences(runtime, schedule_id: str, principal: str = "alice") -> list[dict]:
    status, page = call_api(
        runtime, "GET", f"/tasks?schedule={schedule_id}&limit=100", None, principal
    )
    assert status == 200
    return page["tasks"]


@pytest.mark.slow
def test_a_rate_fires_each_occurrence_once_never_early_at_its_millisecond(runtime, receiver):
    start = clock.now_ms() + 12_000  # still ahead when the reply says when it is next (on CI)
    status, schedule = call_api(
        runtime, "POST", "/schedules", every_two_seconds(receiver.url, start)
    )
    assert status == 201
    assert schedule["next_due_at"] == clock.to_iso(start)
    assert receiver.wait_for(4, timeout_s=60)
    fired = receiver.received()[:4]
    expected = [clock.to_iso(start + k * RATE_MS) for k in range(4)]
    due = {task["id"]: task["due_at"] for task in occurrences(runtime, "tick")}
    assert [due[arrival.task_id] for arrival in fired] == expected
    assert_on_time([arrival.arrival_ms - (start + k * RATE_MS) for k, arrival in enumerate(fired)])
    assert [t for t, n in Counter(a.task_id for a in receiver.received()).items() if n > 1] == []
    assert {task["id"] for task in occurrences(runtime, "tick")} >= {a.task_id for a in fired}
    # the same request again is the schedule as stored; another body is a conflict
    again = call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    assert again[0] == 200 and again[1]["id"] == "tick"
    other = every_two_seconds(receiver.url, start, payload={"n": 2})
    assert call_api(runtime, "POST", "/schedules", other)[0] == 409
    status, read = call_api(runtime, "GET", "/schedules/tick")
    assert read["last_fired_at"] is not None and read["occurrences"] >= 4


@pytest.mark.slow
def test_edit_pause_resume_and_delete_act_on_occurrences_already_tasks(runtime, receiver):
    start = clock.now_ms() + 10_000  # the first wakes 3 s on at the earliest: after the PATCH
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    made = occurrences(runtime, "tick")
    assert len(made) >= 5  # the look-ahead's occurrences are tasks already
    # the first may be claimed by now, on a machine slow enough (DynamoDB Local, loaded)
    pending = [t for t in made if t["status"] == "PENDING"]
    assert len(pending) >= 4

    status, edited = call_api(runtime, "PATCH", "/schedules/tick", {"payload": {"n": 2}})
    assert status == 200 and edited["revision"] == 2
    rewritten = []
    for task in pending:  # same times, new payload, next version: the old execution's claim fails
        status, read = call_api(runtime, "GET", f"/tasks/{task['id']}")
        if read["version"] == task["version"] and read["status"] != "PENDING":
            assert read["payload"] == {"n": 1}  # claimed before the PATCH (a slow machine)
            continue
        assert status == 200 and read["payload"] == {"n": 2}
        assert read["version"] == task["version"] + 1
        rewritten.append(read)
    assert len(rewritten) >= len(pending) - 1
    first = wait_for_status(rewritten[0]["id"], {"SUCCEEDED"})
    assert json.loads(first["payload"]) == {"n": 2}

    status, paused = call_api(runtime, "PATCH", "/schedules/tick", {"state": "PAUSED"})
    assert status == 200 and paused["state"] == "PAUSED" and paused["next_due_at"] is None
    after_pause = occurrences(runtime, "tick")
    assert not [t for t in after_pause if t["status"] == "PENDING"]
    fired_before = {a.task_id for a in receiver.received()}
    time.sleep(2 * RATE_MS / 1000)
    claimed = {t["id"] for t in after_pause if t["status"] in ("RUNNING", "SUCCEEDED")}
    assert {a.task_id for a in receiver.received()} <= fired_before | claimed

    status, resumed = call_api(runtime, "PATCH", "/schedules/tick", {"state": "ENABLED"})
    assert status == 200 and resumed["state"] == "ENABLED"
    resumed_at = clock.now_ms()
    assert receiver.wait_for(len(receiver.received()) + 1, timeout_s=15)
    latest = max(receiver.received(), key=lambda a: a.arrival_ms)
    assert int(stored(latest.task_id)["due_ms"]) >= resumed_at - 1000  # from now on, not before

    status, deleted = call_api(runtime, "DELETE", "/schedules/tick")
    assert status == 200 and deleted["id"] == "tick"
    assert call_api(runtime, "GET", "/schedules/tick")[0] == 404
    left = occurrences(runtime, "tick")  # its tasks stay listed, the unclaimed ones cancelled
    assert left and not [t for t in left if t["status"] == "PENDING"]


def test_changing_the_expression_cancels_what_no_longer_occurs(runtime, receiver):
    start = clock.now_ms() + 10_000  # inside the look-ahead, not yet woken in this test
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    before = {t["id"] for t in occurrences(runtime, "tick")}
    assert len(before) >= 5
    change = {"expression": "rate(4 seconds)", "start_at": clock.to_iso(start + 1000)}
    status, _ = call_api(runtime, "PATCH", "/schedules/tick", change)
    assert status == 200
    after = occurrences(runtime, "tick")
    live = [t for t in after if t["status"] == "PENDING"]
    dues = sorted(clock.to_ms(datetime.fromisoformat(t["due_at"])) for t in live)
    assert all(b - a == 4000 for a, b in pairwise(dues))
    cancelled = {t["id"] for t in after if t["status"] == "CANCELLED"}
    # but those claimed before the change came (the first, on a machine slow enough)
    claimed = {t["id"] for t in after if t["status"] in ("RUNNING", "SUCCEEDED")}
    assert cancelled and cancelled == before - {t["id"] for t in live} - claimed
    retention_s = settings().retention_days * 86_400  # then deleted by TTL, as any final task
    assert all(int(stored(i)["expires_at"]) >= start // 1000 + retention_s - 60 for i in cancelled)


def test_two_finders_at_once_make_one_task_per_occurrence(runtime, receiver):
    # beyond the look-ahead at creation, so the API makes no task: the finders do
    lookahead_ms = settings().lookahead_s * 1000
    start = clock.now_ms() + lookahead_ms + 2000
    for n in range(4):
        body = every_two_seconds(receiver.url, start + n * 100, f"race{n}")
        assert call_api(runtime, "POST", "/schedules", body)[0] == 201
    assert all_tasks() == []
    later = clock.now_ms() + 8000  # as the finder would see it 8 s from now
    # Both finders read which schedules are due before either turns one, as two runs at once
    # on AWS can: each shard's query waits for the other finder's (on a busy machine one
    # finder once turned a schedule before the other had read it, and found three).
    # The query's parameters are tagged before botocore builds the request from them.
    both_read, reports, waited = threading.Barrier(2, timeout=30), [], Counter[str]()

    def tag(params: dict, context: dict, **_: object) -> None:
        context["schedules_due"] = params.get("IndexName") == SCHEDULE_DUE_INDEX

    def pair(context: dict, **_: object) -> None:
        if context.get("schedules_due"):
            waited[threading.current_thread().name] += 1
            both_read.wait()

    def finder() -> None:
        reports.append(materialize_due(settings(), later)[1])

    threads = [threading.Thread(target=finder, name=f"finder{i}") for i in range(2)]
    client = aws.resource("dynamodb").meta.client
    hooks = ("before-parameter-build.dynamodb.Query", tag), ("after-call.dynamodb.Query", pair)
    with hooked(client, *hooks):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert waited == {"finder0": settings().shards, "finder1": settings().shards}
    assert [r["schedules_due"] for r in reports] == [4, 4]  # each finder found all four
    tasks = all_tasks()
    per_schedule = Counter(t["schedule_id"] for t in tasks)
    expected = (later + lookahead_ms - start) // RATE_MS + 1
    assert all(abs(count - expected) <= 1 for count in per_schedule.values()), per_schedule
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    assert sum(r["occurrences_made"] for r in reports) == len(tasks)  # none made twice
    for item in all_schedules():
        assert int(item["occurrences"]) == per_schedule[item["schedule_id"]]


@pytest.mark.moto_tables
@pytest.mark.parametrize("after_commit", [False, True])
def test_a_failed_or_ambiguous_write_makes_no_task_twice_and_skips_none(
    runtime, receiver, after_commit
):
    lookahead_ms = settings().lookahead_s * 1000
    start = clock.now_ms() + lookahead_ms + 2000
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    later = clock.now_ms() + 6000
    # every transaction fails (or commits, then answers 500) for one finder run
    share = 1.0 if not after_commit else 0.5
    runtime.dynamodb.set_faults(
        "TransactWriteItems", [Fault("InternalServerError", 500, share, after_commit)], seed=3
    )
    _, report = materialize_due(settings(), later)  # the schedule fails, the run goes on
    assert runtime.dynamodb.usage()["injected"]["InternalServerError"] >= 1
    # refused every time: the schedule fails; committed, then refused: botocore's retries
    # meet the moved schedule and the finder reads it again (unless every retry is refused)
    assert report["schedule_errors"] in ({0, 1} if after_commit else {1})
    runtime.dynamodb.set_faults("TransactWriteItems", [], seed=3)
    made = {t["task_id"] for t in all_tasks()}
    schedule = all_schedules()[0]
    # nothing half-written: every task made is one the schedule has moved past
    assert all(int(t.rsplit(".", 1)[1]) < int(schedule["next_ms"]) for t in made)
    materialize_due(settings(), later)
    dues = sorted(int(t["due_ms"]) for t in all_tasks())
    assert dues == list(range(start, dues[-1] + 1, RATE_MS))  # each occurrence, once
    assert int(all_schedules()[0]["occurrences"]) == len(dues)


def _conflict(request: AWSPreparedRequest) -> AWSResponse:
    """DynamoDB's answer to a transaction cancelled for a conflict."""
    body = {
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "message": "Transaction cancelled",
        "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}],
    }
    return AWSResponse(request.url, 400, {}, MockRawResponse(json.dumps(body).encode()))


def test_a_schedule_whose_transactions_keep_being_cancelled_holds_back_no_dispatch(
    runtime, receiver
):
    """Every transaction of the schedule cancelled for a conflict (as under throttling): it
    is tried REFUSED_IN_A_ROW times with pauses, not again and again; counted and left for
    the next run; and the finder still starts the task that is due. Then it goes on."""
    lookahead_ms = settings().lookahead_s * 1000
    call_api(
        runtime,
        "POST",
        "/schedules",
        every_two_seconds(receiver.url, clock.now_ms() + lookahead_ms + 2000),
    )
    store_task(webhook_task(receiver.url, clock.now_ms() + 15_000, "plain"))
    cancelled: list[int] = []

    def cancel(request: AWSPreparedRequest, **_: object) -> AWSResponse:
        cancelled.append(1)
        return _conflict(request)

    time.sleep(2.5)  # its first occurrence now within the look-ahead
    with hooked(aws.client("dynamodb"), ("before-send.dynamodb.TransactWriteItems", cancel)):
        report = runtime.run_finder()
    assert report["schedule_errors"] == 1 and report["occurrences_made"] == 0
    assert len(cancelled) == REFUSED_IN_A_ROW
    assert report["started"] == 1 and stored("plain")["status"] == "PENDING"
    assert runtime.run_finder()["occurrences_made"] >= 1  # the next run, writes accepted


def test_the_tasks_a_schedule_made_before_its_writes_were_refused_are_counted(runtime, receiver):
    """Its first occurrence written, every later write cancelled: the schedule is an error
    for this run, and the task it did make is counted as made (a second finder that wins
    the schedule's later writes is this case)."""
    lookahead_ms = settings().lookahead_s * 1000
    start = clock.now_ms() + lookahead_ms + 2000
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    calls: list[int] = []

    def cancel_after_the_first(request: AWSPreparedRequest, **_: object) -> AWSResponse | None:
        calls.append(1)
        return None if len(calls) == 1 else _conflict(request)

    hook = ("before-send.dynamodb.TransactWriteItems", cancel_after_the_first)
    with hooked(aws.client("dynamodb"), hook):
        written, report = materialize_due(settings(), clock.now_ms() + 6000)
    assert report["schedule_errors"] == 1
    assert report["occurrences_made"] == 1 == len(all_tasks())
    assert written == [t["task_id"] for t in all_tasks()]


def test_a_schedules_retry_policy_is_each_occurrences_and_an_edit_changes_it(runtime, receiver):
    policy = {"max_attempts": 9, "max_age_s": 600, "min_backoff_s": 2.0, "max_backoff_s": 60.0}
    body = every_two_seconds(receiver.url, clock.now_ms() + 20_000, retry=policy)  # unclaimed
    status, schedule = call_api(runtime, "POST", "/schedules", body)
    assert status == 201 and schedule["retry"] == policy and schedule["max_attempts"] == 9
    made = occurrences(runtime, "tick")
    assert made and all(task["retry"] == policy for task in made)
    status, edited = call_api(runtime, "PATCH", "/schedules/tick", {"max_attempts": 4})
    assert status == 200 and edited["retry"] == policy | {"max_attempts": 4}
    assert all(task["retry"]["max_attempts"] == 4 for task in occurrences(runtime, "tick"))


def test_each_owner_sees_only_their_schedules_and_occurrences(runtime, receiver):
    start = clock.now_ms() + 30_000
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start), "alice")
    assert call_api(runtime, "GET", "/schedules/tick", None, "bob")[0] == 404
    assert call_api(runtime, "GET", "/schedules/tick/upcoming", None, "bob")[0] == 404
    assert call_api(runtime, "PATCH", "/schedules/tick", {"payload": 1}, "bob")[0] == 404
    assert call_api(runtime, "DELETE", "/schedules/tick", None, "bob")[0] == 404
    assert call_api(runtime, "GET", "/schedules", None, "bob")[1]["schedules"] == []
    assert occurrences(runtime, "tick", "bob") == []
    assert [s["id"] for s in call_api(runtime, "GET", "/schedules")[1]["schedules"]] == ["tick"]
    status, upcoming = call_api(runtime, "GET", "/schedules/tick/upcoming?count=3")
    assert status == 200
    assert upcoming["occurrences"] == [clock.to_iso(start + k * RATE_MS) for k in range(3)]
    assert call_api(runtime, "GET", "/schedules/tick/upcoming?count=101")[0] == 400


def test_a_schedules_last_fired_is_its_latest_send_behind_occurrences_that_sent_nothing(
    runtime, receiver
):
    """`last_fired_at` reads the schedule's occurrences due by now, newest first, page after
    page: behind fifteen that sent nothing (more than a page), the latest of the two that
    fired; another owner's occurrence under the same id, and one not yet due, are not it."""
    start = clock.now_ms() + 3_600_000  # no occurrence of its own while the test runs
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start), "alice")
    now = clock.now_ms()
    history = [(now - 60_000 - k, "alice", None) for k in range(15)]  # failed: sent nothing
    history += [(now - 90_000, "alice", "2026-01-01T00:00:02.000Z")]
    history += [(now - 91_000, "alice", "2026-01-01T00:00:03.000Z")]  # later, if due earlier
    history += [(now - 30_000, "bob", "2026-06-01T00:00:00.000Z"), (now + 60_000, "alice", None)]
    table = aws.resource("dynamodb").Table(settings().tasks_table)
    for due_ms, owner, fired_at in history:
        item = {"task_id": f"tick.{due_ms}", "schedule_id": "tick", "due_ms": due_ms}
        item |= {"owner": owner, "status": "SUCCEEDED" if fired_at else "FAILED"}
        table.put_item(Item=item | ({"fired_at": fired_at} if fired_at else {}))
    status, read = call_api(runtime, "GET", "/schedules/tick")
    assert status == 200 and read["last_fired_at"] == "2026-01-01T00:00:03.000Z"


@pytest.fixture
def looking_a_minute_ahead() -> Iterator[EmbeddedRuntime]:
    """A runtime that makes occurrences a minute ahead: a schedule can start far enough
    off that none of them is claimed while a test runs."""
    with runtime_with({"LookAheadSeconds": "60"}) as running:
        yield running


class Killed(Exception):
    """The API's invocation, killed part way through a request."""


@contextmanager
def killed_after_cancels(count: int) -> Iterator[None]:
    """The API's invocation dies at its cancel of an occurrence after the first `count`."""
    cancels = []

    def kill(params: dict, **_: object) -> None:
        if "schedule_revision" in params.get("ConditionExpression", ""):
            cancels.append(params["Key"])
            if len(cancels) > count:
                raise Killed("the invocation is gone")

    with hooked(aws.client("dynamodb"), ("before-parameter-build.dynamodb.UpdateItem", kill)):
        yield


def test_an_edit_killed_before_its_cancels_leaves_them_to_the_finder(runtime, receiver):
    """The edit stands; the occurrences the new expression does not have (here: none of the
    old ones) are cancelled by the finder's next run, as its request would have."""
    start = clock.now_ms() + 10_000  # inside the look-ahead, not yet woken in this test
    call_api(runtime, "POST", "/schedules", every_two_seconds(receiver.url, start))
    before = {t["id"] for t in occurrences(runtime, "tick")}
    change = {"expression": "rate(4 seconds)", "start_at": clock.to_iso(start + 1000)}
    with killed_after_cancels(0), pytest.raises(Killed):
        call_api(runtime, "PATCH", "/schedules/tick", change)
    assert call_api(runtime, "GET", "/schedules/tick")[1]["expression"] == "rate(4 seconds)"
    assert runtime.run_finder()["leftovers_finished"] == 1
    kept = {stored(task_id)["status"] for task_id in before}  # none, but one claimed by now
    assert "CANCELLED" in kept and kept <= {"CANCELLED", "RUNNING", "SUCCEEDED"}, kept
    live = [t for t in occurrences(runtime, "tick") if t["status"] == "PENDING"]
    dues = sorted(clock.to_ms(datetime.fromisoformat(t["due_at"])) for t in live)
    assert live and all(b - a == 4000 for a, b in pairwise(dues))
    assert [s["schedule_id"] for s in all_schedules()] == ["tick"]  # the record went


@pytest.mark.parametrize(
    ("ended", "then"), [("killed", "retry"), ("killed", "finder"), ("out_of_time", "finder")]
)
def test_nothing_of_a_deleted_schedule_is_left_to_fire_however_its_request_ends(
    looking_a_minute_ahead, receiver, monkeypatch, ended, then
):
    """A per-second schedule's delete whose request is killed after its first cancels, or
    runs out of its time before them: the schedule is gone at once, and what it made is
    cancelled all the same, by the retried DELETE (which answers as the first would have,
    not 404) or, if none comes, by the finder's next run."""
    runtime = looking_a_minute_ahead
    start = clock.now_ms() + 30_000  # none claimed while the test runs, however slow
    body = every_two_seconds(receiver.url, start, expression="rate(1 second)")
    assert call_api(runtime, "POST", "/schedules", body)[0] == 201
    made = [t["task_id"] for t in all_tasks() if t.get("schedule_id") == "tick"]
    assert len(made) >= 8
    if ended == "out_of_time":
        monkeypatch.setattr(schedules, "LEFTOVERS_BUDGET_S", 0.0)
        assert call_api(runtime, "DELETE", "/schedules/tick")[0] == 200
    else:
        with killed_after_cancels(3), pytest.raises(Killed):  # API Gateway answers 502
            call_api(runtime, "DELETE", "/schedules/tick")
    assert call_api(runtime, "GET", "/schedules/tick")[0] == 404  # gone at once
    assert [stored(t)["status"] for t in made].count("CANCELLED") <= 3  # the rest left
    if then == "retry":
        status, view = call_api(runtime, "DELETE", "/schedules/tick")
        assert status == 200 and view["id"] == "tick"
    else:
        assert runtime.run_finder()["leftovers_finished"] == 1
    assert {stored(t)["status"] for t in made} == {"CANCELLED"}
    assert all_schedules() == []  # the record of what was left went with the last cancel
    assert call_api(runtime, "DELETE", "/schedules/tick")[0] == 404


def test_sample_schedule_events_run_through_the_handler_in_order(runtime):
    replies = {}
    for name in ("create", "get", "upcoming", "list", "pause", "delete"):
        event = json.loads((EVENTS / f"api_schedule_{name}.json").read_text())
        reply = runtime.invoke("ApiFunction", event)
        replies[name] = (reply["statusCode"], json.loads(reply["body"]))
    assert replies["create"][0] == 201 and replies["create"][1]["id"] == "sample-weekdays"
    assert replies["get"][0] == 200 and replies["get"][1]["timezone"] == "Europe/Berlin"
    assert len(replies["upcoming"][1]["occurrences"]) == 5
    assert [s["id"] for s in replies["list"][1]["schedules"]] == ["sample-weekdays"]
    assert replies["pause"][1]["state"] == "PAUSED"
    assert replies["delete"][0] == 200 and all_schedules() == []


@pytest.mark.slow
@pytest.mark.tool
def test_a_restart_of_serve_skips_or_fires_the_latest_missed_occurrence(tmp_path, receiver):
    state_file = tmp_path / "tocsin.json"
    arguments = ["--state", str(state_file), "--allow-host", "127.0.0.1"]
    arguments += ["--lookahead", "6", "--finder-interval", "1"]
    server, url = serve(*arguments)
    try:
        alice = Client(url, principal="alice")
        start = clock.now_ms() + 2000
        for catch_up in ("skip", "latest"):
            alice.create_schedule(
                id=catch_up, expression="rate(2 seconds)", start_at=clock.to_iso(start),
                type="webhook", target={"url": receiver.url}, catch_up=catch_up,
            )  # fmt: skip
        assert receiver.wait_for(4, timeout_s=15)
    finally:
        stop(server)
    time.sleep(12)  # beyond the look-ahead: occurrences pass that are not tasks yet
    server, url = serve(*arguments)
    try:
        alice = Client(url, principal="alice")
        assert receiver.wait_for(len(receiver.received()) + 4, timeout_s=20)
        schedules = {sid: alice.get_schedule(sid) for sid in ("skip", "latest")}
        tasks = {sid: list(alice.iter_tasks(schedule=sid)) for sid in ("skip", "latest")}
    finally:
        stop(server)
    arrivals = Counter(a.task_id for a in receiver.received())
    assert [task_id for task_id, n in arrivals.items() if n > 1] == []
    for sid, made in tasks.items():
        missed = schedules[sid].missed
        assert missed >= 2, sid
        dues = sorted(clock.to_ms(t.due_at) for t in made)
        gaps = [b - a for a, b in pairwise(dues) if b - a != RATE_MS]
        assert gaps == [RATE_MS * (missed + 1)], sid  # one hole: what was missed
        # made more than a second after its time: only catch-up does that
        caught_up = [t for t in made if clock.to_ms(t.created_at) - clock.to_ms(t.due_at) > 1000]
        if sid == "skip":
            assert caught_up == []
        else:  # the latest missed one (the hole's end) fired at once, late
            assert len(caught_up) == 1 and caught_up[0].id in arrivals
            hole_end = next(b for a, b in pairwise(dues) if b - a != RATE_MS)
            assert clock.to_ms(caught_up[0].due_at) == hole_end
            assert caught_up[0].lateness_ms is not None and caught_up[0].lateness_ms > 1000


@pytest.mark.slow
def test_an_at_schedule_fires_once_then_is_completed(runtime, receiver):
    due = clock.now_ms() + 6000
    wall = clock.to_datetime(due).astimezone(ZoneInfo("Asia/Kolkata")).replace(tzinfo=None)
    body = {
        "id": "once",
        "expression": f"at({wall.isoformat(timespec='milliseconds')})",
        "timezone": "Asia/Kolkata",
        "type": "webhook",
        "target": {"url": receiver.url},
    }
    status, created = call_api(runtime, "POST", "/schedules", body)
    assert status == 201 and created["next_due_at"] == clock.to_iso(due)
    assert created["state"] == "COMPLETED"  # its one occurrence is a task already
    upcoming = call_api(runtime, "GET", "/schedules/once/upcoming")[1]["occurrences"]
    assert upcoming == [clock.to_iso(due)]
    [task] = occurrences(runtime, "once")
    assert task["id"] == f"once.{due}"
    assert wait_for_status(task["id"], {"SUCCEEDED"})["fired_at"] >= clock.to_iso(due)
    assert [a.task_id for a in receiver.received()] == [task["id"]]
    # a new expression brings it back
    next_year = wall.replace(year=wall.year + 1).isoformat(timespec="milliseconds")
    later = {"expression": f"at({next_year})"}
    status, again = call_api(runtime, "PATCH", "/schedules/once", later)
    assert status == 200 and again["state"] == "ENABLED"
