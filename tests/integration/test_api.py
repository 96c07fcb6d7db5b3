"""The task API through its Lambda handler, with the HTTP API events API Gateway sends."""

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import EndpointConnectionError
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from moto.core.botocore_stubber import MockRawResponse

from tests.conftest import (
    all_tasks,
    call_api,
    hooked,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import aws, clock, dispatch, lifecycle, store
from tocsin.batch_read import UNPROCESSED_TRIES
from tocsin.local.runtime import RESPONSE_LIMIT_BYTES, LocalFunction, ResponseSizeTooLarge
from tocsin.local.server import api_event
from tocsin.measure.chaos import wake_ms
from tocsin.model import owner_id
from tocsin.settings import settings

EVENTS = Path(__file__).parents[2] / "events"
HOUR_MS = 3_600_000


def sns_task(task_id: str | None = "t-1", due_in_ms: int = HOUR_MS, **changes: Any) -> dict:
    body = {
        "due_at": clock.to_iso(clock.now_ms() + due_in_ms),
        "type": "sns",
        "target": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"},
        "payload": {"n": 1},
        **changes,
    }
    if task_id:
        body["id"] = task_id
    return body


def test_sample_events_run_through_the_handler_in_order(runtime):
    replies = {}
    for name in ("submit", "get", "list", "reschedule", "cancel"):
        event = json.loads((EVENTS / f"api_{name}.json").read_text())
        reply = runtime.invoke("ApiFunction", event)
        replies[name] = (reply["statusCode"], json.loads(reply["body"]))
    assert replies["submit"][0] == 201 and replies["submit"][1]["id"] == "sample-api"
    assert replies["get"] == (200, replies["submit"][1])
    assert [t["id"] for t in replies["list"][1]["tasks"]] == ["sample-api"]
    assert replies["reschedule"][0] == 200 and replies["reschedule"][1]["version"] == 2
    assert replies["reschedule"][1]["payload"] == {"hello": "again"}
    assert replies["cancel"][0] == 200 and replies["cancel"][1]["status"] == "CANCELLED"


def test_submit_creates_then_recognises_the_same_body_and_refuses_another(runtime):
    body = sns_task()
    status, created = call_api(runtime, "POST", "/tasks", body)
    assert status == 201 and created["status"] == "PENDING" and created["version"] == 1
    assert created["max_attempts"] == 25 and created["attempts"] == 0
    assert call_api(runtime, "POST", "/tasks", body) == (200, created)
    status, error = call_api(runtime, "POST", "/tasks", {**body, "payload": {"n": 2}})
    assert status == 409 and error["error"]["field"] == "id"
    assert call_api(runtime, "GET", "/tasks/t-1") == (200, created)


def test_a_tasks_retry_policy_is_kept_and_shown_and_max_attempts_is_its_count(runtime):
    policy = {"max_attempts": 40, "max_age_s": 7200, "min_backoff_s": 0.5, "max_backoff_s": 600}
    status, task = call_api(runtime, "POST", "/tasks", sns_task() | {"retry": policy})
    assert status == 201 and task["retry"] == policy and task["max_attempts"] == 40
    assert call_api(runtime, "GET", "/tasks/t-1")[1]["retry"] == policy
    status, task = call_api(runtime, "POST", "/tasks", sns_task("t-2") | {"max_attempts": 2})
    assert status == 201 and task["retry"]["max_attempts"] == 2
    assert task["retry"]["max_age_s"] == 86_400  # the defaults, as EventBridge Scheduler's


def test_submit_with_a_delay_generates_an_id_and_counts_from_now(runtime):
    before = clock.now_ms()
    status, task = call_api(
        runtime, "POST", "/tasks", sns_task(None, due_at=None) | {"delay": "PT2H"}
    )
    after = clock.now_ms()
    assert status == 201 and len(task["id"]) == 32
    due_ms = clock.to_ms(datetime.fromisoformat(task["due_at"]))
    assert before + 2 * HOUR_MS <= due_ms <= after + 2 * HOUR_MS


OTHER_PRINCIPALS = [
    ("alice", "bob"),
    ("AIDAALICE", "AIDABOB"),
    ("AROADEPLOYER:alice", "AROAAUDITOR:alice"),
    ("123456789012:alice", "123456789012:bob"),  # federated users of one account
    ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/bob"),
]


# Named, not by their values: an ARN's "::" in a test's id reads as a path's separator.
@pytest.mark.parametrize(
    ("owner", "other"),
    OTHER_PRINCIPALS,
    ids=["local-name", "iam-user-id", "role-session-id", "federated-user", "iam-user-arn"],
)
def test_another_principal_can_neither_see_nor_change_a_task_on_any_route(runtime, owner, other):
    for i in range(3):
        call_api(runtime, "POST", "/tasks", sns_task(f"t-{i}", due_in_ms=HOUR_MS * (i + 1)), owner)
    originals = [call_api(runtime, "GET", f"/tasks/t-{i}", principal=owner)[1] for i in range(3)]
    _, first_page = call_api(runtime, "GET", "/tasks?limit=1", principal=owner)
    assert first_page["next"]  # the owner has more pages: the token below is a real one

    after, before = clock.to_iso(clock.now_ms()), clock.to_iso(clock.now_ms() + 9 * HOUR_MS)
    listings = [
        "/tasks",
        "/tasks?status=PENDING",
        "/tasks?limit=1",
        f"/tasks?due_after={after}&due_before={before}&status=PENDING&limit=100",
    ]
    for listing in listings:
        reply = call_api(runtime, "GET", listing.replace("+", "%2B"), principal=other)
        assert reply == (200, {"tasks": [], "next": None})
    status, error = call_api(runtime, "GET", f"/tasks?next={first_page['next']}", principal=other)
    assert status == 400 and error["error"]["field"] == "next"
    changes = ("GET", None), ("DELETE", None), ("PATCH", {"delay": 60}), ("PATCH", {"payload": 1})
    for method, body in changes:
        status, error = call_api(runtime, method, "/tasks/t-0", body, principal=other)
        assert status == 404 and error["error"]["code"] == "not_found"
    status, error = call_api(runtime, "POST", "/tasks", sns_task("t-0"), other)  # the same body
    assert status == 409 and "payload" not in json.dumps(error)

    assert [
        call_api(runtime, "GET", f"/tasks/t-{i}", principal=owner)[1] for i in range(3)
    ] == originals
    assert {item["owner"] for item in all_tasks()} == {owner_id(owner)}  # bob wrote nothing


@pytest.mark.parametrize(
    ("session", "another"),
    [
        ("AROAROLE:session-1", "AROAROLE:session-2"),
        (
            "arn:aws:sts::123456789012:assumed-role/Deployer/session-1",
            "arn:aws:sts::123456789012:assumed-role/Deployer/session-2",
        ),
    ],
    ids=["role-session-id", "assumed-role-arn"],
)
def test_a_role_sees_its_tasks_from_every_session(runtime, session, another):
    call_api(runtime, "POST", "/tasks", sns_task(), principal=session)
    status, task = call_api(runtime, "GET", "/tasks/t-1", principal=another)
    assert status == 200 and task["id"] == "t-1"
    assert call_api(runtime, "DELETE", "/tasks/t-1", principal=another)[0] == 200


def test_a_cancelled_task_is_deleted_by_ttl_after_the_retention(runtime):
    """CANCELLED is final: the task gets `expires_at`, as SUCCEEDED and FAILED ones do, and
    DynamoDB's TTL deletes it RetentionDays after the cancel (before, it stayed for good)."""
    call_api(runtime, "POST", "/tasks", sns_task("t-1"))
    before_s = clock.now_ms() // 1000
    assert call_api(runtime, "DELETE", "/tasks/t-1")[0] == 200
    after_s = clock.now_ms() // 1000
    retention_s = settings().retention_days * 86_400
    assert before_s + retention_s <= int(stored("t-1")["expires_at"]) <= after_s + retention_s + 1


def test_a_page_of_tasks_with_large_payloads_fits_lambdas_response(runtime):
    """A hundred tasks of 60 KB payloads: their page was 6 MB with the payloads, past what
    Lambda answers (an API Gateway caller got a 500 on AWS). A listing shows summaries; a
    task's own GET still has its target and payload."""
    payload = {"blob": "x" * 60_000}
    for i in range(100):
        body = sns_task(f"big-{i:03}", due_in_ms=HOUR_MS + i) | {"payload": payload}
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    status, page = call_api(runtime, "GET", "/tasks?limit=100")
    assert status == 200 and [t["id"] for t in page["tasks"]] == [f"big-{i:03}" for i in range(100)]
    assert all("payload" not in t and "target" not in t for t in page["tasks"])
    assert page["tasks"][0]["status"] == "PENDING"
    if page["next"]:  # DynamoDB stops at the limit and may say more follow: none do
        assert call_api(runtime, "GET", f"/tasks?limit=100&next={page['next']}")[1]["tasks"] == []
    status, task = call_api(runtime, "GET", "/tasks/big-007")
    assert status == 200 and task["payload"] == payload and task["target"]["topic_arn"]


def test_a_page_stops_short_of_its_size_and_the_next_goes_on(runtime, monkeypatch):
    """Summaries are small, but a result or an error has no fixed size: a page stops before
    MAX_PAGE_BYTES of them (here, one byte: a page holds its first task only), and `next`
    continues from its last task."""
    for i in range(7):
        call_api(runtime, "POST", "/tasks", sns_task(f"t-{i}", due_in_ms=HOUR_MS + i))
    monkeypatch.setattr(lifecycle, "MAX_PAGE_BYTES", 1)
    pages, token = [], None
    while True:
        _, page = call_api(runtime, "GET", "/tasks?limit=100" + (f"&next={token}" if token else ""))
        pages.append([t["id"] for t in page["tasks"]])
        if not (token := page["next"]):
            break
    assert pages == [[f"t-{i}"] for i in range(7)]


def test_a_status_filtered_listing_reads_a_bounded_part_of_the_index_a_request(
    runtime, monkeypatch
):
    """Two failed tasks among an owner's 450: each request reads at most
    STATUS_READ_LIMIT of the owner's index entries and answers what it found with a token
    to go on from, so it answers at once however many tasks the owner holds; following
    the tokens finds both. (A limit of 200 here keeps the owner small.)"""
    monkeypatch.setattr(store, "STATUS_READ_LIMIT", 200)
    later = clock.now_ms() + HOUR_MS
    for i in range(450):
        store_task(webhook_task("https://example.com/hook", later + i, f"many-{i:03d}"))
    table = boto3.resource("dynamodb").Table(settings().tasks_table)
    for task_id in ("many-120", "many-440"):
        table.update_item(
            Key={"task_id": task_id},
            UpdateExpression="SET #s = :failed",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":failed": "FAILED"},
        )
    read: list[int] = []

    def count(parsed: dict, **_: Any) -> None:
        read[-1] += len(parsed.get("Items", []))

    found, token = [], None
    with hooked(aws.resource("dynamodb").meta.client, ("after-call.dynamodb.Query", count)):
        while True:
            read.append(0)
            path = "/tasks?status=FAILED&limit=100" + (f"&next={token}" if token else "")
            status, page = call_api(runtime, "GET", path)
            assert status == 200
            found += [task["id"] for task in page["tasks"]]
            token = page["next"]
            if not token:
                break
    assert found == ["many-120", "many-440"]
    assert read == [200, 200, 50]  # entries read by each request


@pytest.mark.slow
def test_a_due_soon_start_that_hangs_is_left_to_the_reconciler_and_the_request_answers(
    runtime, receiver, monkeypatch
):
    """Step Functions does not answer the start of a task due soon: the API answers 201
    once START_WITHIN_MS is up (1 s here), not when botocore's retries end (over a minute,
    past the API's 29 s), with the task in a check shard; the reconciler's next look starts
    it, and it fires once."""
    monkeypatch.setattr(dispatch, "START_WITHIN_MS", 1000)
    released, hung = threading.Event(), []

    def hang_the_first(**_: Any) -> None:
        if not hung:
            hung.append(clock.now_ms())
            released.wait(60)
            raise EndpointConnectionError(endpoint_url="https://states")

    due = clock.now_ms() + 6000
    try:
        with hooked(dispatch._sfn(), ("before-call.sfn.StartExecution", hang_the_first)):
            began = time.monotonic()
            status, _ = call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, due, "hung"))
            took_s = time.monotonic() - began
    finally:
        released.set()
    assert status == 201 and hung and took_s < 5  # 1 s, and the rest of the request
    assert stored("hung")["gsi_pk"].startswith("check-")  # for the reconciler's next look
    assert runtime.run_finder()["started_late"] == 1
    wait_for_status("hung", {"SUCCEEDED"})
    assert [arrival.task_id for arrival in receiver.received()] == ["hung"]


def test_a_reply_past_lambdas_limit_fails_here_as_on_aws(runtime):
    """Lambda refuses a synchronous response over 6,291,556 bytes (Function.ResponseSize-
    TooLarge); the embedded runtime, which has no limit of its own, refuses it too, so a
    reply that grows past it fails a test here rather than on AWS (a user's function
    stands in)."""
    runtime.functions["Big"] = LocalFunction(
        "Big", "big", "arn:aws:lambda:us-east-1:123456789012:function:big",
        lambda event, context: {"body": "x" * RESPONSE_LIMIT_BYTES}, 3.0, 128, "arm64",
    )  # fmt: skip
    with pytest.raises(ResponseSizeTooLarge, match=f"\\({RESPONSE_LIMIT_BYTES} bytes\\)"):
        runtime.invoke("Big", {})


def test_list_pages_through_the_callers_tasks_earliest_first_with_filters(runtime):
    now = clock.now_ms()
    for i in range(7):
        call_api(runtime, "POST", "/tasks", sns_task(f"t-{i}", due_in_ms=HOUR_MS * (7 - i)))
    call_api(runtime, "POST", "/tasks", sns_task("theirs"), principal="bob")
    call_api(runtime, "DELETE", "/tasks/t-3")

    seen, token, pages = [], None, 0
    while True:
        query = "/tasks?limit=3" + (f"&next={token}" if token else "")
        status, page = call_api(runtime, "GET", query)
        assert status == 200 and len(page["tasks"]) <= 3
        seen += [t["id"] for t in page["tasks"]]
        pages += 1
        token = page["next"]
        if not token:
            break
    assert seen == [f"t-{i}" for i in range(6, -1, -1)] and pages == 3

    _, pending = call_api(runtime, "GET", "/tasks?status=PENDING&limit=100")
    assert "t-3" not in {t["id"] for t in pending["tasks"]} and len(pending["tasks"]) == 6
    # the filter reads past pages of the index that hold no cancelled task
    _, cancelled = call_api(runtime, "GET", "/tasks?status=CANCELLED&limit=1")
    assert [t["id"] for t in cancelled["tasks"]] == ["t-3"]
    _, rest = call_api(runtime, "GET", f"/tasks?status=CANCELLED&limit=1&next={cancelled['next']}")
    assert rest == {"tasks": [], "next": None}
    window = (
        f"/tasks?due_after={clock.to_iso(now + 5 * HOUR_MS // 2)}"
        f"&due_before={clock.to_iso(now + 5 * HOUR_MS + 60_000)}"
    )
    _, between = call_api(runtime, "GET", window.replace("+", "%2B"))
    assert [t["id"] for t in between["tasks"]] == ["t-4", "t-3", "t-2"]

    latest, token = [], None  # latest due first, page after page, with a filter
    while True:
        query = "/tasks?order=desc&status=PENDING&limit=4" + (f"&next={token}" if token else "")
        _, page = call_api(runtime, "GET", query)
        latest += [t["id"] for t in page["tasks"]]
        if not (token := page["next"]):
            break
    assert latest == ["t-0", "t-1", "t-2", "t-4", "t-5", "t-6"]
    status, refused = call_api(runtime, "GET", "/tasks?order=newest")
    assert status == 400 and refused["error"]["field"] == "order"


def test_a_page_token_is_bound_to_its_owner(runtime):
    for i in range(3):
        call_api(runtime, "POST", "/tasks", sns_task(f"t-{i}"))
    _, page = call_api(runtime, "GET", "/tasks?limit=1")
    status, error = call_api(runtime, "GET", f"/tasks?next={page['next']}", principal="bob")
    assert status == 400 and error["error"]["field"] == "next"


BATCH_READ = "after-call.dynamodb.BatchGetItem"


def leave_unprocessed(calls: list[int], keep: int, times: int) -> Callable[..., None]:
    """An answer to BatchGetItem that reads only `keep` of the tasks asked for and leaves the
    rest unprocessed, as DynamoDB does under throttling, for the first `times` calls."""

    def answer(parsed: dict[str, Any], **_: object) -> None:
        calls.append(len(calls))
        if len(calls) > times:
            return
        for table, items in parsed["Responses"].items():
            parsed["Responses"][table] = items[:keep]
            keys = [{"task_id": item["task_id"]} for item in items[keep:]]
            parsed["UnprocessedKeys"] = {table: {"Keys": keys}} if keys else {}

    return answer


def test_a_listing_reads_again_the_tasks_dynamodb_left_unprocessed(runtime):
    for i in range(8):
        call_api(runtime, "POST", "/tasks", sns_task(f"t-{i}", due_in_ms=HOUR_MS + i))
    calls: list[int] = []
    answer = leave_unprocessed(calls, keep=3, times=2)
    # botocore calls an operation's own handlers before boto3's, which turns the answer's
    # wire format into values: this one edits the answer as DynamoDB sent it
    with hooked(aws.resource("dynamodb").meta.client, (BATCH_READ, answer)):
        status, page = call_api(runtime, "GET", "/tasks?limit=100")
    assert status == 200 and [t["id"] for t in page["tasks"]] == [f"t-{i}" for i in range(8)]
    assert len(calls) == 3  # 3 read, 3 more, then the last 2


def test_a_listing_dynamodb_keeps_throttling_is_refused_as_busy(runtime):
    call_api(runtime, "POST", "/tasks", sns_task("t-1"))
    calls: list[int] = []
    answer = leave_unprocessed(calls, keep=0, times=100)
    with hooked(aws.resource("dynamodb").meta.client, (BATCH_READ, answer)):
        status, error = call_api(runtime, "GET", "/tasks")
    assert status == 503 and error["error"]["code"] == "busy"
    assert len(calls) == UNPROCESSED_TRIES


def test_a_query_dynamodb_throttles_past_botocores_retries_is_refused_as_busy(runtime, no_backoff):
    call_api(runtime, "POST", "/tasks", sns_task("t-1"))
    throttled: list[str] = []

    def throttle(request: AWSPreparedRequest, **_: object) -> AWSResponse:
        throttled.append(request.url)
        error = b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException"}'
        return AWSResponse(request.url, 400, {}, MockRawResponse(error))

    client = aws.resource("dynamodb").meta.client
    with hooked(client, ("before-send.dynamodb.Query", throttle)):
        status, error = call_api(runtime, "GET", "/tasks")
    assert status == 503 and error["error"]["code"] == "busy"
    assert len(throttled) > 1  # botocore retried it first


WRITES = ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem")


@pytest.mark.parametrize(
    ("target", "body"),
    [
        ("/tasks", sns_task("t-1")),
        (
            "/schedules",
            {
                "id": "s-1",
                "expression": "rate(1 hour)",
                "type": "sns",
                "target": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:t"},
            },
        ),
    ],
    ids=["task", "schedule"],
)
def test_a_write_dynamodb_throttles_past_botocores_retries_is_refused_as_busy(
    runtime, no_backoff, target, body
):
    """503 busy, which the client retries (it was a 500), and nothing written: the same
    request then creates it."""
    throttled: list[str] = []

    def throttle(request: AWSPreparedRequest, **_: object) -> AWSResponse:
        throttled.append(request.url)
        error = (
            b'{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"}'
        )
        return AWSResponse(request.url, 400, {}, MockRawResponse(error))

    client = aws.resource("dynamodb").meta.client
    with hooked(client, *((f"before-send.dynamodb.{op}", throttle) for op in WRITES)):
        status, error = call_api(runtime, "POST", target, body)
    assert status == 503 and error["error"]["code"] == "busy", error
    assert len(throttled) > 1  # botocore retried it first
    assert call_api(runtime, "GET", f"{target}/{body['id']}")[0] == 404
    assert call_api(runtime, "POST", target, body)[0] == 201


def test_a_reschedule_to_long_ago_is_refused_and_changes_nothing(runtime):
    assert call_api(runtime, "POST", "/tasks", sns_task())[0] == 201
    before = all_tasks()
    status, error = call_api(runtime, "PATCH", "/tasks/t-1", {"due_at": "2025-01-15T10:00:00Z"})
    assert status == 400 and error["error"]["field"] == "due_at"
    assert "in the past" in error["error"]["message"]
    assert all_tasks() == before


bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
fields = {
    "id": st.text(max_size=70),
    "due_at": st.text(max_size=30) | st.integers(),
    "delay": st.text(max_size=10) | st.integers(min_value=-(10**12), max_value=10**12),
    "type": st.sampled_from(["webhook", "sqs", "sns", "lambda", "email", "eventbridge", "x"]),
    "target": bodies,
    "payload": bodies,
    "max_attempts": st.integers(min_value=-3, max_value=9) | st.text(max_size=3),
}
submissions = st.fixed_dictionaries({}, optional=fields) | bodies


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=submissions)
def test_generated_bad_bodies_get_a_4xx_and_leave_the_table_unchanged(runtime, body):
    status, reply = call_api(runtime, "POST", "/tasks", body)
    if status in (200, 201):  # the generator found a valid task: fine, but keep the table clean
        boto3.resource("dynamodb").Table(settings().tasks_table).delete_item(
            Key={"task_id": reply["id"]}
        )
        return
    assert 400 <= status < 500, reply
    assert set(reply["error"]) == {"code", "message", "field"}
    assert reply["error"]["message"]
    assert all_tasks() == []


@pytest.mark.slow
def test_a_cancelled_task_never_fires(runtime, receiver):
    due = clock.now_ms() + settings().lead_ms + 4000  # cancelled well before the wake
    status, task = call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, due, "c-1"))
    assert status == 201 and task["status"] == "PENDING"
    assert [e.name for e in runtime.executions()] == ["c-1-v1"]  # started, by its writer
    status, task = call_api(runtime, "DELETE", "/tasks/c-1")
    assert status == 200 and task["status"] == "CANCELLED"
    time.sleep(max(0, due - clock.now_ms()) / 1000 + 1)
    assert runtime.wait_for_executions(30)
    assert receiver.received() == []
    assert wait_for_status("c-1", {"CANCELLED"})


def waiting(runtime) -> None:
    """Until every execution has entered its Wait."""
    sfn, deadline = boto3.client("stepfunctions"), time.monotonic() + 10
    for execution in runtime.executions():
        arn = execution.execution_arn
        while "WaitStateEntered" not in {
            event["type"] for event in sfn.get_execution_history(executionArn=arn)["events"]
        }:
            assert time.monotonic() < deadline, f"{execution.name} never began its Wait"
            time.sleep(0.05)


def test_a_changed_tasks_own_execution_is_stopped_at_once(runtime, receiver):
    """Cancelled or rescheduled, a task due soon has its execution (its writer's, of its
    own) stopped then: it holds no Wait, no Lambda environment, and no transition more."""
    due = clock.now_ms() + settings().lead_ms + 8000  # started by its writer, before its wake
    for task_id in ("stop-cancel", "stop-move"):
        body = webhook_task(receiver.url, due, task_id)
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    waiting(runtime)  # moto loses a stop that comes before the Wait has begun (AWS does not)
    assert call_api(runtime, "DELETE", "/tasks/stop-cancel")[0] == 200
    assert call_api(runtime, "PATCH", "/tasks/stop-move", {"delay": 3600})[0] == 200
    assert runtime.wait_for_executions(3)  # long before the wake: only a stop ends them
    statuses = {e.name: e.status for e in runtime.executions()}
    assert statuses == {"stop-cancel-v1": "ABORTED", "stop-move-v1": "ABORTED"}


def test_cancel_or_reschedule_after_the_fire_is_a_conflict(runtime, receiver):
    due = clock.now_ms() + 1000
    call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, due, "f-1"))
    wait_for_status("f-1", {"SUCCEEDED"})
    status, error = call_api(runtime, "DELETE", "/tasks/f-1")
    assert status == 409 and "SUCCEEDED" in error["error"]["message"]
    status, _ = call_api(runtime, "PATCH", "/tasks/f-1", {"delay": 60})
    assert status == 409
    _, task = call_api(runtime, "GET", "/tasks/f-1")
    assert task["status"] == "SUCCEEDED" and task["attempts"] == 1
    assert task["lateness_ms"] >= 0 and task["fired_at"] >= task["due_at"]


@pytest.mark.slow
def test_cancel_racing_the_fire_gives_exactly_one_outcome(runtime, receiver):
    """Cancels land around the claim, which follows the wake of each task's execution (read
    from the execution's input): each task is either cancelled and never fired, or fired once
    and the cancel refused, and both happen. (Which side of the claim each cancel lands on
    is the machine's timing: the next test forces the cancel between read and claim.)"""
    due = clock.now_ms() + settings().lead_ms + 4000  # the wake comes 3-4 s from now
    # the first at once (3.5 s before the wake: on a loaded machine a cancel can take seconds)
    offsets = [-3500, -1500, -1000, -500, -250, 0, 250, 500, 1000, 4000]
    for i in range(len(offsets)):
        call_api(runtime, "POST", "/tasks", webhook_task(receiver.url, due, f"race-{i}"))
    outcomes: dict[str, int] = {}

    def cancel_at(i: int, offset: int) -> None:
        at = wake_ms(f"race-{i}", due) + offset
        time.sleep(max(0, at - clock.now_ms()) / 1000)
        outcomes[f"race-{i}"], _ = call_api(runtime, "DELETE", f"/tasks/race-{i}")

    threads = [threading.Thread(target=cancel_at, args=pair) for pair in enumerate(offsets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert runtime.wait_for_executions(30)
    fired = Counter(a.task_id for a in receiver.received())
    for task_id, status in outcomes.items():
        final = wait_for_status(task_id, {"CANCELLED", "SUCCEEDED"})
        if status == 200:
            assert final["status"] == "CANCELLED" and fired[task_id] == 0, task_id
        else:
            assert status == 409 and final["status"] == "SUCCEEDED", task_id
            assert fired[task_id] == 1, task_id
    assert outcomes["race-0"] == 200 and outcomes[f"race-{len(offsets) - 1}"] == 409


def test_a_cancel_landing_while_the_claim_is_on_its_way_wins_and_nothing_fires(runtime, receiver):
    """The executor has read the task and is sending its claim when the cancel lands first
    (here the claim waits for the cancel's answer): the claim's condition fails, the cancel
    stands, and nothing is sent."""
    claiming, answered = threading.Event(), threading.Event()

    def hold_the_claim(params: dict, **_: object) -> None:
        if "lease_until = :lease" in params.get("UpdateExpression", "") and not claiming.is_set():
            claiming.set()
            answered.wait(30)

    client = aws.resource("dynamodb").meta.client
    with hooked(client, ("before-parameter-build.dynamodb.UpdateItem", hold_the_claim)):
        # submitted with the hook on: due this soon, its executor may claim at once
        task = webhook_task(receiver.url, clock.now_ms() + 2000, "held")
        call_api(runtime, "POST", "/tasks", task)
        assert claiming.wait(30)  # the execution woke and its executor is claiming
        status, _ = call_api(runtime, "DELETE", "/tasks/held")
        answered.set()
        assert runtime.wait_for_executions(30)
    assert status == 200 and stored("held")["status"] == "CANCELLED"
    assert receiver.received() == []


@pytest.mark.slow
def test_reschedule_fires_the_new_version_at_the_new_time_only(runtime, receiver):
    now = clock.now_ms()
    # Due in 13 s: moto's Wait ends up to 2 s before the lead, 6 s on at the earliest,
    # room for the PATCH.
    body = webhook_task(receiver.url, now + 13_000, "r-1", {"v": 1})
    assert call_api(runtime, "POST", "/tasks", body)[1]["status"] == "PENDING"
    new_due = now + 15_000
    status, task = call_api(
        runtime, "PATCH", "/tasks/r-1", {"due_at": clock.to_iso(new_due), "payload": {"v": 2}}
    )
    assert status == 200 and task["version"] == 2 and task["due_at"] == clock.to_iso(new_due)
    wait_for_status("r-1", {"SUCCEEDED"}, timeout_s=60)
    [arrival] = receiver.received()
    assert json.loads(arrival.body) == {"v": 2} and arrival.arrival_ms >= new_due
    assert arrival.idempotency_key == "r-1:2"
    assert runtime.wait_for_executions(30)
    statuses = {e.name: e.status for e in runtime.executions()}
    assert statuses["r-1-v2"] == "SUCCEEDED" and statuses["r-1-v1"] in {"ABORTED", "SUCCEEDED"}


def test_the_principal_header_is_ignored_when_iam_names_the_caller(runtime):
    """Only `tocsin serve` turns X-Tocsin-Principal into the caller; the handler never reads it."""
    event = api_event(
        "POST", "/tasks", json.dumps(sns_task()), "alice", {"X-Tocsin-Principal": "bob"}
    )
    assert runtime.invoke("ApiFunction", event)["statusCode"] == 201
    assert call_api(runtime, "GET", "/tasks/t-1", principal="alice")[0] == 200
    assert call_api(runtime, "GET", "/tasks/t-1", principal="bob")[0] == 404
