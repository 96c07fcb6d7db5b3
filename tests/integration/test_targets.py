"""Every task type fires once with its payload, through the real machine; every sample event
in events/ runs through its handler, on the task it names."""

import io
import json
import zipfile
from datetime import datetime
from pathlib import Path

import boto3
import pytest

from tests.conftest import store_task, stored, wait_for_status
from tocsin import clock
from tocsin.local.stack import ACCOUNT_ID, REGION
from tocsin.submit import submit_task

EVENTS = Path(__file__).parents[2] / "events"


SAMPLE_PAYLOAD = {"order": 42, "action": "remind"}
SAMPLE_TARGETS = {
    "email": {"source": "scheduler@example.com", "to": ["user@example.com"], "subject": "Hi"},
    "eventbridge": {
        "event_bus": "tocsin-sample",
        "detail_type": "tocsin.sample",
        "source": "tocsin",
    },
    "lambda": {
        "function_arn": "arn:aws:lambda:us-east-1:123456789012:function:tocsin-sample-target"
    },
    "sns": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:tocsin-sample"},
    "sqs": {"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/tocsin-sample"},
}


def sample(task_type: str) -> dict:
    return json.loads((EVENTS / f"execute_{task_type}.json").read_text())


def store_sample_task(task_type: str, target: dict, payload=SAMPLE_PAYLOAD) -> dict:
    """The PENDING task a sample event names (due in the past: its gate lets go at once)."""
    [named] = sample(task_type)["tasks"]
    body = {
        "id": named["task_id"],
        "due_at": clock.to_iso(named["due_ms"]),
        "type": task_type,
        "target": target,
        "payload": payload,
    }
    store_task(body, "sample", submitted_ms=named["due_ms"])  # a due_at that old is refused now
    return named


def queue(name: str) -> tuple[str, str]:
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    return url, arn["QueueArn"]


def drain(url: str) -> list[dict]:
    reply = boto3.client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    return [json.loads(m["Body"]) for m in reply.get("Messages", [])]


def envelope_payloads(envelopes: list[dict]) -> list:
    return [e["payload"] for e in envelopes]


class Lambda:
    def setup(self, runtime) -> None:
        role = boto3.client("iam").create_role(RoleName="sample", AssumeRolePolicyDocument="{}")
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("app.py", "def handler(e, c): return e\n")
        boto3.client("lambda").create_function(
            FunctionName="tocsin-sample-target",
            Runtime="python3.13",
            Role=role["Role"]["Arn"],
            Handler="app.handler",
            Code={"ZipFile": archive.getvalue()},
        )
        self.runtime = runtime

    def delivered(self) -> list:
        calls = self.runtime.foreign_invocations
        return [event["payload"] for name, event in calls if name == "tocsin-sample-target"]


class EventBridge:
    def setup(self, runtime) -> None:
        self.url, arn = queue("events-sink")
        events = boto3.client("events")
        events.create_event_bus(Name="tocsin-sample")
        pattern = json.dumps({"source": ["tocsin"]})
        events.put_rule(Name="sample", EventBusName="tocsin-sample", EventPattern=pattern)
        events.put_targets(
            Rule="sample", EventBusName="tocsin-sample", Targets=[{"Id": "sink", "Arn": arn}]
        )

    def delivered(self) -> list:
        return [event["detail"]["payload"] for event in drain(self.url)]


class Sqs:
    def setup(self, runtime) -> None:
        self.url, _ = queue("tocsin-sample")

    def delivered(self) -> list:
        return envelope_payloads(drain(self.url))


class Sns:
    def setup(self, runtime) -> None:
        self.url, arn = queue("sns-sink")
        topic = boto3.client("sns").create_topic(Name="tocsin-sample")["TopicArn"]
        boto3.client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)

    def delivered(self) -> list:
        return envelope_payloads([json.loads(m["Message"]) for m in drain(self.url)])


class Email:
    def setup(self, runtime) -> None:
        boto3.client("ses").verify_email_identity(EmailAddress="scheduler@example.com")

    def delivered(self) -> list:
        from moto.ses.models import ses_backends

        return [m.body for m in ses_backends[ACCOUNT_ID][REGION].sent_messages]


TARGETS = {"lambda": Lambda, "eventbridge": EventBridge, "sqs": Sqs, "sns": Sns, "email": Email}


@pytest.mark.parametrize("task_type", sorted(TARGETS))
def test_task_fires_once_at_its_aws_target(runtime, task_type):
    target = TARGETS[task_type]()
    target.setup(runtime)
    payload = "Renew today." if task_type == "email" else {"order": 42, "type": task_type}
    due = clock.now_ms() + 2500
    task_id = f"fire-{task_type}"
    submit_task(
        {
            "id": task_id,
            "due_at": clock.to_iso(due),
            "type": task_type,
            "target": SAMPLE_TARGETS[task_type],
            "payload": payload,
        },
        owner="alice",
    )
    item = wait_for_status(task_id, {"SUCCEEDED", "FAILED"})
    assert item["status"] == "SUCCEEDED", item.get("error")
    assert target.delivered() == [payload]
    assert item["fired_at"] >= clock.to_iso(due)


@pytest.mark.parametrize("task_type", sorted(TARGETS))
def test_sample_event_runs_through_its_executor(runtime, task_type):
    target = TARGETS[task_type]()
    target.setup(runtime)
    payload = "Renew today." if task_type == "email" else SAMPLE_PAYLOAD
    named = store_sample_task(task_type, SAMPLE_TARGETS[task_type], payload)
    function = {"eventbridge": "EventBridge", "sqs": "Sqs", "sns": "Sns"}.get(
        task_type, task_type.capitalize()
    )
    result = runtime.invoke(f"{function}ExecutorFunction", sample(task_type))
    assert result == {"tasks": 1, "claimed": 1, "fired": 1}
    assert target.delivered() == [payload]
    item = stored(named["task_id"])
    assert item["status"] == "SUCCEEDED"
    assert (
        int(item["lateness_ms"])
        == clock.to_ms(datetime.fromisoformat(item["fired_at"])) - named["due_ms"]
        > 0
    )


def test_sample_webhook_event_runs_through_its_executor(runtime, receiver):
    store_sample_task("webhook", {"url": f"{receiver.url}/sample"})  # not example.com
    result = runtime.invoke("WebhookExecutorFunction", sample("webhook"))
    assert result == {"tasks": 1, "claimed": 1, "fired": 1}
    assert [json.loads(a.body) for a in receiver.received()] == [SAMPLE_PAYLOAD]
    assert json.loads(stored("sample-webhook")["result"]) == {"status": 200}


def test_fifo_queue_deduplicates_on_the_idempotency_key(runtime):
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="orders.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    store_sample_task("sqs", {"queue_url": url, "message_group_id": "orders"})
    runtime.invoke("SqsExecutorFunction", sample("sqs"))
    [message] = sqs.receive_message(
        QueueUrl=url, MessageSystemAttributeNames=["MessageDeduplicationId", "MessageGroupId"]
    )["Messages"]
    assert message["Attributes"] == {
        "MessageDeduplicationId": "sample-sqs:1",
        "MessageGroupId": "orders",
    }
