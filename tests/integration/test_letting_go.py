"""An executor invocation that fails before it sends lets go of the tasks it claimed: Fire's
retry, a new attempt of the same execution, takes every task over at once, not once the
first attempt's lease has run out, and each task fires once."""

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from moto.core.botocore_stubber import MockRawResponse

from tests.conftest import hooked, store_task, stored, wait_for_status, webhook_task
from tests.integration.test_exactly_once import tables
from tocsin import clock
from tocsin.measure.cost import transitions
from tocsin.settings import settings

EXECUTOR = "WebhookExecutorFunction"
BATCH = 5
KIB = 1024


@dataclass(frozen=True)
class Invocation:
    """One invocation of the executor: when it began and ended, its reply or its error's
    name, and each task of its batch as the table held it right after."""

    began_ms: int
    ended_ms: int
    reply: dict[str, int] | None
    error: str | None
    after: dict[str, dict[str, Any]]


@contextmanager
def watched_executor(runtime: Any) -> Iterator[list[Invocation]]:
    """Every invocation of the executor meanwhile (the state machine's included), in the
    order they ended."""
    invoke, seen = runtime.invoke, []

    def watching(logical_id: str, event: Any) -> Any:
        if logical_id != EXECUTOR:
            return invoke(logical_id, event)
        began_ms, reply, error = clock.now_ms(), None, None
        try:
            reply = invoke(logical_id, event)
            return reply
        except Exception as failed:
            error = type(failed).__name__
            raise
        finally:
            after = {t["task_id"]: stored(t["task_id"]) for t in event["tasks"]}
            seen.append(Invocation(began_ms, clock.now_ms(), reply, error, after))

    with mock.patch.object(runtime, "invoke", watching):
        yield seen


def one_window(url: str, prefix: str, payload: Any = None) -> list[str]:
    """BATCH webhook tasks due 37 ms apart within one second, far enough ahead for the
    finder to start them as one batch (one execution) before its wake."""
    window_ms = (clock.now_ms() // 1000 + 9) * 1000
    ids = [f"{prefix}-{i}" for i in range(BATCH)]
    for i, task_id in enumerate(ids):
        store_task(webhook_task(url, window_ms + 37 * i, task_id, payload))
    return ids


def refusal(request: AWSPreparedRequest, code: str, status: int) -> AWSResponse:
    """DynamoDB's answer refusing `request` with `code`, as it comes over the wire."""
    error = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code})
    return AWSResponse(request.url, status, {}, MockRawResponse(error.encode()))


def is_claim(body: dict[str, Any]) -> bool:
    return "lease_until = :lease" in body.get("UpdateExpression", "")


def first_failed_and_let_go(seen: list[Invocation]) -> Invocation:
    """The first invocation, once it has ended: it failed (TableUnavailable), and right
    after, each task it claimed is still its own (RUNNING, its attempt) with its lease over."""
    deadline = time.monotonic() + 60
    while not seen:
        assert time.monotonic() < deadline, "the executor was not invoked"
        time.sleep(0.05)
    first = seen[0]
    assert first.error == "TableUnavailable" and first.reply is None
    held = {i: item for i, item in first.after.items() if item["status"] == "RUNNING"}
    assert held, "the first invocation claimed nothing"
    lease_left = {i: int(item["lease_until"]) - first.ended_ms for i, item in held.items()}
    not_let_go = {i: left for i, left in lease_left.items() if left > 0}
    assert not not_let_go, f"still held, ms of lease left as the invocation failed: {not_let_go}"
    return first


def assert_taken_over_at_once(
    ids: list[str], seen: list[Invocation], first_lease_ms: int, receiver: Any
) -> None:
    """The retry, begun while the first attempt's lease still ran, claimed and fired every
    task, and Fire needed no other attempt; each task fired once."""
    assert [(i.error, i.reply) for i in seen] == [
        ("TableUnavailable", None),
        (None, {"tasks": BATCH, "claimed": BATCH, "fired": BATCH}),
    ]  # the retry met no DeliveryInProgress
    assert seen[1].began_ms < first_lease_ms  # the old lease was live: the retry did not wait
    first_attempt = {i["attempt"] for i in seen[0].after.values() if i["status"] == "RUNNING"}
    assert len(first_attempt) == 1
    assert {stored(i)["attempt"] for i in ids}.isdisjoint(first_attempt)  # the retry took each
    assert Counter(a.task_id for a in receiver.received()) == dict.fromkeys(ids, 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "status", "committed"),
    [
        ("ProvisionedThroughputExceededException", 400, False),
        ("InternalServerError", 500, False),
        ("InternalServerError", 500, True),
    ],
    ids=["throttled", "500", "500-after-the-write"],
)
def test_a_claim_that_fails_partway_through_a_batch_lets_go_at_once(
    runtime, receiver, no_backoff, monkeypatch, code, status, committed
):
    """Of a batch of five, three claims go through, then the fourth task's claim is refused
    at every try (botocore's and the executor's) until the invocation's time for claims is
    spent (with `committed`, its first try was written and only the answer was a 500, as
    DynamoDB's 500s may be): the invocation fails (TableUnavailable), letting go of what it
    holds, and Fire's retry claims and fires all five at once. (An executor of 15 s keeps
    the time for claims at 4 s, and webhooks of 2 s leave it the time to send; its lease,
    15 s, is still live when the retry comes.)"""
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "2")
    settings.cache_clear()
    executor = runtime.functions[EXECUTOR]
    runtime.functions[EXECUTOR] = replace(executor, timeout_s=15)
    ids = one_window(receiver.url, f"partway-{status}-{committed}")
    lock, passed, refused = threading.Lock(), [], Counter()
    leases: list[int] = []
    unhooked = boto3.client("dynamodb")  # another client: its calls meet no hook of this test

    with watched_executor(runtime) as seen:

        def refuse_the_fourth(request: AWSPreparedRequest, **_: object) -> AWSResponse | None:
            body = json.loads(request.body)
            if not is_claim(body) or seen:  # the first invocation's claims only
                return None
            task_id = body["Key"]["task_id"]["S"]
            with lock:
                leases.append(int(body["ExpressionAttributeValues"][":lease"]["N"]))
                if task_id in refused or (len(passed) == 3 and not refused):
                    if committed and not refused:
                        unhooked.update_item(**body)  # the write the 500 answers went through
                    refused[task_id] += 1
                    return refusal(request, code, status)
                if task_id not in passed:
                    passed.append(task_id)
            return None

        with hooked(tables(), ("before-send.dynamodb.UpdateItem", refuse_the_fourth)):
            assert runtime.run_finder()["executions"] == 1
            after = first_failed_and_let_go(seen).after
            [(refused_id, refusals)] = refused.items()
            assert refusals > 5  # botocore's retries, and the executor's tries after them
            assert after[refused_id]["status"] == ("RUNNING" if committed else "PENDING")
            assert {after[i]["status"] for i in passed} == {"RUNNING"}
            for task_id in ids:
                wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)
        assert runtime.wait_for_executions(30)

    assert_taken_over_at_once(ids, seen, min(leases), receiver)
    [execution] = runtime.executions()
    assert transitions(execution.execution_arn) == 3  # Wait, Fire, and Fire's one retry


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["InternalServerError", "UnprocessedKeys"])
def test_a_bodies_read_that_fails_after_the_claims_lets_go_at_once(
    runtime, receiver, no_backoff, fault
):
    """Five tasks whose payloads (2 KiB) are kept in the Bodies table: the claims go
    through, then the bodies' BatchGetItem fails (a 500 past botocore's retries, or every
    key left unprocessed at every call): the invocation fails (TableUnavailable), letting
    go of all five, and Fire's retry claims, reads and fires them at once, each with its
    payload whole. (The executor's own 120 s: its lease is far from over at the retry.)"""
    payload = {"blob": "b" * 2 * KIB}
    ids = one_window(receiver.url, f"bodies-{fault}", payload)
    assert all("body" in stored(i) for i in ids)
    bodies_table = settings().bodies_table
    reads_failed: list[int] = []
    leases: list[int] = []

    with watched_executor(runtime) as seen:

        def fail_the_first_bodies_read(
            request: AWSPreparedRequest, **_: object
        ) -> AWSResponse | None:
            body = json.loads(request.body)
            if seen or bodies_table not in body["RequestItems"]:
                return None
            reads_failed.append(clock.now_ms())
            if fault == "InternalServerError":
                return refusal(request, fault, 500)
            unprocessed = json.dumps({"Responses": {}, "UnprocessedKeys": body["RequestItems"]})
            return AWSResponse(request.url, 200, {}, MockRawResponse(unprocessed.encode()))

        def lease_of_the_first(request: AWSPreparedRequest, **_: object) -> None:
            body = json.loads(request.body)
            if is_claim(body) and not seen:
                leases.append(int(body["ExpressionAttributeValues"][":lease"]["N"]))

        with hooked(
            tables(),
            ("before-send.dynamodb.BatchGetItem", fail_the_first_bodies_read),
            ("before-send.dynamodb.UpdateItem", lease_of_the_first),
        ):
            assert runtime.run_finder()["executions"] == 1
            after = first_failed_and_let_go(seen).after
            assert len(reads_failed) > 1  # tried again (botocore, or the unprocessed keys)
            assert {after[i]["status"] for i in ids} == {"RUNNING"}  # every claim went through
            for task_id in ids:
                wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)
        assert runtime.wait_for_executions(30)

    assert len(leases) == BATCH
    assert_taken_over_at_once(ids, seen, min(leases), receiver)
    assert [json.loads(a.body) for a in receiver.received()] == [payload] * BATCH
    [execution] = runtime.executions()
    assert transitions(execution.execution_arn) == 3  # Wait, Fire, and Fire's one retry
