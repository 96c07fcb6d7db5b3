"""Each function's role allows every AWS call the function makes.

moto checks no IAM, so a call a role does not allow fails only on AWS (it happened: the
finder's transaction came to put an item its role could only update). Here the calls each
function makes on its paths are recorded on the embedded runtime, as the IAM action and
resource ARN each needs, and checked against the function's policies as the translated
template gives them, the way IAM weighs an Allow (the template has no Deny; its one kind
of Condition, on the leading key of a DynamoDB item, is weighed with the call's key).
"""

import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from typing import Any
from unittest import mock

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from tests.conftest import (
    ENDED,
    TEST_ATTEMPT,
    batch_event,
    call_api,
    claim_as,
    hooked,
    stop_executions,
    store_pending,
    store_task,
    stored,
    table,
    webhook_task,
)
from tests.integration.test_targets import (
    EVENTS,
    SAMPLE_TARGETS,
    TARGETS,
    sample,
    store_sample_task,
)
from tocsin import aws, clock, schedules
from tocsin.bodies import INLINE_BYTES
from tocsin.index_keys import LOOK_AFTER_MS, check_keys
from tocsin.local.runtime import scheduled_event
from tocsin.local.stack import ACCOUNT_ID, REGION
from tocsin.model import TaskStatus
from tocsin.reconcile import MAX_REQUEUES
from tocsin.schedules import ScheduleSpec
from tocsin.settings import settings
from tocsin.store import TaskStore

# IAM actions whose names are not the operation's (the SQS and SNS batch operations are
# allowed by their single operation's action: AWS's API permissions references)
ACTIONS = {
    ("lambda", "Invoke"): "lambda:InvokeFunction",
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sns", "PublishBatch"): "sns:Publish",
}
TRANSACTION_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


def _arn(service: str, resource: str) -> str:
    return f"arn:aws:{service}:{REGION}:{ACCOUNT_ID}:{resource}"


def _resources(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """The ARNs of what a call acts on, as IAM authorizes it."""
    if (service, operation) == ("dynamodb", "BatchGetItem"):
        return [_arn("dynamodb", f"table/{table}") for table in params["RequestItems"]]
    if service == "dynamodb":
        index = f"/index/{params['IndexName']}" if "IndexName" in params else ""
        return [_arn("dynamodb", f"table/{params['TableName']}{index}")]
    if service == "sqs":
        return [_arn("sqs", params["QueueUrl"].rsplit("/", 1)[1])]
    if service == "states":
        return [params.get("stateMachineArn") or params["executionArn"]]
    if service == "secretsmanager":
        return [params["SecretId"]]
    if service == "sns":
        return [params["TopicArn"]]
    if service == "events":
        buses = [entry.get("EventBusName", "default") for entry in params["Entries"]]
        return [b if b.startswith("arn:") else _arn("events", f"event-bus/{b}") for b in buses]
    if service == "lambda":
        name = params["FunctionName"]
        return [name if name.startswith("arn:") else _arn("lambda", f"function:{name}")]
    if service == "ses":
        return [_arn("ses", f"identity/{params['Source']}")]
    raise AssertionError(f"{service}:{operation} is new here: teach this test its resource ARN")


# An IAM action, a resource ARN, and the condition keys IAM weighs the call with (sorted
# pairs): a DynamoDB item's leading key, the transaction that encloses a write.
Need = tuple[str, str, tuple[tuple[str, str], ...]]


def _leading_key(params: dict[str, Any]) -> str | None:
    """The partition key of the item a DynamoDB call names by its key (every table here
    has a partition key only), typed or not; None for any other call."""
    if len(params.get("Key", {})) != 1:
        return None
    [value] = params["Key"].values()
    return value["S"] if isinstance(value, dict) else str(value)


def _context(params: dict[str, Any], enclosing: str = "") -> tuple[tuple[str, str], ...]:
    """The condition keys of a DynamoDB call (or of one write of a transaction)."""
    context = {"dynamodb:EnclosingOperation": enclosing} if enclosing else {}
    if (key := _leading_key(params)) is not None:
        context["dynamodb:LeadingKeys"] = key
    return tuple(sorted(context.items()))


def needed(service: str, operation: str, params: dict[str, Any]) -> list[Need]:
    """What a call needs allowed: a transaction needs each of its writes' own."""
    if (service, operation) == ("dynamodb", "TransactWriteItems"):
        return [
            (
                f"dynamodb:{TRANSACTION_ACTIONS[kind]}",
                _resources("dynamodb", kind, write)[0],
                _context(write, operation),
            )
            for item in params["TransactItems"]
            for kind, write in item.items()
        ]
    if (service, operation) == ("dynamodb", "BatchGetItem"):  # each key's own leading key
        return [
            (f"dynamodb:{operation}", _resources("dynamodb", "GetItem", {"TableName": t})[0],
             _context({"Key": key}))
            for t, asked in params["RequestItems"].items()
            for key in asked["Keys"]
        ]  # fmt: skip
    action = ACTIONS.get((service, operation), f"{service}:{operation}")
    context = _context(params) if service == "dynamodb" else ()
    return [(action, arn, context) for arn in _resources(service, operation, params)]


def _by_the_state_machine() -> bool:
    """Whether moto's Step Functions interpreter makes the call being made: a call of the
    state machine's role (a Fire state's Lambda invoke), not of the function being
    recorded, which started the execution."""
    frame = sys._getframe(2)
    while frame is not None:
        if "/moto/stepfunctions/" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class Calls:
    """What each function asked of AWS, recorded while `of(function)` is open."""

    def __init__(self, tables: set[str]) -> None:
        self.function: str | None = None
        self.made: dict[str, set[Need]] = defaultdict(set)
        # This runtime's tables. A call on another's comes from a thread an earlier test's
        # runtime left behind (seen: an executor still finishing as its runtime stopped),
        # whichever function's step is open now: it is not that function's call.
        self.tables = {_arn("dynamodb", f"table/{name}") for name in tables}

    @contextmanager
    def of(self, function: str) -> Iterator[None]:
        self.function = function
        try:
            yield
        finally:
            self.function = None

    def record(self, client: BaseClient, operation: str, params: dict[str, Any]) -> None:
        if self.function and not _by_the_state_machine():
            service = client.meta.service_model.signing_name
            pairs = needed(service, operation, params)
            if service == "dynamodb" and pairs[0][1].split("/index/")[0] not in self.tables:
                return
            self.made[self.function].update(pairs)

    def actions(self, function: str) -> set[str]:
        return {action for action, _, _ in self.made[function]}


# A payload whose body goes to the Bodies table (tocsin.bodies): written apart, read apart.
LARGE = {"blob": "x" * INLINE_BYTES}


def tables(runtime) -> set[str]:
    """Every table of the stack, as named here: a table the template gains is watched too."""
    resources = runtime.template["Resources"]
    return {
        runtime.resolve({"Ref": name})
        for name, resource in resources.items()
        if resource["Type"] == "AWS::DynamoDB::Table"
    }


def on_bodies(calls: Calls, function: str) -> set[str]:
    """The actions the function took on the Bodies table."""
    table = _arn("dynamodb", f"table/{settings().bodies_table}")
    return {action for action, arn, _ in calls.made[function] if arn == table}


@pytest.fixture
def calls(runtime) -> Iterator[Calls]:
    """Every client's calls, whenever it was made (the handlers make theirs at init)."""
    recorded = Calls(tables(runtime))
    assert settings().bodies_table in tables(runtime)
    make_api_call = BaseClient._make_api_call

    def recording(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        recorded.record(client, operation, params)
        return make_api_call(client, operation, params)

    with mock.patch.object(BaseClient, "_make_api_call", recording):
        yield recorded


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def grants(runtime, function: str) -> list[tuple[str, str, list[str] | None]]:
    """The (action, resource, leading keys) patterns the function's role allows: its inline
    policies (SAM's policy templates expanded) and the template's managed policies it
    attaches, or that name it among their `Roles`; leading keys None where no Condition
    limits them."""
    resources = runtime.template["Resources"]
    role = resources[function]["Properties"]["Role"]["Fn::GetAtt"][0]
    properties = resources[role]["Properties"]
    documents = [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
    managed = {
        runtime.resolve({"Ref": name}): resource["Properties"]
        for name, resource in resources.items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy"
    }
    attached = [runtime.resolve(arn) for arn in properties.get("ManagedPolicyArns", [])]
    documents += [
        policy["PolicyDocument"]
        for arn, policy in managed.items()
        if arn in attached or {"Ref": role} in policy.get("Roles", [])
    ]
    allowed = []
    for document in documents:
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow"
            tests = _conditions(statement.get("Condition"))
            resolved = _listed(runtime.resolve(statement["Resource"]))
            allowed += [(a, r, tests) for a in _listed(statement["Action"]) for r in resolved]
    return allowed


# The kinds of Condition the template writes, each with the test of a value against one of
# its patterns, and the condition keys it writes them on (any other fails here, to be taught).
OPERATORS = {"ForAllValues:StringLike": fnmatchcase, "ForAnyValue:StringEquals": str.__eq__}
CONDITION_KEYS = {"dynamodb:LeadingKeys", "dynamodb:EnclosingOperation"}


def _conditions(condition: dict[str, Any] | None) -> list[tuple[str, str, list[str]]]:
    """A statement's Condition as (operator, condition key, patterns)."""
    tests = []
    for operator, on in (condition or {}).items():
        assert operator in OPERATORS, condition
        for name, patterns in on.items():
            assert name in CONDITION_KEYS, condition
            tests.append((operator, name, _listed(patterns)))
    return tests


def _meets(context: tuple[tuple[str, str], ...], tests: list[tuple[str, str, list[str]]]) -> bool:
    """Whether a call's condition keys pass every test; a key the call lacks passes none
    (stricter than IAM's ForAllValues, which an absent key passes)."""
    values = dict(context)
    return all(
        name in values and any(OPERATORS[operator](values[name], p) for p in patterns)
        for operator, name, patterns in tests
    )


def refused(runtime, calls: Calls) -> list[tuple[str, str, str]]:
    """Each recorded call no statement of its function's role allows."""
    missing = []
    for function, made in calls.made.items():
        allowed = grants(runtime, function)
        for action, arn, context in sorted(made, key=str):
            if not any(
                fnmatchcase(action.lower(), a.lower())
                and fnmatchcase(arn, r)
                and _meets(context, t)
                for a, r, t in allowed
            ):
                missing.append((function, action, arn))
    return missing


def gone(runtime) -> str:
    """The ARN of an execution of the task machine that is no more."""
    return runtime.state_machine_arn.replace(":stateMachine:", ":execution:") + ":gone"


@contextmanager
def executors_held_back(runtime) -> Iterator[None]:
    """No executor runs until the block ends: an execution the block starts due at once (a
    callback's) would make its calls while the block records another function's."""
    released, invoke = threading.Event(), runtime.invoke

    def held_back(logical_id: str, event: dict) -> Any:
        if logical_id.endswith("ExecutorFunction"):
            released.wait(60)
        return invoke(logical_id, event)

    with mock.patch.object(runtime, "invoke", held_back):
        try:
            yield
        finally:
            released.set()


def every_minute(url: str, start_ms: int) -> dict[str, Any]:
    return {
        "id": "tick",
        "expression": "rate(1 minute)",
        "start_at": clock.to_iso(start_ms),
        "type": "webhook",
        "target": {"url": url},
        "payload": {"n": 1},
    }


def test_the_api_role_allows_every_call_of_the_api(runtime, calls, receiver):
    task = webhook_task(receiver.url, clock.now_ms() + 3_600_000, "later", LARGE)
    soon = webhook_task(receiver.url, clock.now_ms() + 15_000, "soon")
    schedule = every_minute(receiver.url, clock.now_ms() + 12_000)  # its first made at once
    schedule["payload"] = LARGE  # its body written apart with it, and retired at its delete
    steps = [
        ("POST", "/tasks", task),
        ("POST", "/tasks", soon),  # started at once: due within the look-ahead
        ("GET", "/tasks/later", None),
        ("GET", "/tasks?limit=1", None),
        ("PATCH", "/tasks/later", {"due_at": clock.to_iso(clock.now_ms() + 7_200_000)}),
        ("PATCH", "/tasks/later", {"payload": {**LARGE, "v": 3}}),  # a new body apart
        ("DELETE", "/tasks/soon", None),  # its execution stopped
        ("DELETE", "/tasks/later", None),
        ("POST", "/schedules", schedule),
        ("GET", "/schedules/tick", None),
        ("GET", "/schedules", None),
        ("GET", "/schedules/tick/upcoming?count=3", None),
        ("GET", "/tasks?schedule=tick", None),
        ("PATCH", "/schedules/tick", {"state": "PAUSED"}),  # its occurrence cancelled
        ("PATCH", "/schedules/tick", {"state": "ENABLED"}),
        ("DELETE", "/schedules/tick", None),
    ]
    with calls.of("ApiFunction"):
        for method, path, body in steps:
            status, reply = call_api(runtime, method, path, body)
            assert status < 300, (method, path, reply)
    stop_executions()
    assert {
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:DeleteItem",
        "states:StartExecution",
        "states:StopExecution",
    } <= calls.actions("ApiFunction")
    bodies = {"dynamodb:PutItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"}
    assert on_bodies(calls, "ApiFunction") == bodies
    assert refused(runtime, calls) == []


def test_the_finder_role_allows_every_call_of_the_finder(runtime, calls, receiver):
    config, store = settings(), TaskStore(settings().tasks_table)
    store_pending(receiver.url, 2, 15_000, "due")  # started, stopped before waking
    # held by an execution gone, up for a look: requeued, and started to wake later
    [stuck] = store_pending(receiver.url, 1, 60_000, "stuck")
    claim_as(gone(runtime), stuck, ENDED)
    store.look_again(stuck, 1, check_keys(stuck, 0, config))
    # held by an execution gone past its requeues, owing a callback: failed with it
    told = {"type": "webhook", "target": {"url": receiver.url, "headers": {"x-note": "n" * 300}}}
    store_task(webhook_task(receiver.url, clock.now_ms() + 60_000, "spent") | {"on_failure": told})
    table(config.tasks_table).update_item(
        Key={"task_id": "spent"},
        UpdateExpression="SET requeues = :r",
        ExpressionAttributeValues={":r": MAX_REQUEUES},
    )
    claim_as(gone(runtime), "spent", ENDED)
    store.look_again("spent", 1, check_keys("spent", 0, config))
    [owing] = store_pending(receiver.url, 1, -60_000, "owing")
    claim_as(gone(runtime), owing, ENDED)
    error = {"Error": "PermanentTargetError", "Cause": "webhook answered 410"}
    owed = {"error": json.dumps(error), "gsi_pk": "check-0", "gsi_due_ms": 0}
    owing_done = store.finish(owing, 1, TEST_ATTEMPT, TaskStatus.FAILED, owed)
    assert owing_done  # its letter owed, past the grace
    # fired long ago: the reconciler reads its status with the others past their look
    [fired] = store_pending(receiver.url, 1, -LOOK_AFTER_MS - 60_000, "fired")
    claim_as(gone(runtime), fired, ENDED)
    assert store.finish(fired, 1, TEST_ATTEMPT, TaskStatus.SUCCEEDED, {"attempts": 1})
    schedule = every_minute(receiver.url, clock.now_ms() + config.lookahead_s * 1000 + 2_000)
    schedule["payload"] = LARGE  # its body apart: its occurrence names it, writes none
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201  # beyond the look-ahead
    # one stored before schedules' bodies went apart: its occurrence's body is written apart
    spec = ScheduleSpec.model_validate(schedule | {"id": "legacy"})
    now = clock.now_ms()
    legacy = schedules._schedule_item("legacy", spec, "alice", now, now, config)
    table(config.schedules_table).put_item(Item=legacy)
    doomed = every_minute(receiver.url, clock.now_ms() + 12_000) | {"id": "doomed"}
    assert call_api(runtime, "POST", "/schedules", doomed)[0] == 201  # its first made, started
    with mock.patch.object(schedules, "LEFTOVERS_BUDGET_S", 0.0):  # its cancel left to the finder
        assert call_api(runtime, "DELETE", "/schedules/doomed")[0] == 200
    # a crowded millisecond of SQS tasks: the finder reads their targets, one's in its body
    crowded_at = clock.to_iso(clock.now_ms() // 1000 * 1000 + 15_000)
    for i in range(31):
        target = {"queue_url": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/q{i}"}
        payload = LARGE if i == 0 else {"i": i}
        crowded = {"id": f"sqs-{i}", "due_at": crowded_at, "type": "sqs", "target": target}
        store_task(crowded | {"payload": payload})
    time.sleep(3)  # now within it: the finder makes the occurrence
    with executors_held_back(runtime), calls.of("FinderFunction"):
        report = runtime.invoke("FinderFunction", scheduled_event())
    stop_executions()
    # started: one more than the new schedule alone makes, the legacy one's occurrence;
    # and the crowded millisecond's 31 tasks
    assert (report["started"], report["requeued"], report["letters_sent"]) == (35, 1, 1)
    assert report["failed_stuck"] == 1 and stored("spent.1.callback")["callback_of"] == "spent"
    assert (report["occurrences_made"], report["leftovers_finished"]) == (2, 1)
    assert {
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",  # the leftovers record: only such a key (a Condition)
        "states:StartExecution",
        "states:DescribeExecution",
        "states:StopExecution",
        "sqs:SendMessage",
    } <= calls.actions("FinderFunction")
    assert on_bodies(calls, "FinderFunction") == {"dynamodb:PutItem", "dynamodb:BatchGetItem"}
    assert refused(runtime, calls) == []


@pytest.mark.parametrize("task_type", sorted(TARGETS))
def test_each_executor_role_allows_every_call_of_its_executor(runtime, calls, task_type):
    target = TARGETS[task_type]()
    target.setup(runtime)
    payload = "Renew today. " + "x" * INLINE_BYTES if task_type == "email" else LARGE
    store_sample_task(task_type, SAMPLE_TARGETS[task_type], payload)
    function = {"eventbridge": "EventBridge", "sqs": "Sqs", "sns": "Sns"}.get(
        task_type, task_type.capitalize()
    )
    with calls.of(f"{function}ExecutorFunction"):
        assert runtime.invoke(f"{function}ExecutorFunction", sample(task_type))["fired"] == 1
    target_action = {
        "email": "ses:SendEmail",
        "eventbridge": "events:PutEvents",
        "lambda": "lambda:InvokeFunction",
        "sns": "sns:Publish",
        "sqs": "sqs:SendMessage",
    }[task_type]
    made = calls.actions(f"{function}ExecutorFunction")
    assert {"dynamodb:UpdateItem", target_action} <= made
    assert "dynamodb:PutItem" not in made  # a send is logged only when it cannot be marked
    assert on_bodies(calls, f"{function}ExecutorFunction") == {"dynamodb:BatchGetItem"}
    assert refused(runtime, calls) == []


def test_the_webhook_executor_role_allows_its_calls_as_it_fires_and_fails(runtime, calls, receiver):
    receiver.status_for["/gone"] = 410
    [fires] = store_pending(receiver.url, 1, -500, "fires", payload=LARGE)
    [fails] = store_pending(f"{receiver.url}/gone", 1, -500, "fails", payload=LARGE)
    event = {
        "execution": gone(runtime),
        "task_type": "webhook",
        "tasks": [
            {"task_id": task_id, "version": 1, "due_ms": int(stored(task_id)["due_ms"])}
            for task_id in (fires, fails)
        ],
    }
    with calls.of("WebhookExecutorFunction"):
        report = runtime.invoke("WebhookExecutorFunction", event)
    assert (report["fired"], report["failed"]) == (1, 1)
    # a send whose mark the table refuses is logged; the next invocation reads the log
    [logged] = store_pending(receiver.url, 1, -500, "logged")
    again = {**event, "tasks": [batch_event(logged)["tasks"][0]]}

    def refuse_marks(params: dict, **_: object) -> None:
        if ":status" in params.get("ExpressionAttributeValues", {}):
            raise ClientError({"Error": {"Code": "AccessDeniedException"}}, "UpdateItem")

    client = aws.resource("dynamodb").meta.client
    marks_refused = ("before-parameter-build.dynamodb.UpdateItem", refuse_marks)
    with calls.of("WebhookExecutorFunction"):
        with hooked(client, marks_refused), pytest.raises(ClientError):
            runtime.invoke("WebhookExecutorFunction", again)
        assert runtime.invoke("WebhookExecutorFunction", again)["fired"] == 1
    assert {
        "secretsmanager:GetSecretValue",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "sqs:SendMessage",
    } <= calls.actions("WebhookExecutorFunction")
    assert on_bodies(calls, "WebhookExecutorFunction") == {"dynamodb:BatchGetItem"}
    assert refused(runtime, calls) == []


def invoked_on(runtime, calls: Calls, task_ids: tuple[str, ...]) -> dict[str, int]:
    """The webhook executor's report on one batch of these stored tasks, of an execution
    that is no more, its calls recorded."""
    event = {
        "execution": gone(runtime),
        "task_type": "webhook",
        "tasks": [batch_event(task_id)["tasks"][0] for task_id in task_ids],
    }
    with calls.of("WebhookExecutorFunction"):
        return runtime.invoke("WebhookExecutorFunction", event)


def test_an_executor_role_allows_the_callbacks_its_final_marks_make(runtime, calls, receiver):
    """A task's end with its callback (one transaction), the callback's large body apart,
    and its start on the state machine of the batch's execution."""
    receiver.status_for["/gone"] = 410
    told = {"type": "webhook", "target": {"url": receiver.url, "headers": {"x-note": "n" * 300}}}
    for task_id, path in (("fires", ""), ("fails", "/gone")):
        body = webhook_task(f"{receiver.url}{path}", clock.now_ms() - 500, task_id)
        store_task(body | {"on_success": told, "on_failure": told})
    report = invoked_on(runtime, calls, ("fires", "fails"))
    stop_executions()
    assert (report["fired"], report["failed"], report["callbacks"]) == (1, 1, 2)
    assert {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "states:StartExecution",
    } <= calls.actions("WebhookExecutorFunction")
    assert on_bodies(calls, "WebhookExecutorFunction") == {"dynamodb:PutItem"}
    assert refused(runtime, calls) == []


def test_an_executor_role_allows_its_flows_ledger_and_leases_and_no_task_read(
    runtime, calls, receiver
):
    """A flow's rate planned in its ledger, a held task's slot written, leases read and
    taken; the role may read lease items at once, never a task."""
    flow = {"key": "one-host", "rate": 2, "parallelism": 1}
    for task_id in ("first", "second"):
        store_task(webhook_task(receiver.url, clock.now_ms() + 300, task_id) | {"flow": flow})
    report = invoked_on(runtime, calls, ("first", "second"))
    assert report["fired"] == 2 and report["held"] >= 1  # the second, at least
    assert {"dynamodb:UpdateItem", "dynamodb:BatchGetItem"} <= calls.actions(
        "WebhookExecutorFunction"
    )
    assert refused(runtime, calls) == []
    task_read = ("dynamodb:BatchGetItem", _arn("dynamodb", f"table/{settings().tasks_table}"),
                 (("dynamodb:LeadingKeys", "first"),))  # fmt: skip
    calls.made["WebhookExecutorFunction"].add(task_read)
    assert refused(runtime, calls) == [("WebhookExecutorFunction", *task_read[:2])]


def test_the_submit_role_allows_every_call_of_the_submit_queue(runtime, calls):
    event = json.loads((EVENTS / "submit_sqs.json").read_text())
    for record in event["Records"]:  # sent now: its task is due in a day, not started at once
        record["attributes"]["SentTimestamp"] = str(clock.now_ms())
    queued = event["Records"][0]
    queued["body"] = json.dumps({**json.loads(queued["body"]), "payload": LARGE})  # apart
    with calls.of("SubmitFunction"):
        assert runtime.invoke("SubmitFunction", event) == {"batchItemFailures": []}
        # the same message again (SQS delivers at least once): the task as stored, read whole
        assert runtime.invoke("SubmitFunction", event) == {"batchItemFailures": []}
    assert {"dynamodb:PutItem", "sqs:SendMessage"} <= calls.actions("SubmitFunction")
    assert on_bodies(calls, "SubmitFunction") == {"dynamodb:PutItem", "dynamodb:BatchGetItem"}
    assert refused(runtime, calls) == []
