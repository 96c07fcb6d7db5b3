"""`tocsin redrive`: FAILED tasks from the dead-letter queue fire again as their next version."""

import json
from unittest import mock

import boto3
import pytest

from tests.conftest import call_api, store_task, stored, wait_for_status, webhook_task
from tocsin import clock
from tocsin.cli import main
from tocsin.fire.writes import TableUnavailable
from tocsin.index_keys import LOOK_AFTER_MS
from tocsin.local.stack import STACK_NAME
from tocsin.reconcile import reconcile
from tocsin.redrive import COPY, FAILED_AGAIN, IN_FLIGHT, redrive
from tocsin.settings import settings
from tocsin.submit import submit_task


def failed_task(runtime, receiver, task_id: str) -> None:
    receiver.status_for[f"/{task_id}"] = 410
    body = webhook_task(f"{receiver.url}/{task_id}", clock.now_ms() + 500, task_id)
    submit_task(body, owner="alice")
    wait_for_status(task_id, {"FAILED"})
    assert runtime.wait_for_executions(30)  # the DLQ send follows MarkFailed


def dead_letters(runtime) -> int:
    attributes = boto3.client("sqs").get_queue_attributes(
        QueueUrl=runtime.dead_letter_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_a_redriven_task_fires_as_its_next_version(runtime, receiver):
    failed_task(runtime, receiver, "broken")
    receiver.status_for["/broken"] = 200  # the target is fixed

    report = redrive(runtime.dead_letter_queue_url, settings())
    assert report.tasks == [("broken", 1, "redriven")]
    item = wait_for_status("broken", {"SUCCEEDED"})
    assert int(item["version"]) == 2 and int(item["attempts"]) == 1 and "error" not in item
    assert [a.idempotency_key for a in receiver.received()] == ["broken:1", "broken:2"]
    assert dead_letters(runtime) == 0
    assert redrive(runtime.dead_letter_queue_url, settings()).tasks == []


def test_the_owner_retries_a_failed_task_through_the_api_and_only_a_failed_one(runtime, receiver):
    failed_task(runtime, receiver, "mine")
    receiver.status_for["/mine"] = 200
    status, refused = call_api(runtime, "POST", "/tasks/mine/retry", principal="bob")
    assert status == 404 and stored("mine")["status"] == "FAILED"  # not bob's to retry

    status, task = call_api(runtime, "POST", "/tasks/mine/retry", principal="alice")
    assert status == 200 and task["version"] == 2 and task["attempts"] == 0
    assert task["tries"] is None and "tries" not in stored("mine")  # not the new version's
    item = wait_for_status("mine", {"SUCCEEDED"})
    assert int(item["version"]) == 2
    assert [a.idempotency_key for a in receiver.received()] == ["mine:1", "mine:2"]
    status, refused = call_api(runtime, "POST", "/tasks/mine/retry", principal="alice")
    assert status == 409 and refused["error"]["field"] == "id"
    assert "SUCCEEDED" in refused["error"]["message"]


def test_cli_dry_run_reports_and_changes_nothing_then_redrives(runtime, receiver, capsys):
    failed_task(runtime, receiver, "dry")
    assert main(["redrive", "--stack", STACK_NAME, "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == [["dry", 1, "would redrive"]]
    assert stored("dry")["status"] == "FAILED" and dead_letters(runtime) == 1

    assert main(["redrive", "--stack", STACK_NAME]) == 0
    out = capsys.readouterr().out
    assert "dry" in out and "redriven" in out
    assert stored("dry")["version"] == 2


def test_a_task_failing_again_is_redriven_once_per_run(runtime, receiver):
    failed_task(runtime, receiver, "again")  # the target keeps answering 410

    def fail_again_before_the_next_read(task_id: str, version: int, outcome: str) -> None:
        if outcome == "redriven":  # version 2 fails, and its dead letter lands, mid-run
            wait_for_status(task_id, {"FAILED"})
            assert runtime.wait_for_executions(30)

    queue = runtime.dead_letter_queue_url
    report = redrive(queue, settings(), progress=fail_again_before_the_next_read)
    assert report.tasks == [("again", 1, "redriven"), ("again", 2, FAILED_AGAIN)]
    assert stored("again")["version"] == 2
    assert dead_letters(runtime) == 1  # version 2's, for the next run


def test_a_copy_of_a_dead_letter_is_deleted_as_a_copy(runtime, receiver):
    """A letter may be sent twice (an owed letter the reconciler sent as well): the copy of
    a version the run has redriven is neither redriven again nor left as failed again."""
    failed_task(runtime, receiver, "twice")
    sqs, queue = boto3.client("sqs"), runtime.dead_letter_queue_url
    [letter] = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)["Messages"]
    sqs.send_message(QueueUrl=queue, MessageBody=letter["Body"])  # its copy
    report = redrive(queue, settings())
    assert report.tasks[:2] == [("twice", 1, "redriven"), ("twice", 1, COPY)]
    # version 2 fails at once (its target still answers 410): its letter may land while the
    # run still reads (a loaded machine), and is left for the next run either way
    assert report.tasks[2:] in ([], [("twice", 2, FAILED_AGAIN)])
    wait_for_status("twice", {"FAILED"})
    assert runtime.wait_for_executions(30)
    [left] = [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=queue)["Messages"]]
    assert (left["task_id"], left["version"]) == ("twice", 2)  # only the new version's letter


@pytest.mark.slow
def test_a_batch_whose_invocation_fails_for_good_is_dead_lettered_and_settled(runtime, receiver):
    """Every invocation of the batch's executor fails as a whole: Fire retries, then the
    batch and its error go to the dead-letter queue and the execution fails. The letter
    stays while its tasks are in flight; the reconciler requeues them, they fire once, and
    the next redrive finds nothing left to do and deletes the letter."""
    ids = [f"dropped-{i}" for i in range(2)]
    due = clock.now_ms() + 6000
    for task_id in ids:  # PENDING, for the finder to pack into one batch
        store_task(webhook_task(receiver.url, due, task_id))
    invoke = runtime.invoke

    def unavailable(logical_id: str, event: dict) -> object:
        if logical_id == "WebhookExecutorFunction":
            raise TableUnavailable("injected: the table is out of reach")
        return invoke(logical_id, event)

    with mock.patch.object(runtime, "invoke", unavailable):
        assert runtime.run_finder()["executions"] == 1
        assert runtime.wait_for_executions(30)
    [execution] = runtime.executions()
    assert execution.status == "FAILED"
    [letter] = [json.loads(m["Body"]) for m in boto3.client("sqs").receive_message(
        QueueUrl=runtime.dead_letter_queue_url, VisibilityTimeout=0)["Messages"]]  # fmt: skip
    assert letter["execution"] == execution.execution_arn
    assert [t["task_id"] for t in letter["batch"]["tasks"]] == ids
    assert letter["batch"]["error"]["Error"] == "TableUnavailable"
    assert "payload" not in json.dumps(letter)  # ids only

    report = redrive(runtime.dead_letter_queue_url, settings())
    assert report.tasks == [(task_id, 1, IN_FLIGHT) for task_id in ids]
    assert dead_letters(runtime) == 1  # kept while its tasks are in flight
    settled = reconcile(settings(), due + LOOK_AFTER_MS + 1)
    # never claimed: still PENDING, started again, late
    assert sorted(str(o) for _, o in settled.tasks) == ["started_late", "started_late"]
    for task_id in ids:
        wait_for_status(task_id, {"SUCCEEDED"})
    assert sorted(a.task_id for a in receiver.received()) == ids
    assert redrive(runtime.dead_letter_queue_url, settings()).tasks == [
        (task_id, 1, "changed") for task_id in ids
    ]
    assert dead_letters(runtime) == 0
