"""What Lambda's SQS event source mapping does, for the embedded runtime.

moto invokes a mapped function inside `SendMessage` itself, with fixed sender and timestamp
attributes and without partial-batch replies. The runtime switches moto's mappings off and
polls instead: receive a batch, invoke the function with Lambda's SQS event, delete what it
handled and leave the reported failures to come back after the visibility timeout (and to
the queue's dead-letter queue after its maxReceiveCount), as on AWS.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tocsin import aws


@dataclass(frozen=True)
class QueueMapping:
    function: str  # the logical id of the function it invokes
    queue_arn: str
    batch_size: int
    reports_failures: bool

    @property
    def queue_url(self) -> str:
        _, _, _, region, account, name = self.queue_arn.split(":")
        return f"https://sqs.{region}.amazonaws.com/{account}/{name}"


def take_over_mappings(functions_by_arn: dict[str, str]) -> list[QueueMapping]:
    """Disable moto's SQS mappings and return them, to be polled with `poll`."""
    client = aws.client("lambda")
    mappings = []
    failures = "ReportBatchItemFailures"
    for found in client.list_event_source_mappings()["EventSourceMappings"]:
        if ":sqs:" not in found["EventSourceArn"]:
            continue
        client.update_event_source_mapping(UUID=found["UUID"], Enabled=False)
        mappings.append(
            QueueMapping(
                function=functions_by_arn[found["FunctionArn"]],
                queue_arn=found["EventSourceArn"],
                batch_size=int(found["BatchSize"]),
                reports_failures=failures in found.get("FunctionResponseTypes", []),
            )
        )
    return mappings


def _record(message: dict[str, Any], mapping: QueueMapping) -> dict[str, Any]:
    attributes = {
        name: {"stringValue": value["StringValue"], "dataType": value["DataType"]}
        for name, value in message.get("MessageAttributes", {}).items()
    }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes", {}),
        "messageAttributes": attributes,
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": mapping.queue_arn,
        "awsRegion": mapping.queue_arn.split(":")[3],
    }


def poll(mapping: QueueMapping, invoke: Callable[[str, Any], Any]) -> int:
    """One receive-invoke-delete round; the number of messages handed to the function."""
    sqs = aws.client("sqs")
    messages = sqs.receive_message(
        QueueUrl=mapping.queue_url,
        MaxNumberOfMessages=mapping.batch_size,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    ).get("Messages", [])
    if not messages:
        return 0
    try:
        reply = invoke(mapping.function, {"Records": [_record(m, mapping) for m in messages]})
    except Exception:  # the whole batch comes back after the visibility timeout
        return len(messages)
    failed = set()
    if mapping.reports_failures and isinstance(reply, dict):
        failed = {f["itemIdentifier"] for f in reply.get("batchItemFailures", [])}
    handled = [m for m in messages if m["MessageId"] not in failed]
    for start in range(0, len(handled), 10):
        sqs.delete_message_batch(
            QueueUrl=mapping.queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(handled[start : start + 10])
            ],
        )
    return len(messages)
