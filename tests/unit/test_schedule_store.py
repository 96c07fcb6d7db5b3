"""How the finder reads DynamoDB's refusal of an occurrence's transaction, with the answers
AWS gives that moto does not: moto names an item that did not fail "None", while DynamoDB's
reference says such an item may carry a null code."""

import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from tocsin import aws
from tocsin.schedule_store import ScheduleStore, Turned

SCHEDULE = {"schedule_id": "tick", "revision": 3, "next_ms": 1_800_000_000_000}
TASK = {
    "task_id": "tick-1800000000000",
    "due_at": "2027-01-15T08:00:00.000Z",
    "due_ms": 1_800_000_000_000,
    "task_type": "sns",
    "target": '{"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"}',  # stored as JSON
    "payload": "{}",
    "max_attempts": 3,
    "owner": "alice",
    "schedule_id": "tick",
    "schedule_revision": 3,
    "gsi_pk": "s1",
    "gsi_due_ms": 1_800_000_000_000,
    "placed_ms": 1_799_999_990_000,
    "created_at": "2027-01-15T07:57:00.000Z",
    "status": "PENDING",
    "version": 1,
}


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws.forget_clients()
    with mock_aws():
        store = ScheduleStore("schedules", "tasks")
        with Stubber(store._client) as stub:
            yield store, stub
            stub.assert_no_pending_responses()
    aws.forget_clients()


def refused(stub: Stubber, *reasons: dict[str, str]) -> None:
    stub.add_client_error(
        "transact_write_items",
        service_error_code="TransactionCanceledException",
        modeled_fields={"CancellationReasons": list(reasons)},
        expected_params={"TransactItems": ANY},
    )


@pytest.mark.parametrize("unfailed", [{"Code": "None"}, {}], ids=["code None", "null code"])
def test_an_occurrence_whose_task_exists_is_written_again_as_its_update(store, unfailed):
    store, stub = store
    refused(stub, {"Code": "ConditionalCheckFailed"}, unfailed)  # the Put: the task is there
    stub.add_response("transact_write_items", {}, {"TransactItems": ANY})  # the Update
    assert store.turn_into_task(SCHEDULE, TASK, SCHEDULE["next_ms"] + 2000, 0) is Turned.TASK


@pytest.mark.parametrize("unfailed", [{"Code": "None"}, {}], ids=["code None", "null code"])
def test_a_schedule_that_moved_meanwhile_is_read_again(store, unfailed):
    store, stub = store
    refused(stub, unfailed, {"Code": "ConditionalCheckFailed"})
    assert store.turn_into_task(SCHEDULE, TASK, SCHEDULE["next_ms"] + 2000, 0) is Turned.CHANGED
