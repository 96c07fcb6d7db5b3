"""Racing finders, a crash between StartExecution and the horizon, and failing executors."""

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from unittest import mock

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ClientError, EndpointConnectionError
from moto.core.botocore_stubber import MockRawResponse

from tests.conftest import (
    arrivals_on_time,
    batch_event,
    claim_as,
    dead_letters,
    hooked,
    http_server,
    runtime_with,
    store_pending,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import aws, clock
from tocsin.dispatch import execution_arn
from tocsin.fire.executor import DeliveryInProgress
from tocsin.fire.writes import TableUnavailable
from tocsin.measure.chaos import finders_horizon_write, finders_in_step
from tocsin.measure.cost import transitions
from tocsin.settings import settings
from tocsin.store import Claim


def test_two_finders_at_once_fire_each_task_once(runtime, receiver):
    """Both finders read every due shard before either starts anything."""
    ids = store_pending(receiver.url, 12, 2500, "race")
    reports = []
    with finders_in_step(2) as held:
        threads = [
            threading.Thread(target=lambda: reports.append(runtime.run_finder()), name=f"finder{i}")
            for i in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert sorted(held) == ["finder0", "finder1"]  # each waited, its reads done, for the other
    assert [r["found"] for r in reports] == [len(ids), len(ids)]  # both saw every task: a race
    assert all(r["backlog"] == 0 for r in reports)
    for task_id in ids:
        wait_for_status(task_id, {"SUCCEEDED"})
    assert runtime.wait_for_executions(30)
    assert Counter(a.task_id for a in receiver.received()) == dict.fromkeys(ids, 1)


def tables() -> object:
    """The client the domain's table writes go through."""
    return aws.resource("dynamodb").meta.client


def _horizon_lost(params: dict, **_: object) -> None:
    """The finder's horizon write loses its connection (the reconciler's own, before it,
    goes through)."""
    if finders_horizon_write(params):
        raise EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")


# a finder dying after its starts, at its horizon's write
HORIZON_LOST = ("before-parameter-build.dynamodb.UpdateItem", _horizon_lost)


@pytest.mark.slow
def test_finder_crash_between_start_and_horizon_still_fires_once(receiver):
    # no claim before the second run: due within the look-ahead (20 s) and woken 16 s on, a
    # 2 s lead (with 5 s and due 15 s on, the first run on DynamoDB Local in a loaded CI run
    # took longer than the 10 s to the wake, and a task was claimed before the assert)
    with runtime_with({"LeadMilliseconds": "2000"}) as runtime:
        ids = store_pending(receiver.url, 5, 18_000, "crash")
        with hooked(tables(), HORIZON_LOST), pytest.raises(EndpointConnectionError):
            runtime.run_finder()  # started the executions, then died before its horizon
        assert {stored(i)["status"] for i in ids} == {"PENDING"}

        started = {e.name for e in runtime.executions()}
        second = runtime.run_finder()  # read again, packed the same: no second execution
        assert second["found"] == len(ids) and second["backlog"] == 0
        assert second["started"] + second["already_started"] == len(ids)  # idempotent
        for task_id in ids:
            wait_for_status(task_id, {"SUCCEEDED"})
        assert Counter(a.task_id for a in receiver.received()) == dict.fromkeys(ids, 1)
        assert {e.name for e in runtime.executions()} == started


def fire_replies(execution_arn: str) -> list[dict]:
    """What the executor answered each of an execution's Fire invocations that succeeded,
    as its history shows it (the console's view of an execution)."""
    events = boto3.client("stepfunctions").get_execution_history(executionArn=execution_arn)
    return [
        json.loads(event["taskSucceededEventDetails"]["output"])["Payload"]
        for event in events["events"]
        if event["type"] == "TaskSucceeded"
    ]


@pytest.mark.slow
def test_a_crashed_run_repacked_with_a_newcomer_still_fires_each_task_once(runtime, receiver):
    """The finder starts a window's batch and dies before its horizon; a task due in the same
    window arrives; the next run packs the six into a new batch (a new name: a second
    execution). Both executions claim the first five: the claim decides, each fires once,
    and the executors' replies show it: of the eleven claims, the five on tasks the other
    execution held were refused."""
    window_ms = (clock.now_ms() // 1000 + 16) * 1000  # one window; no claim before run two
    ids = [f"repack-{i}" for i in range(5)]
    for i, task_id in enumerate(ids):
        store_task(webhook_task(receiver.url, window_ms + 37 * i, task_id))
    with hooked(tables(), HORIZON_LOST), pytest.raises(EndpointConnectionError):
        runtime.run_finder()
    [first] = runtime.executions()
    store_task(webhook_task(receiver.url, window_ms, "repack-new"))

    second = runtime.run_finder()
    assert second["found"] == len(ids) + 1 and second["backlog"] == 0
    [repacked] = [e for e in runtime.executions() if e.name != first.name]
    everyone = [*ids, "repack-new"]
    for task_id in everyone:
        wait_for_status(task_id, {"SUCCEEDED"})
    assert runtime.wait_for_executions(30)

    # each execution's one invocation answered: none failed, none was retried
    [one], [two] = fire_replies(first.execution_arn), fire_replies(repacked.execution_arn)
    assert (one["tasks"], two["tasks"]) == (len(ids), len(everyone))
    assert one["claimed"] + two["claimed"] == len(everyone)  # each task claimed once
    refused = one["tasks"] - one["claimed"] + two["tasks"] - two["claimed"]
    assert refused == len(ids)  # a claim on each of the five was refused: the other held it
    assert one.get("fired", 0) == one["claimed"] and two.get("fired", 0) == two["claimed"]
    holders = Counter(stored(task_id)["execution"] for task_id in everyone)
    assert holders == {
        name: claimed
        for name, claimed in ((first.name, one["claimed"]), (repacked.name, two["claimed"]))
        if claimed
    }  # the table says who held each task, as the replies count it
    assert Counter(a.task_id for a in receiver.received()) == dict.fromkeys(everyone, 1)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_transient_failure_is_retried_up_to_max_attempts_then_failed_to_the_dlq(
    runtime, receiver, max_attempts
):
    receiver.status_for["/down"] = 503
    ids = store_pending(f"{receiver.url}/down", 1, 500, "flaky", max_attempts=max_attempts)
    runtime.run_finder()
    item = wait_for_status(ids[0], {"FAILED"}, timeout_s=60)

    # one request an attempt (urllib3 tries again only a connection that failed)
    assert len(receiver.received()) == max_attempts
    assert item["attempts"] == max_attempts
    error = json.loads(item["error"])
    assert error["Error"] == "PermanentTargetError"
    assert f"gave up after {max_attempts} attempts" in error["Cause"]
    [message] = dead_letters(runtime)
    assert message == {
        "task_id": ids[0],
        "version": 1,
        "task_type": "webhook",
        "execution": execution_arn(settings().state_machine_arn, item["execution"]),
        "error": error,
    }  # ids and the error: no payload, no target (its headers may hold credentials)


def test_a_dropped_connection_is_named_in_the_error_without_the_url(runtime, receiver):
    """The operator reads what failed (the error and its cause) in the task and its dead
    letter; the URL's query, which can carry a token, is not there."""
    receiver.script_for["/drop?token=s3cret"] = ["close"]
    ids = store_pending(f"{receiver.url}/drop?token=s3cret", 1, 500, "drop", max_attempts=1)
    runtime.run_finder()
    item = wait_for_status(ids[0], {"FAILED"})
    assert "webhook request failed: the connection closed before its answer" in item["error"]
    assert "s3cret" not in item["error"]
    assert [m["error"] for m in dead_letters(runtime)] == [json.loads(item["error"])]


def test_permanent_failure_is_not_retried(runtime, receiver):
    receiver.status_for["/gone"] = 410
    ids = store_pending(f"{receiver.url}/gone", 1, 500, "gone")
    runtime.run_finder()
    item = wait_for_status(ids[0], {"FAILED"})
    assert len(receiver.received()) == 1
    assert "410" in json.loads(item["error"])["Cause"]
    assert [m["task_id"] for m in dead_letters(runtime)] == ids


def test_a_retried_invocation_takes_back_its_claim_and_does_not_act_again(runtime, receiver):
    """The first invocation sent, and the table refused its mark (a policy gone wrong:
    refused at once, not tried again): it logged the send, let the task go and failed. The
    same execution's next invocation takes the task over, finds the send in the log, and
    records the first fire instead of sending again."""
    ids = store_pending(receiver.url, 1, -1000, "retry")
    event = batch_event(ids[0])

    def refuse_marks(params: dict, **_: object) -> None:
        if ":status" in params.get("ExpressionAttributeValues", {}):
            raise ClientError({"Error": {"Code": "AccessDeniedException"}}, "UpdateItem")

    client = aws.resource("dynamodb").meta.client
    marks_refused = ("before-parameter-build.dynamodb.UpdateItem", refuse_marks)
    with hooked(client, marks_refused), pytest.raises(ClientError):
        runtime.invoke("WebhookExecutorFunction", event)
    [first] = receiver.received()
    assert stored(ids[0])["status"] == "RUNNING"
    second = runtime.invoke("WebhookExecutorFunction", event)
    assert second == {"tasks": 1, "claimed": 1, "fired": 1}
    assert receiver.received() == [first]
    fired_ms = clock.to_ms(datetime.fromisoformat(stored(ids[0])["fired_at"]))
    assert fired_ms <= first.arrival_ms  # the first fire, from the log


def test_another_execution_cannot_claim_a_held_task(runtime, receiver):
    ids = store_pending(receiver.url, 1, -1000, "held")
    assert claim_as("first", ids[0]).before["status"] == "PENDING"
    assert stored(ids[0])["status"] == "RUNNING"
    again = claim_as("first", ids[0])  # its own write, tried again
    assert again.before["status"] == "RUNNING" and not again.taken_over
    assert claim_as("second", ids[0]) == Claim(None)
    second = batch_event(ids[0], "arn:aws:states:::execution:m:second")
    assert runtime.invoke("WebhookExecutorFunction", second) == {"tasks": 1, "claimed": 0}
    assert receiver.received() == [] and stored(ids[0])["execution"] == "first"


@pytest.mark.parametrize("write", ["claim", "finish"])
def test_an_ambiguous_write_neither_skips_the_task_nor_fails_it(runtime, receiver, write):
    """The table commits, then the caller retries as if it had not (a 500 or a timeout on
    the way back): the retry finds its own write, instead of a lost condition."""
    ids = store_pending(receiver.url, 1, -1000, f"ambiguous-{write}")
    client = aws.resource("dynamodb").meta.client
    marker = b'":execution"' if write == "claim" else b'":status"'
    lost = []

    def retry_a_committed_write(request_dict: dict, response, **_: object) -> float | None:
        body = request_dict["body"]
        body = body if isinstance(body, bytes) else body.encode()
        if not lost and marker in body and response and response[0].status_code == 200:
            lost.append(write)
            return 0.0  # botocore sends the same request again at once
        return None

    event = f"needs-retry.dynamodb.UpdateItem.{id(lost)}"
    client.meta.events.register_first(
        "needs-retry.dynamodb.UpdateItem", retry_a_committed_write, event
    )
    try:
        result = runtime.invoke("WebhookExecutorFunction", batch_event(ids[0]))
    finally:
        client.meta.events.unregister("needs-retry.dynamodb.UpdateItem", unique_id=event)
    assert lost == [write]
    assert result == {"tasks": 1, "claimed": 1, "fired": 1}
    assert stored(ids[0])["status"] == "SUCCEEDED" and len(receiver.received()) == 1
    assert dead_letters(runtime) == []


def test_a_brownout_that_spends_botocores_retry_quota_still_claims_and_marks_the_batch(
    runtime, receiver, caplog
):
    """Every claim and mark of a 40-task batch is refused twice with a 500 before it goes
    through. botocore's retry quota (shared by the client) is spent after a few dozen such
    retries, and from then on botocore gives a write up at its first refusal: the executor
    keeps trying each write in its own time, and the batch fires whole, each task once."""
    ids = store_pending(receiver.url, 40, 1500, "brownout")
    client = aws.resource("dynamodb").meta.client
    refused: Counter[tuple[str, str]] = Counter()

    def refuse_twice(request: AWSPreparedRequest, **_: object) -> AWSResponse | None:
        body = json.loads(request.body)
        kind = "claim" if "lease_until = :lease" in body["UpdateExpression"] else "mark"
        write = (kind, body["Key"]["task_id"]["S"])
        if (kind == "mark" and ":status" not in body["ExpressionAttributeValues"]) or refused[
            write
        ] >= 2:
            return None
        refused[write] += 1
        error = b'{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError"}'
        return AWSResponse(request.url, 500, {}, MockRawResponse(error))

    caplog.set_level(logging.DEBUG, logger="botocore.retries.standard")
    with hooked(client, ("before-send.dynamodb.UpdateItem", refuse_twice)):
        event = {**batch_event(ids[0]), "tasks": [batch_event(i)["tasks"][0] for i in ids]}
        result = runtime.invoke("WebhookExecutorFunction", event)
    assert "retry quota reached" in caplog.text  # botocore gave writes up at a refusal
    assert len(refused) == 80 and set(refused.values()) == {2}  # each claim and mark
    assert result == {"tasks": 40, "claimed": 40, "fired": 40}
    assert {stored(i)["status"] for i in ids} == {"SUCCEEDED"}
    assert Counter(a.task_id for a in receiver.received()) == dict.fromkeys(ids, 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "status"),
    [("InternalServerError", 500), ("ProvisionedThroughputExceededException", 400)],
)
def test_a_send_the_table_will_not_mark_is_logged_and_not_sent_again(
    runtime, receiver, monkeypatch, code, status
):
    """The Tasks table refuses the final mark after the send, every try until the
    invocation's margin: the invocation writes the send to the sent log, lets the task go
    and fails (TableUnavailable); Fire's retry takes the task over, finds the send in the
    log, and marks it SUCCEEDED with the first fire time. One send in all. (The first
    invocation's last try, cut off in botocore's backoff, may still land once the send is
    logged, marking the same outcome; Fire is retried either way. An executor of 12 s and
    webhooks of 2 s keep it short.)"""
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "2")
    settings.cache_clear()
    executor = runtime.functions["WebhookExecutorFunction"]
    runtime.functions["WebhookExecutorFunction"] = replace(executor, timeout_s=12)
    ids = store_pending(receiver.url, 1, 1500, f"unmarked-{status}")
    sent_log = boto3.resource("dynamodb").Table(settings().sent_table)
    refused = []

    def refuse_until_logged(params: dict, **_: object) -> None:
        final_mark = ":status" in params.get("ExpressionAttributeValues", {})
        if final_mark and "Item" not in sent_log.get_item(Key={"id": f"{ids[0]}:1"}):
            refused.append(clock.now_ms())
            error = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
            raise ClientError(error, "UpdateItem")

    client = aws.resource("dynamodb").meta.client
    with hooked(client, ("before-parameter-build.dynamodb.UpdateItem", refuse_until_logged)):
        runtime.run_finder()
        item = wait_for_status(ids[0], {"SUCCEEDED", "FAILED"}, timeout_s=60)
    [arrival] = receiver.received()
    assert len(refused) > 1 and item["status"] == "SUCCEEDED"
    fired_ms = clock.to_ms(datetime.fromisoformat(item["fired_at"]))
    assert fired_ms <= arrival.arrival_ms < refused[0]  # the first fire, from the log
    assert runtime.wait_for_executions(30)  # the first invocation's failure is recorded
    [execution] = runtime.executions()
    assert transitions(execution.execution_arn) >= 3  # Wait, Fire, and Fire's retries


@pytest.mark.slow
def test_a_final_mark_that_hangs_is_cut_off_in_time_to_log_the_send(runtime, receiver, monkeypatch):
    """The first invocation's final mark gets no answer at all (a write that hangs): it is
    cut off a second before the invocation's end, the send is written to the sent log, and
    the invocation fails in its time, where Lambda would have killed it with no record of
    the send. Fire's retry finds the send in the log and does not send again. (An executor
    of 12 s keeps it short.)"""
    from tests.integration.test_letting_go import watched_executor

    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "2")
    settings.cache_clear()
    executor = runtime.functions["WebhookExecutorFunction"]
    runtime.functions["WebhookExecutorFunction"] = replace(executor, timeout_s=12)
    [task_id] = store_pending(receiver.url, 1, 1500, "hung-mark")
    hung, released = [], threading.Event()

    def hang_the_first_mark(params: dict, **_: object) -> None:
        values = params.get("ExpressionAttributeValues", {})
        if ":status" in values and values[":attempt"] in (hung or [values[":attempt"]]):
            hung.append(values[":attempt"])
            released.wait(60)  # no answer while the test runs; then the connection drops
            raise EndpointConnectionError(endpoint_url="https://dynamodb")

    client = aws.resource("dynamodb").meta.client
    try:
        with (
            hooked(client, ("before-parameter-build.dynamodb.UpdateItem", hang_the_first_mark)),
            watched_executor(runtime) as invocations,
        ):
            runtime.run_finder()
            item = wait_for_status(task_id, {"SUCCEEDED", "FAILED"}, timeout_s=60)
            assert runtime.wait_for_executions(30)  # the retry's invocation seen to its end
    finally:
        released.set()
    assert item["status"] == "SUCCEEDED" and len(receiver.received()) == 1  # sent once
    [cut] = [invocation for invocation in invocations if invocation.error == "TableUnavailable"]
    assert cut.ended_ms - cut.began_ms < 12_000  # within its time: not killed
    assert invocations[-1].reply == {"tasks": 1, "claimed": 1, "fired": 1}


@pytest.mark.slow
def test_a_sent_log_write_that_hangs_is_cut_off_before_the_invocation_s_end(
    runtime, receiver, monkeypatch
):
    """The Tasks table refuses the final mark after the send, and the sent log's write that
    follows gets no answer at all: it is cut off before the invocation's end, and the
    invocation fails in its time (TableUnavailable), where Lambda would have killed it
    mid-write. Unlogged, the send is made again by Fire's retry, with the same
    idempotency key for the receiver to tell. (An executor of 12 s keeps it short.)"""
    from tests.integration.test_letting_go import watched_executor

    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "2")
    settings.cache_clear()
    executor = runtime.functions["WebhookExecutorFunction"]
    runtime.functions["WebhookExecutorFunction"] = replace(executor, timeout_s=12)
    [task_id] = store_pending(receiver.url, 1, 1500, "hung-log")
    released, attempts = threading.Event(), []

    def refuse_the_first_attempts_mark(params: dict, **_: object) -> None:
        values = params.get("ExpressionAttributeValues", {})
        if ":status" in values and values[":attempt"] in (attempts or [values[":attempt"]]):
            attempts.append(values[":attempt"])
            error = {"Error": {"Code": "InternalServerError"}}
            raise ClientError(error | {"ResponseMetadata": {"HTTPStatusCode": 500}}, "UpdateItem")

    def hang_the_log(params: dict, **_: object) -> None:
        if params.get("TableName") == settings().sent_table:
            released.wait(60)  # no answer while the test runs; then the connection drops
            raise EndpointConnectionError(endpoint_url="https://dynamodb")

    client = aws.resource("dynamodb").meta.client
    try:
        with (
            hooked(
                client,
                ("before-parameter-build.dynamodb.UpdateItem", refuse_the_first_attempts_mark),
                ("before-parameter-build.dynamodb.PutItem", hang_the_log),
            ),
            watched_executor(runtime) as invocations,
        ):
            runtime.run_finder()
            item = wait_for_status(task_id, {"SUCCEEDED", "FAILED"}, timeout_s=60)
            assert runtime.wait_for_executions(30)
    finally:
        released.set()
    [cut] = [invocation for invocation in invocations if invocation.error == "TableUnavailable"]
    assert cut.ended_ms - cut.began_ms < 12_000  # within its time: not killed
    assert item["status"] == "SUCCEEDED"
    assert {a.idempotency_key for a in receiver.received()} == {f"{task_id}:1"}


@pytest.mark.slow
def test_a_dense_window_fires_from_one_execution_each_task_at_its_millisecond(runtime, receiver):
    """Thirty tasks due within one second: one execution, two states, thirty gates."""
    window = (clock.now_ms() // 1000 + 9) * 1000  # a second boundary, past the local lead
    ids = [f"dense-{i}" for i in range(30)]
    due = {task_id: window + 33 * i for i, task_id in enumerate(ids)}
    for task_id in ids:
        store_task(webhook_task(receiver.url, due[task_id], task_id))
    report = runtime.run_finder()
    assert (report["started"], report["executions"]) == (30, 1)
    for task_id in ids:
        wait_for_status(task_id, {"SUCCEEDED"})
    [execution] = runtime.executions()
    # the holder, not the finder's mark: on a loaded machine a claim may come before it
    assert {stored(i)["execution"] for i in ids} == {execution.name}
    arrivals = receiver.received()
    assert Counter(a.task_id for a in arrivals) == dict.fromkeys(ids, 1)
    arrivals_on_time(arrivals, due)
    assert transitions(execution.execution_arn) == 2


@pytest.mark.slow
def test_a_retried_invocation_is_billed_as_a_transition_and_fires_once(runtime, receiver):
    """Fire's first invocation fails as a whole (the table was unavailable for its claims):
    Step Functions retries it, bills the retry as a transition, and the task fires once."""
    [task_id] = store_pending(receiver.url, 1, 6000, "retried")
    invoke, failed = runtime.invoke, []

    def first_fails(logical_id: str, event: dict) -> object:
        if logical_id == "WebhookExecutorFunction" and not failed:
            failed.append(event)
            raise TableUnavailable("injected: claims not written in time")
        return invoke(logical_id, event)

    with mock.patch.object(runtime, "invoke", first_fails):
        runtime.run_finder()
        wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)
    assert failed and [a.task_id for a in receiver.received()] == [task_id]
    assert runtime.wait_for_executions(30)
    [execution] = runtime.executions()
    assert transitions(execution.execution_arn) == 3  # Wait, Fire, and Fire's retry


@pytest.mark.slow
def test_crowded_seconds_wake_staggered_and_still_fire_once_on_time(receiver):
    """Forty tasks due within 1.5 s in batches of two: the finder spreads the batches' wakes
    over the seconds before (the local runtime wakes at most 15 a second), so only the
    gates meet at due."""
    with runtime_with({"BatchSize": "2"}) as runtime:
        ids = store_pending(receiver.url, 40, 16_000, "crowd")  # 37 ms apart: within 1.5 s
        runtime.run_finder()
        sfn = boto3.client("stepfunctions")
        inputs = [
            json.loads(sfn.describe_execution(executionArn=e.execution_arn)["input"])
            for e in runtime.executions()
        ]
        wakes = Counter(given["wake_at"] for given in inputs)
        assert sorted(t["task_id"] for given in inputs for t in given["tasks"]) == sorted(ids)
        assert {len(given["tasks"]) for given in inputs} <= {1, 2}  # a window may hold an odd one
        assert max(wakes.values()) <= 15 and len(wakes) >= 2
        for task_id in ids:
            wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=40)
    due = {task["task_id"]: task["due_ms"] for given in inputs for task in given["tasks"]}
    arrivals = receiver.received()
    assert Counter(a.task_id for a in arrivals) == dict.fromkeys(ids, 1)
    arrivals_on_time(arrivals, due)


def test_a_retry_that_meets_a_send_in_progress_leaves_it_and_does_not_send_again(runtime):
    """A retried invocation (the first one's answer was lost) meets the first one still in
    its send: its claim finds the task held by a live attempt of its own execution, so it
    sends nothing and fails with DeliveryInProgress (Fire tries again later); the retry
    after that finds the task done by the first."""
    hits, release = [], threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.append(clock.now_ms())
            release.wait(10)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Slow) as url:
        [task_id] = store_pending(url, 1, -500, "slow")
        event = batch_event(task_id)
        results = []
        first = threading.Thread(
            target=lambda: results.append(runtime.invoke("WebhookExecutorFunction", event))
        )
        first.start()
        while not hits:
            time.sleep(0.01)
        with pytest.raises(DeliveryInProgress):
            runtime.invoke("WebhookExecutorFunction", event)
        release.set()
        first.join()
        third = runtime.invoke("WebhookExecutorFunction", event)
    assert len(hits) == 1
    assert results == [{"tasks": 1, "claimed": 1, "fired": 1}]
    assert third == {"tasks": 1, "claimed": 0}
    assert stored(task_id)["status"] == "SUCCEEDED"


class Killed(Exception):
    """Ends an invocation a test froze, once the test is over (Lambda would have killed it)."""


def _note_claims(params: dict, context: dict, **_: object) -> None:
    """Tell a claim's answer (its after-call) from the other writes' by its request."""
    context["claim"] = "lease_until = :lease" in params.get("UpdateExpression", "")


def short_leases(runtime, monkeypatch) -> None:
    """An executor of 13 s (the lease) and webhooks of 2 s (one attempt's time, 8 s): the
    retry that takes over still has time for one attempt."""
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "2")
    settings.cache_clear()
    executor = runtime.functions["WebhookExecutorFunction"]
    runtime.functions["WebhookExecutorFunction"] = replace(executor, timeout_s=13)


def wait_out_the_lease(task_id: str) -> None:
    lease_until = int(stored(task_id)["lease_until"])
    while clock.now_ms() <= lease_until:
        time.sleep(0.1)


@pytest.mark.slow
def test_a_lease_that_runs_out_after_a_killed_invocation_lets_a_retry_send_once(
    runtime, receiver, monkeypatch
):
    """Fire's invocation claims the task and is killed right after (its sandbox never runs
    again), before it sends or marks. Fire's retry, a new request id, finds the lease live
    and leaves the task (DeliveryInProgress); once the lease, the killed invocation's time,
    is over, the next retry takes the task over and sends it, once."""
    short_leases(runtime, monkeypatch)
    [task_id] = store_pending(receiver.url, 1, -500, "killed")
    event = batch_event(task_id)
    claimed, over = threading.Event(), threading.Event()

    def killed_after_its_claim(http_response, context: dict, **_: object) -> None:
        if context.get("claim") and http_response.status_code == 200 and not claimed.is_set():
            claimed.set()
            over.wait()
            raise Killed

    def killed_invocation() -> None:
        with pytest.raises(Killed):
            runtime.invoke("WebhookExecutorFunction", event)

    first = threading.Thread(target=killed_invocation)
    hooks = (
        ("before-parameter-build.dynamodb.UpdateItem", _note_claims),
        ("after-call.dynamodb.UpdateItem", killed_after_its_claim),
    )
    with hooked(tables(), *hooks):
        first.start()
        try:
            assert claimed.wait(30)
            killed_attempt = stored(task_id)["attempt"]
            with pytest.raises(DeliveryInProgress):
                runtime.invoke("WebhookExecutorFunction", event)
            assert receiver.received() == []
            wait_out_the_lease(task_id)
            retried = runtime.invoke("WebhookExecutorFunction", event)
        finally:
            over.set()
            first.join()
    assert retried == {"tasks": 1, "claimed": 1, "fired": 1}
    item = stored(task_id)
    assert item["status"] == "SUCCEEDED" and item["attempt"] != killed_attempt
    assert [a.task_id for a in receiver.received()] == [task_id]


@pytest.mark.slow
def test_a_superseded_attempts_late_final_mark_is_refused_and_nothing_sent_again(
    runtime, receiver, monkeypatch
):
    """Fire's invocation sends, and its final mark is held up on the way (a network that
    delays it) past the invocation's time: the invocation cuts it off, logs the send and
    fails in its time. Fire's retry, once the lease is over, takes the task over, finds
    the send in the log and sends nothing. When the late mark lands, the table refuses
    it: the task is the retry's. One send in all."""
    short_leases(runtime, monkeypatch)
    [task_id] = store_pending(receiver.url, 1, -500, "superseded")
    event = batch_event(task_id)
    held, taken_over, late = threading.Event(), threading.Event(), []

    def mark_held_until_taken_over(params: dict, context: dict, **_: object) -> None:
        if ":status" in params.get("ExpressionAttributeValues", {}) and not held.is_set():
            held.set()
            context["late"] = True
            taken_over.wait(60)

    def the_late_marks_answer(http_response, context: dict, **_: object) -> None:
        if context.get("late"):
            late.append(http_response.status_code)

    hooks = (
        ("before-parameter-build.dynamodb.UpdateItem", mark_held_until_taken_over),
        ("after-call.dynamodb.UpdateItem", the_late_marks_answer),
    )
    with hooked(tables(), *hooks):
        try:
            with pytest.raises(TableUnavailable, match="no answer before"):
                runtime.invoke("WebhookExecutorFunction", event)
            [sent_first] = receiver.received()
            wait_out_the_lease(task_id)
            retried = runtime.invoke("WebhookExecutorFunction", event)
        finally:
            taken_over.set()
        deadline = time.monotonic() + 10
        while not late and time.monotonic() < deadline:
            time.sleep(0.05)
    assert late == [400]  # ConditionalCheckFailed: the task is the retry's
    assert retried == {"tasks": 1, "claimed": 1, "fired": 1}
    item = stored(task_id)
    assert item["status"] == "SUCCEEDED"
    assert receiver.received() == [sent_first]  # one send: the retry read the sent log


def test_each_send_whose_task_changed_under_its_claim_is_counted_unrecorded(runtime, receiver):
    """Both tasks of a batch are sent, and before each final mark a later attempt takes the
    task over (as a retry does once a lease is over): the table refuses both marks, and the
    invocation's answer counts each send it could not record, for the operator's metric."""
    ids = store_pending(receiver.url, 2, -200, "unrecorded")
    event = batch_event(ids[0])
    event["tasks"] += batch_event(ids[1])["tasks"]
    unhooked = boto3.client("dynamodb")  # another client: its calls meet no hook of this test

    def taken_over_first(params: dict, **_: object) -> None:
        if ":status" in params.get("ExpressionAttributeValues", {}):
            unhooked.update_item(
                TableName=params["TableName"],
                Key={"task_id": {"S": params["Key"]["task_id"]}},
                UpdateExpression="SET attempt = :later",
                ExpressionAttributeValues={":later": {"S": "a-later-attempt"}},
            )

    with hooked(tables(), ("before-parameter-build.dynamodb.UpdateItem", taken_over_first)):
        answer = runtime.invoke("WebhookExecutorFunction", event)
    assert answer == {"tasks": 2, "claimed": 2, "fired": 2, "unrecorded": 2}
    assert sorted(a.task_id for a in receiver.received()) == ids
    assert {stored(task_id)["status"] for task_id in ids} == {"RUNNING"}  # the later attempt's
