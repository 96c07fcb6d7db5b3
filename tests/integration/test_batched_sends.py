"""Tasks of one batch due in the same millisecond at one queue, topic or bus go out ten to a
call (SQS SendMessageBatch, SNS PublishBatch, EventBridge PutEvents), each once; an entry
the service refuses for now is sent again, alone, and one refused for good fails alone."""

import json
import threading
from typing import Any

import pytest

from tests.conftest import hooked, store_task, stored
from tests.integration.test_targets import SAMPLE_TARGETS, TARGETS
from tocsin import aws, clock

CALLS = {  # task type: its executor, the client's service and the batch operation
    "sqs": ("SqsExecutorFunction", "sqs", "SendMessageBatch"),
    "sns": ("SnsExecutorFunction", "sns", "PublishBatch"),
    "eventbridge": ("EventBridgeExecutorFunction", "events", "PutEvents"),
}
ENTRIES = {"SendMessageBatch": "Entries", "PublishBatch": "PublishBatchRequestEntries"}


def due_together(task_type: str, count: int, target: dict[str, Any]) -> dict[str, Any]:
    """`count` tasks stored due in one millisecond (a second ago, so the gate lets go at
    once), and the batch event Fire would hand their executor."""
    due = clock.now_ms() - 1000
    ids = [f"{task_type}-{i:02d}" for i in range(count)]
    for task_id in ids:
        body = {
            "id": task_id,
            "due_at": clock.to_iso(due),
            "type": task_type,
            "target": target,
            "payload": {"task": task_id},
        }
        store_task(body, submitted_ms=due - 5000)
    tasks = [{"task_id": task_id, "version": 1, "due_ms": due} for task_id in ids]
    return {"execution": "arn:aws:states:::execution:m:one", "task_type": task_type, "tasks": tasks}


def all_delivered(target: Any) -> list[Any]:
    """Everything the target's sink received, read until it is empty."""
    delivered, more = [], target.delivered()
    while more:
        delivered += more
        more = target.delivered()
    return delivered


@pytest.mark.parametrize("task_type", sorted(CALLS))
def test_tasks_due_in_one_millisecond_at_one_target_go_out_ten_to_a_call(runtime, task_type):
    function, service, operation = CALLS[task_type]
    target = TARGETS[task_type]()
    target.setup(runtime)
    event = due_together(task_type, 23, SAMPLE_TARGETS[task_type])
    entries: list[int] = []
    entries_key = ENTRIES.get(operation, "Entries")

    def count(params: dict[str, Any], **_: Any) -> None:
        entries.append(len(params[entries_key]))

    with hooked(aws.target_client(service), (f"provide-client-params.{service}.*", count)):
        result = runtime.invoke(function, event)
    assert result == {"tasks": 23, "claimed": 23, "fired": 23}
    assert sorted(entries) == [3, 10, 10]  # three calls, none of them alone
    ids = [task["task_id"] for task in event["tasks"]]
    assert sorted(payload["task"] for payload in all_delivered(target)) == ids
    assert {stored(task_id)["status"] for task_id in ids} == {"SUCCEEDED"}


def test_an_entry_refused_for_now_is_sent_again_alone_and_one_refused_for_good_fails_alone(
    runtime,
):
    """The queue answers one entry InternalError (not the sender's fault) and another
    InvalidMessageContents (the sender's): the first is sent again after a backoff, in a
    call of its own, the second fails; the other three are sent once."""
    target = TARGETS["sqs"]()
    target.setup(runtime)
    event = due_together("sqs", 5, SAMPLE_TARGETS["sqs"])
    refusals = {"sqs-01": ("InternalError", False), "sqs-03": ("InvalidMessageContents", True)}
    calls: list[list[str]] = []
    numbered: list[dict[str, int]] = []  # each call's entries, and the attempt each says it is
    held_back = threading.local()  # a call's refused entries, from its params to its reply

    def refuse(params: dict[str, Any], **_: Any) -> None:
        by_id = {json.loads(e["MessageBody"])["task_id"]: e for e in params["Entries"]}
        calls.append(list(by_id))
        numbered.append({i: json.loads(e["MessageBody"])["attempt"] for i, e in by_id.items()})
        held_back.entries = []
        for task_id in [task_id for task_id in by_id if task_id in refusals]:
            code, sender_fault = refusals.pop(task_id)
            entry = by_id[task_id]
            held_back.entries.append({"Id": entry["Id"], "Code": code, "SenderFault": sender_fault})
            params["Entries"].remove(entry)  # not sent, as the queue would not take it

    def answer(parsed: dict[str, Any], **_: Any) -> None:
        parsed.setdefault("Failed", []).extend(held_back.entries)

    with hooked(
        aws.target_client("sqs"),
        ("provide-client-params.sqs.SendMessageBatch", refuse),
        ("after-call.sqs.SendMessageBatch", answer),
    ):
        result = runtime.invoke("SqsExecutorFunction", event)
    assert result == {"tasks": 5, "claimed": 5, "fired": 4, "failed": 1}
    assert calls == [[f"sqs-{i:02d}" for i in range(5)], ["sqs-01"]]
    assert set(numbered[0].values()) == {1} and numbered[1] == {"sqs-01": 2}
    delivered = sorted(payload["task"] for payload in all_delivered(target))
    assert delivered == ["sqs-00", "sqs-01", "sqs-02", "sqs-04"]  # each once
    again = stored("sqs-01")
    assert again["status"] == "SUCCEEDED" and int(again["attempts"]) == 2
    assert "InternalError" in json.loads(again["tries"])[0]["error"]
    refused = stored("sqs-03")
    assert refused["status"] == "FAILED" and int(refused["attempts"]) == 1
    assert "InvalidMessageContents" in json.loads(refused["error"])["Cause"]
