"""A task fires once, never early, by the path its due time calls for."""

import json
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler

import boto3
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import (
    MANY_P99_LATE_MS,
    all_tasks,
    assert_on_time,
    call_api,
    http_server,
    runtime_with,
    stop_until_ended,
    store_pending,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tests.integration.test_targets import EVENTS
from tocsin import clock
from tocsin.dispatch import execution_arn
from tocsin.errors import Conflict
from tocsin.index_keys import INDEX_LAG_MS
from tocsin.settings import settings
from tocsin.store import HORIZONS_KEY, TaskStore
from tocsin.submit import new_item, submit_task


def test_webhook_fires_once_at_due_time_with_payload_and_signature(runtime, receiver):
    due = clock.now_ms() + 2500
    payload = {"order": 7, "note": "ünïcode"}
    submit_task(webhook_task(f"{receiver.url}/hook", due, "once", payload), owner="alice")

    item = wait_for_status("once", {"SUCCEEDED"})
    time.sleep(0.3)  # room for a duplicate to show up, if there were one
    [arrival] = receiver.received()
    assert_on_time([arrival.arrival_ms - due])
    assert json.loads(arrival.body) == payload
    assert arrival.idempotency_key == "once:1"
    secret = boto3.client("secretsmanager").get_secret_value(SecretId=settings().webhook_secret_arn)
    assert Webhook(secret["SecretString"]).verify(arrival.body, arrival.headers) == payload
    assert int(arrival.headers["webhook-timestamp"]) == due // 1000  # signed for its second
    assert int(item["lateness_ms"]) >= 0
    assert clock.to_iso(due) <= item["fired_at"]


def test_task_due_inside_look_ahead_is_started_at_submit(runtime, receiver):
    submitted = submit_task(
        webhook_task(receiver.url, clock.now_ms() + 10_000, "soon"), owner="alice"
    )
    assert submitted.task["status"] == "PENDING"  # until its execution claims it
    assert [e.name for e in runtime.executions()] == ["soon-v1"]
    # its entry stays in the due shards, where the finder leaves what its writer started
    assert not stored("soon")["gsi_pk"].startswith("check-")
    assert runtime.run_finder()["found"] == 0
    assert [e.name for e in runtime.executions()] == ["soon-v1"]


@pytest.mark.slow
def test_task_due_beyond_look_ahead_is_started_by_the_finder(receiver):
    with runtime_with({"LookAheadSeconds": "5"}) as rt:
        # beyond the look-ahead and the index's lag: the finder's, which misses it at first
        due = clock.now_ms() + 5000 + INDEX_LAG_MS + 1000
        submitted = submit_task(webhook_task(receiver.url, due, "later"), owner="alice")
        assert submitted.task["status"] == "PENDING"
        assert rt.run_finder()["found"] == 0
        assert list(rt.executions()) == []
        time.sleep((due - clock.now_ms() - 4000) / 1000)  # its window whole within reach
        assert rt.run_finder()["started"] == 1
        wait_for_status("later", {"SUCCEEDED"})
        assert len(receiver.received()) == 1
        assert receiver.received()[0].arrival_ms >= due


def _until_reach(reach_ms: int, lookahead_ms: int = 5000) -> None:
    """Sleep until a finder run's look-ahead reaches `reach_ms`."""
    time.sleep(max(reach_ms - lookahead_ms - clock.now_ms(), 0) / 1000)


@pytest.mark.slow
def test_a_second_the_look_ahead_cuts_is_found_whole_by_the_next_run(receiver):
    """Two tasks due in one second, a run's look-ahead reaching between them: that run
    leaves both, and the next starts them in one execution, not in one each."""
    with runtime_with({"LookAheadSeconds": "5"}) as rt:
        second = ((clock.now_ms() + 5000) // 1000 + 1) * 1000  # beyond the first reach
        due = {"early-half": second + 100, "late-half": second + 900}
        for task_id, due_ms in due.items():
            store_task(webhook_task(receiver.url, due_ms, task_id))
        _until_reach(second + 400)
        assert rt.run_finder()["found"] == 0  # reaching into the second, not across it
        _until_reach(second + 1000)
        assert rt.run_finder()["started"] == 2
        for task_id in due:
            wait_for_status(task_id, {"SUCCEEDED"})
        [execution] = rt.executions()
        assert {stored(t)["execution"] for t in due} == {execution.name}


def test_overdue_task_missed_by_the_finder_fires_at_once(runtime, receiver):
    due = clock.now_ms() - 30_000  # PENDING in the index, as if earlier finder runs failed
    store_task(webhook_task(receiver.url, due, "overdue"), submitted_ms=due - 1000)
    assert runtime.run_finder()["started"] == 1
    item = wait_for_status("overdue", {"SUCCEEDED"})
    assert len(receiver.received()) == 1
    assert int(item["lateness_ms"]) >= 30_000


def test_resubmitting_the_same_body_is_idempotent(runtime, receiver):
    body = webhook_task(receiver.url, clock.now_ms() + 60_000, "same")
    first = submit_task(body, owner="alice")
    again = submit_task(body, owner="alice")
    assert first.created and not again.created
    assert again.task == stored_view("same")
    assert len(list(runtime.executions())) == 0  # beyond the look-ahead: nothing started


def test_conflicting_body_is_refused_and_first_task_untouched(runtime, receiver):
    due = clock.now_ms() + 60_000
    submit_task(webhook_task(receiver.url, due, "taken"), owner="alice")
    before = stored("taken")
    with pytest.raises(Conflict) as refused:
        submit_task(webhook_task(receiver.url, due + 1, "taken"), owner="alice")
    assert refused.value.field == "id"
    with pytest.raises(Conflict):
        submit_task(webhook_task(receiver.url, due, "taken"), owner="mallory")
    assert stored("taken") == before


def stored_view(task_id):
    from tocsin.model import task_view

    return task_view(stored(task_id))


def test_a_webhook_redirect_is_not_followed(runtime):
    """A 3xx could point at an internal address: it fails the task instead of being followed."""
    hits: list[str] = []

    class Redirector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/in")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Redirector) as url:
        hook = f"{url}/hook"
        submit_task(webhook_task(hook, clock.now_ms() + 1000, "redirected"), owner="alice")
        item = wait_for_status("redirected", {"FAILED"})
    assert hits == ["/hook"]
    assert "307" in json.loads(item["error"])["Cause"]


def test_the_largest_payload_that_grows_when_escaped_fires_and_never_enters_the_state(
    runtime, receiver
):
    """A payload of `"` stored at the 200 KB limit (each escaped: `\\"`) is 400 KB once the
    stored JSON is escaped into a state again, over Step Functions' 256 KB, where
    `States.DataLimitExceeded` cannot be caught. The state carries ids only."""
    from tocsin.settings import MAX_PAYLOAD_BYTES

    payload = '"' * ((MAX_PAYLOAD_BYTES - 2) // 2)  # stored as JSON: exactly the limit
    assert len(json.dumps(payload)) == MAX_PAYLOAD_BYTES
    body = webhook_task(receiver.url, clock.now_ms() + 1500, "quotes", payload)
    submit_task(body, owner="alice")
    wait_for_status("quotes", {"SUCCEEDED"})
    [arrival] = receiver.received()
    assert json.loads(arrival.body) == payload
    sfn = boto3.client("stepfunctions")
    [execution] = runtime.executions()
    given = sfn.describe_execution(executionArn=execution.execution_arn)["input"]
    events = sfn.get_execution_history(executionArn=execution.execution_arn)["events"]
    largest = max(len(json.dumps(event, default=str)) for event in events)
    assert len(given) < 1024 and largest < 4096


@pytest.mark.slow
def test_a_hanging_target_holds_up_no_other_task_of_its_batch(runtime, receiver):
    """Two tasks in one batch, the first one's receiver hanging: the second still fires at
    its own millisecond, while the first one's request is still unanswered."""
    receiver.hang_s = 4.0
    due = (clock.now_ms() // 1000 + 8) * 1000  # one window, past the local lead
    for task_id, offset, path in (("hung", 0, "/hang"), ("after-hung", 300, "/ok")):
        store_task(webhook_task(f"{receiver.url}{path}", due + offset, task_id))
    receiver.script_for["/hang"] = ["hang"]
    assert runtime.run_finder()["executions"] == 1
    wait_for_status("after-hung", {"SUCCEEDED"})
    arrived = {a.task_id: a.arrival_ms for a in receiver.received()}
    assert arrived["after-hung"] >= due + 300
    assert arrived["after-hung"] < arrived["hung"] + receiver.hang_s * 1000  # still hanging
    assert stored("hung")["status"] == "RUNNING"


def test_a_task_shows_each_failed_attempt_and_the_execution_that_claimed_it(runtime, receiver):
    """A task's view keeps the attempts that failed (when each began, and why) and the
    execution that claimed it; a task sent at its first attempt writes no history at all."""
    receiver.script_for["/flaky"] = [503]  # then 200
    receiver.status_for["/gone"] = 410
    due = clock.now_ms() + 1500
    for task_id in ("flaky", "gone", "plain"):
        submit_task(webhook_task(f"{receiver.url}/{task_id}", due, task_id), owner="alice")
    for task_id, status in (("flaky", "SUCCEEDED"), ("gone", "FAILED"), ("plain", "SUCCEEDED")):
        wait_for_status(task_id, {status})

    _, flaky = call_api(runtime, "GET", "/tasks/flaky")
    [failed] = flaky["tries"]
    assert flaky["attempts"] == 2 and "503" in failed["error"]
    assert clock.to_ms(datetime.fromisoformat(failed["at"])) >= due  # it began at the gate
    assert failed["at"] < flaky["fired_at"] and flaky["execution"] == "flaky-v1"
    _, gone = call_api(runtime, "GET", "/tasks/gone")
    assert [("410" in t["error"]) for t in gone["tries"]] == [True]
    _, plain = call_api(runtime, "GET", "/tasks/plain")
    assert plain["tries"] is None and "tries" not in stored("plain")  # nothing written
    assert plain["execution"] == "plain-v1"


def test_a_name_an_ended_execution_holds_starts_the_task_again_under_a_new_one(runtime, receiver):
    """The task's execution name is taken by an execution that ended without settling it
    (started, then stopped before it claimed the task: an operator's stop, say).
    StartExecution answers ExecutionAlreadyExists, as for one still running; the finder
    asks, and starts the task again under a new name at once, rather than leaving it for
    the reconciler to find past its due time."""
    [task_id] = store_pending(receiver.url, 1, 12_000, "taken")
    sfn = boto3.client("stepfunctions")
    later = clock.to_iso_second(clock.now_ms() + 60_000)
    waiting = {"wake_at": later, "task_type": "webhook", "executor": 0, "tasks": []}
    ended = sfn.start_execution(
        stateMachineArn=runtime.state_machine_arn, name=f"{task_id}-v1", input=json.dumps(waiting)
    )["executionArn"]
    stop_until_ended(ended)
    report = runtime.run_finder()
    assert (report["renamed"], report["already_started"], report["backlog"]) == (1, 0, 0)
    assert int(stored(task_id)["requeues"]) == 1
    item = wait_for_status(task_id, {"SUCCEEDED"})
    assert item["execution"] == f"{task_id}-v1r1"
    assert [a.task_id for a in receiver.received()] == [task_id]


def test_generated_scheduled_event_runs_the_finder_which_writes_only_its_horizons(runtime):
    event = json.loads((EVENTS / "finder_scheduled.json").read_text())
    assert runtime.invoke("FinderFunction", event) == {
        "found": 0,
        "started": 0,
        "already_started": 0,
        "renamed": 0,
        "throttled": 0,
        "failed": 0,
        "deferred": 0,
        "backlog": 0,
        "executions": 0,
        "stuck": 0,
        "started_late": 0,
        "requeued": 0,
        "failed_stuck": 0,
        "letters_sent": 0,
        "letters_owed": 0,
        "reconcile_faults": 0,
        "reconcile_cut_short": 0,
        "schedules_due": 0,
        "occurrences_made": 0,
        "schedule_errors": 0,
        "leftovers_finished": 0,
    }
    [horizons] = all_tasks()  # how far the finder and the reconciler have read
    assert horizons["task_id"] == HORIZONS_KEY["task_id"]
    assert set(horizons) == {"task_id", "finder_ms", "looked_ms"}


def test_an_execution_wakes_at_its_wake_second_not_before(runtime, receiver):
    """As on AWS, the Wait ends at the input's `wake_at` (moto's own ended up to a second
    early, and the executor slept that much longer before its gate)."""
    [task_id] = store_pending(receiver.url, 1, settings().lead_ms + 2500, "woken")
    assert runtime.run_finder()["started"] == 1
    wait_for_status(task_id, {"SUCCEEDED"})
    sfn = boto3.client("stepfunctions")
    arn = execution_arn(runtime.state_machine_arn, f"{task_id}-v1")
    wake = datetime.fromisoformat(
        json.loads(sfn.describe_execution(executionArn=arn)["input"])["wake_at"]
    )
    events = sfn.get_execution_history(executionArn=arn)["events"]
    [woken] = [e["timestamp"] for e in events if e["type"] == "WaitStateExited"]
    # never before wake_at; the bound after it is a loaded machine's, not AWS's (one wake,
    # not a p99: 1.86 s once in CI's DynamoDB Local pass, beside both Pythons' tests)
    assert wake <= woken < wake + timedelta(milliseconds=2 * MANY_P99_LATE_MS)


def test_a_retried_submission_starts_a_task_its_first_try_stored_and_did_not_start(
    runtime, receiver
):
    """The first request stored the task and died before its start: the retry (the same
    body, 200) starts it, the one execution its name allows."""
    body = webhook_task(receiver.url, clock.now_ms() + 10_000, "retried")
    TaskStore(settings().tasks_table).create(new_item(body, "alice", clock.now_ms(), settings()))
    assert list(runtime.executions()) == []
    assert not submit_task(body, owner="alice").created
    assert [e.name for e in runtime.executions()] == ["retried-v1"]
    assert not submit_task(body, owner="alice").created  # again: the same execution
    assert [e.name for e in runtime.executions()] == ["retried-v1"]
