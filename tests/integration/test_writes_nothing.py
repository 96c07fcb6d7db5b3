"""What Tocsin must refuse or find nothing to do for, on one runtime for the module (as
deployed by default: no internal host allowed). After every test each table and queue of
the stack is still empty and no execution has started, so a refusal that wrote anything
at all, anywhere, fails here; a runtime of their own for each would only see its table."""

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.conftest import all_schedules, all_tasks, call_api, webhook_task
from tests.integration.test_api import sns_task
from tests.integration.test_targets import sample
from tocsin import clock
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.settings import MAX_PAYLOAD_BYTES

SNS = {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"}
QUEUES = ("DeadLetterQueueUrl", "SubmitQueueUrl", "SubmitDeadLetterQueueUrl")


@pytest.fixture(scope="module")
def quiet() -> Iterator[EmbeddedRuntime]:
    with EmbeddedRuntime(finder_interval_s=None) as running:
        yield running


def written(runtime: EmbeddedRuntime) -> dict[str, Any]:
    """Every table holding items, queue holding messages, and the executions started."""
    dynamodb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    found: dict[str, Any] = {}
    for table in dynamodb.list_tables()["TableNames"]:
        if items := dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]:
            found[table] = items
    for output in QUEUES:
        attributes = sqs.get_queue_attributes(
            QueueUrl=runtime.outputs[output], AttributeNames=["All"]
        )["Attributes"]
        held = sum(int(attributes[name]) for name in attributes if "NumberOfMessages" in name)
        if held:
            found[output] = held
    if executions := [e.name for e in runtime.executions()]:
        found["executions"] = executions
    return found


@pytest.fixture(autouse=True)
def nothing_written(quiet: EmbeddedRuntime) -> Iterator[None]:
    assert written(quiet) == {}, "an earlier test of this module wrote"
    yield
    assert written(quiet) == {}


BAD_REQUESTS = [
    ("POST", "/tasks", "{not json", "body"),
    ("POST", "/tasks", "", "body"),
    ("POST", "/tasks", sns_task() | {"colour": "red"}, "colour"),
    ("POST", "/tasks", sns_task() | {"payload": {"n": 1}, "max_attempts": "many"}, "max_attempts"),
    ("POST", "/tasks", sns_task() | {"max_attempts": 186}, "max_attempts"),
    ("POST", "/tasks", sns_task() | {"retry": {"max_age_s": 30}}, "retry.max_age_s"),
    (
        "POST",
        "/tasks",
        sns_task() | {"retry": {"max_attempts": 3}, "max_attempts": 4},
        "max_attempts",
    ),
    ("POST", "/tasks", sns_task() | {"retry": {"backoff": 3}}, "retry.backoff"),
    ("POST", "/tasks", sns_task() | {"due_at": "2027-01-15T10:00:00"}, "due_at"),
    ("POST", "/tasks", sns_task() | {"due_at": "next tuesday"}, "due_at"),
    ("POST", "/tasks", sns_task() | {"due_at": "2036-01-01T00:00:00Z"}, "due_at"),
    ("POST", "/tasks", sns_task() | {"due_at": 12345}, "due_at"),
    ("POST", "/tasks", sns_task(due_in_ms=-2 * 365 * 86_400_000), "due_at"),
    ("POST", "/tasks", sns_task(due_at=None), "due_at"),
    ("POST", "/tasks", sns_task() | {"delay": 60}, "due_at"),
    ("POST", "/tasks", sns_task(due_at=None) | {"delay": -5}, "delay"),
    ("POST", "/tasks", sns_task(due_at=None) | {"delay": "P5000D"}, "delay"),
    ("POST", "/tasks", sns_task() | {"id": "white space"}, "id"),
    ("POST", "/tasks", sns_task() | {"id": "x" * 65}, "id"),
    ("POST", "/tasks", sns_task() | {"payload": "x" * MAX_PAYLOAD_BYTES}, "payload"),
    ("POST", "/tasks", sns_task() | {"type": "pigeon"}, "type"),
    (
        "POST",
        "/tasks",
        sns_task() | {"type": "webhook", "target": {"url": "ftp://a.example"}},
        "target.url",
    ),
    (
        "POST",
        "/tasks",
        sns_task() | {"type": "webhook", "target": {"url": "https://10.1.2.3/"}},
        "target.url",
    ),
    (
        "POST",
        "/tasks",
        sns_task() | {"target": {"topic_arn": "arn:aws:sns:nowhere"}},
        "target.topic_arn",
    ),
    ("POST", "/tasks", [1, 2, 3], "body"),
    ("POST", "/tasks", sns_task() | {"target": SNS | {"subject": "s" * 100}}, "target.subject"),
    ("POST", "/tasks", sns_task() | {"target": SNS | {"subject": "two\nlines"}}, "target.subject"),
    ("POST", "/tasks", sns_task() | {"target": SNS | {"subject": "bell\x07"}}, "target.subject"),
    ("GET", "/tasks?limit=0", None, "limit"),
    ("GET", "/tasks?limit=ten", None, "limit"),
    ("GET", "/tasks?status=LOST", None, "status"),
    ("GET", "/tasks?due_before=yesterday", None, "due_before"),
    ("GET", "/tasks?next=garbage", None, "next"),
    ("GET", "/tasks?colour=red", None, "colour"),
    ("GET", f"/tasks/{'x' * 65}", None, "id"),
    ("PATCH", "/tasks/t-1", {}, "body"),
    ("PATCH", "/tasks/t-1", {"type": "sqs"}, "type"),
    ("PATCH", "/tasks/t-1", {"due_at": "2027-01-15T10:00:00"}, "due_at"),
    ("PATCH", "/tasks/t-1", {"due_at": 1_800_000_000}, "due_at"),
]


SCHEDULE = {
    "expression": "rate(1 minute)",
    "type": "sns",
    "target": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"},
}


@pytest.mark.parametrize(
    ("method", "target", "one"),
    [
        ("POST", "/tasks", sns_task()),
        ("PATCH", "/tasks/t-1", {"payload": {"n": 2}}),
        ("POST", "/schedules", SCHEDULE),
        ("PATCH", "/schedules/s-1", {"state": "PAUSED"}),
    ],
)
def test_a_body_of_more_than_one_json_object_is_refused_on_every_route(quiet, method, target, one):
    """Two valid bodies in an array: refused whole, naming `body` (Powertools validated an
    array by its first element, so POST /tasks made the first task and dropped the second);
    so is a JSON value that is no object at all."""
    for body in ([one, one], "null", "42"):
        status, error = call_api(quiet, method, target, body)
        assert status == 400 and error["error"]["field"] == "body", (body, error)
        assert "one JSON object" in error["error"]["message"]


@pytest.mark.parametrize(("method", "target", "body", "field"), BAD_REQUESTS)
def test_bad_requests_get_a_4xx_naming_the_field_and_write_nothing(
    quiet, method, target, body, field
):
    status, error = call_api(quiet, method, target, body)
    assert 400 <= status < 500, error
    assert error["error"]["field"] == field and error["error"]["message"]
    assert all_tasks() == []


def test_a_request_without_an_iam_identity_is_refused(quiet):
    status, error = call_api(quiet, "GET", "/tasks", principal=None)
    assert status == 401 and error["error"]["code"] == "unauthenticated"


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080/hook", "https://localhost/hook", "https://10.0.0.5/", "https://[::1]/"],
)
def test_an_internal_target_is_refused_unless_its_host_is_allowed(quiet, url):
    body = webhook_task(url, clock.now_ms() + 60_000, "inside")
    status, error = call_api(quiet, "POST", "/tasks", body)
    assert status == 400 and error["error"]["field"] == "target.url"
    assert "internal address" in error["error"]["message"]


def test_bad_schedules_are_refused_naming_the_field_and_nothing_is_written(quiet):
    now = clock.now_ms()
    good = {
        "expression": "rate(1 minute)",
        "type": "sns",
        "target": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"},
    }
    cases = [
        ({"expression": "cron(0 10 * * ?)"}, "expression", "needs 6"),
        ({"expression": "rate(0 minutes)"}, "expression", "at least 1"),
        ({"expression": "rate(5 fortnights)"}, "expression", "seconds, minutes"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "IANA"),
        (
            {"start_at": clock.to_iso(now + 7_200_000), "end_at": clock.to_iso(now + 3_600_000)},
            "end_at",
            "after start_at",
        ),
        ({"expression": "at(2020-01-01T00:00:00)"}, "expression", "no occurrence"),
        ({"catch_up": "all"}, "catch_up", ""),
        ({"target": {"topic_arn": "nope"}}, "target.topic_arn", ""),
        ({"id": "has.dot"}, "id", ""),
        ({"start_at": 12345}, "start_at", "ISO-8601"),
    ]
    for change, field, says in cases:
        status, reply = call_api(quiet, "POST", "/schedules", good | change)
        assert status == 400, (change, reply)
        assert reply["error"]["field"] == field and reply["error"]["code"] == "invalid_schedule"
        assert says in reply["error"]["message"]
    status, reply = call_api(quiet, "GET", "/schedules?next=garbage")
    assert status == 400
    assert (reply["error"]["field"], reply["error"]["code"]) == ("next", "invalid_schedule")
    assert all_schedules() == [] and all_tasks() == []


def test_a_sample_event_whose_task_is_not_there_claims_nothing(quiet):
    assert quiet.invoke("WebhookExecutorFunction", sample("webhook")) == {
        "tasks": 1,
        "claimed": 0,
    }
