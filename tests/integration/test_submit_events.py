"""Submitting through the submit queue and the EventBridge rule, with partial batch failures."""

import json
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError

from tests.conftest import hooked, stored, table, wait_for_status, webhook_task
from tests.integration.test_throttling import throttle
from tocsin import aws, clock
from tocsin.local.server import api_event
from tocsin.local.stack import ACCOUNT_ID
from tocsin.settings import settings

EVENTS = Path(__file__).parents[2] / "events"
DAY_MS = 86_400_000


def submission(task_id: str, **changes: object) -> dict:
    return {
        "id": task_id,
        "delay": "P1D",
        "type": "webhook",
        "target": {"url": "https://hooks.example.com/welcome"},
        "payload": {"user": task_id},
        **changes,
    }


def written(task_id: str) -> bool:
    key = {"task_id": task_id}
    return "Item" in table(settings().tasks_table).get_item(Key=key, ConsistentRead=True)


def parked(runtime) -> list[dict]:
    """Messages on the submit dead-letter queue, with their error attributes."""
    reply = boto3.client("sqs").receive_message(
        QueueUrl=runtime.outputs["SubmitDeadLetterQueueUrl"],
        MaxNumberOfMessages=10,
        MessageAttributeNames=["All"],
    )
    return reply.get("Messages", [])


def test_sample_queue_event_schedules_the_good_and_parks_the_bad(runtime):
    event = json.loads((EVENTS / "submit_sqs.json").read_text())
    reply = runtime.invoke("SubmitFunction", event)
    assert reply == {"batchItemFailures": []}
    task = stored("sample-queued")
    sent_ms = int(event["Records"][0]["attributes"]["SentTimestamp"])
    assert int(task["due_ms"]) == sent_ms + DAY_MS  # the delay counts from the send
    assert task["owner"] == "AIDASAMPLEUSER0000001"
    [message] = parked(runtime)
    assert json.loads(message["Body"])["id"] == "sample-refused"
    attributes = message["MessageAttributes"]
    assert attributes["error_field"]["StringValue"] == "type"
    assert "type" in attributes["error"]["StringValue"]


def test_sample_eventbridge_event_schedules_from_the_event_time(runtime):
    event = json.loads((EVENTS / "submit_eventbridge.json").read_text())
    assert runtime.invoke("SubmitFunction", event) == {"batchItemFailures": []}
    task = stored("sample-event")
    assert task["due_at"] == "2026-11-24T10:00:00.000Z"  # event time + P1D
    assert task["owner"] == f"events:{ACCOUNT_ID}"


def test_messages_sent_to_the_queue_are_scheduled(runtime):
    sqs = boto3.client("sqs")
    before = clock.now_ms()
    for i in range(3):
        sqs.send_message(
            QueueUrl=runtime.outputs["SubmitQueueUrl"],
            MessageBody=json.dumps(submission(f"q-{i}", delay=60 * (i + 1))),
        )
    sqs.send_message(QueueUrl=runtime.outputs["SubmitQueueUrl"], MessageBody="not json")
    deadline = time.monotonic() + 30  # a receive may hand over fewer than the queue holds
    while not all(written(f"q-{i}") for i in range(3)) and time.monotonic() < deadline:
        runtime.poll_queues()
        time.sleep(0.05)
    while runtime.poll_queues():
        pass
    for i in range(3):
        task = stored(f"q-{i}")
        assert task["status"] == "PENDING"
        assert (
            before + 60_000 * (i + 1) - 1000
            <= int(task["due_ms"])
            <= clock.now_ms() + 60_000 * (i + 1)
        )
    [message] = parked(runtime)
    assert message["Body"] == "not json"
    assert message["MessageAttributes"]["error_field"]["StringValue"] == "body"


@pytest.mark.slow
def test_a_queued_batch_due_soon_starts_packed_and_fires_each_task_once(runtime, receiver):
    """Six messages of one batch, due within the look-ahead in one second: stored, then
    started together as one execution (the finder's packing), not one each."""
    due = (clock.now_ms() // 1000 + 15) * 1000  # wakes 7 s on at the earliest: looked at first
    sqs = boto3.client("sqs")
    for i in range(6):
        body = webhook_task(receiver.url, due + 100 * i, f"packed-{i}")
        sqs.send_message(QueueUrl=runtime.outputs["SubmitQueueUrl"], MessageBody=json.dumps(body))
    assert runtime.poll_queues() == 6
    ids = [f"packed-{i}" for i in range(6)]
    [execution] = runtime.executions()
    assert {stored(task_id)["status"] for task_id in ids} == {"PENDING"}  # till the claims
    for task_id in ids:
        assert wait_for_status(task_id, {"SUCCEEDED"})["execution"] == execution.name
    assert sorted(a.task_id for a in receiver.received()) == ids


@pytest.mark.slow
def test_a_queued_batch_whose_start_fails_is_kept_and_fires_once(
    runtime, receiver, monkeypatch, no_backoff
):
    """The batch is stored, but Step Functions refuses its start past botocore's retries:
    the messages are not delivered again (their tasks are stored), the tasks wait in a
    check shard, and the reconciler's next look starts them; each fires once."""
    due = (clock.now_ms() // 1000 + 15) * 1000
    sqs = boto3.client("sqs")
    ids = [f"unstarted-{i}" for i in range(3)]
    for task_id in ids:
        body = json.dumps(webhook_task(receiver.url, due, task_id))
        sqs.send_message(QueueUrl=runtime.outputs["SubmitQueueUrl"], MessageBody=body)

    throttle(monkeypatch, times=99)
    assert runtime.poll_queues() == 3
    assert runtime.poll_queues() == 0  # none comes back
    assert list(runtime.executions()) == []
    assert all(stored(task_id)["gsi_pk"].startswith("check-") for task_id in ids)
    monkeypatch.undo()
    report = runtime.run_finder()
    assert (report["started_late"], report["found"]) == (3, 0)  # not the finder's to find
    for task_id in ids:
        wait_for_status(task_id, {"SUCCEEDED"})
    assert sorted(a.task_id for a in receiver.received()) == ids


def test_queue_and_events_refuse_a_numeric_or_long_past_due_at_and_park_it(runtime):
    bad = {
        "epoch-number": submission("epoch-number", delay=None, due_at=1_800_000_000),
        "year-typo": submission("year-typo", delay=None, due_at="2025-11-25T09:00:00Z"),
    }
    sqs = boto3.client("sqs")
    sqs.send_message(
        QueueUrl=runtime.outputs["SubmitQueueUrl"], MessageBody=json.dumps(bad["epoch-number"])
    )
    boto3.client("events").put_events(
        Entries=[
            {
                "Source": "com.example.billing",
                "DetailType": "tocsin.submit",
                "Detail": json.dumps(bad["year-typo"]),
            }
        ]
    )
    while runtime.poll_queues():
        pass
    bodies = [(json.loads(m["Body"]), m) for m in parked(runtime)]
    refused = {body.get("detail", body)["id"]: m for body, m in bodies}  # an event, or a task
    assert set(refused) == set(bad)
    for message in refused.values():
        assert message["MessageAttributes"]["error_field"]["StringValue"] == "due_at"
    table = boto3.resource("dynamodb").Table(runtime.tasks_table)
    assert all("Item" not in table.get_item(Key={"task_id": task_id}) for task_id in bad)


def test_events_with_detail_type_tocsin_submit_are_scheduled(runtime):
    boto3.client("events").put_events(
        Entries=[
            {
                "Source": "com.example.signup",
                "DetailType": "tocsin.submit",
                "Detail": json.dumps(submission("from-event", delay="PT1H")),
            },
            {
                "Source": "com.example.signup",
                "DetailType": "something.else",
                "Detail": json.dumps(submission("not-for-us")),
            },
        ]
    )
    assert runtime.poll_queues() == 1
    task = stored("from-event")
    assert task["owner"] == f"events:{ACCOUNT_ID}" and task["status"] == "PENDING"


def test_a_failure_that_may_pass_is_reported_and_the_message_comes_back(runtime):
    """Only the message whose write failed is reported to Lambda; the rest are scheduled."""
    sqs = boto3.client("sqs")
    queue = runtime.outputs["SubmitQueueUrl"]
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"VisibilityTimeout": "0"})
    for i in range(3):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(submission(f"b-{i}")))
    client = aws.resource("dynamodb").meta.client
    failures = []

    def outage(params, **_):
        if params["Item"]["task_id"] == "b-1" and not failures:
            failures.append(params["Item"]["task_id"])
            raise EndpointConnectionError(endpoint_url="https://dynamodb")

    with hooked(client, ("before-parameter-build.dynamodb.PutItem", outage)):
        assert runtime.poll_queues() == 3
    assert failures == ["b-1"]
    assert {stored(f"b-{i}")["status"] for i in (0, 2)} == {"PENDING"}
    while runtime.poll_queues():  # b-1 is visible again and goes through
        pass
    assert stored("b-1")["status"] == "PENDING"
    assert parked(runtime) == []


def test_a_mixed_batch_reports_exactly_the_message_that_may_pass_later(runtime):
    """Scheduled, refused (parked with its error: not to be retried) and failed on the way
    (reported, so Lambda returns it to the queue): only the last is a batch item failure."""
    [template, _] = json.loads((EVENTS / "submit_sqs.json").read_text())["Records"]
    bodies = {
        "m-good": json.dumps(submission("mixed-good")),
        "m-refused": json.dumps({**submission("mixed-refused"), "type": "carrier-pigeon"}),
        "m-outage": json.dumps(submission("mixed-outage")),
    }
    records = [{**template, "messageId": mid, "body": body} for mid, body in bodies.items()]
    client = aws.resource("dynamodb").meta.client

    def outage(params, **_):
        if params["Item"]["task_id"] == "mixed-outage":
            raise EndpointConnectionError(endpoint_url="https://dynamodb")

    with hooked(client, ("before-parameter-build.dynamodb.PutItem", outage)):
        reply = runtime.invoke("SubmitFunction", {"Records": records})
    assert reply == {"batchItemFailures": [{"itemIdentifier": "m-outage"}]}
    assert stored("mixed-good")["owner"] == template["attributes"]["SenderId"]  # scheduled
    [message] = parked(runtime)
    assert json.loads(message["Body"])["id"] == "mixed-refused"
    assert message["MessageAttributes"]["error_field"]["StringValue"] == "type"


def test_a_queued_task_belongs_to_the_sender_the_api_knows(runtime):
    """SQS's SenderId and API Gateway's userId name a principal the same way: a role's
    sessions share its tasks, each federated user of an account has its own."""
    [template, _] = json.loads((EVENTS / "submit_sqs.json").read_text())["Records"]
    senders = {"fed-alice": "123456789012:alice", "role-ci": "AROAROLE:ci-run-1"}
    records = [
        {
            **template,
            "messageId": task_id,
            "body": json.dumps(submission(task_id)),
            "attributes": {**template["attributes"], "SenderId": sender},
        }
        for task_id, sender in senders.items()
    ]
    assert runtime.invoke("SubmitFunction", {"Records": records}) == {"batchItemFailures": []}

    def get(task_id: str, principal: str) -> int:
        return runtime.invoke(
            "ApiFunction", api_event("GET", f"/tasks/{task_id}", None, principal)
        )["statusCode"]

    assert get("fed-alice", "123456789012:alice") == 200
    assert get("fed-alice", "123456789012:bob") == 404
    assert get("role-ci", "AROAROLE:console-session") == 200
    assert get("role-ci", "AROAOTHERROLE:ci-run-1") == 404
