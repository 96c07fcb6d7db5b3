"""Submitting by message: the submit queue, fed by producers and by the EventBridge rule.

A message body is a task submission as `POST /tasks` takes it, or an EventBridge event with
detail-type `tocsin.submit` whose `detail` is one. A `delay` counts from when the message
was sent (or the event's time). A message Tocsin refuses goes to the submit dead-letter
queue with its error, so the rest of its batch is scheduled; a failure that may pass
(throttling, an outage) is reported to Lambda, which delivers the message again.

The tasks of a batch that are due within the look-ahead are started together once the
batch is stored, packed as the finder packs (one execution per type and window), not one
execution each: an event-driven producer's burst then costs what the finder's would. A
task whose start fails goes to a check shard, where the reconciler's next look starts it.
"""

import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws, clock
from tocsin.dispatch import dispatch_all, due_soon, due_task, look_again_now
from tocsin.errors import InvalidTask, TaskError
from tocsin.model import owner_id
from tocsin.observability import logger
from tocsin.settings import settings
from tocsin.submit import submit_task

SUBMIT_DETAIL_TYPE = "tocsin.submit"

processor = BatchProcessor(event_type=EventType.SQS)


@dataclass(frozen=True)
class Envelope:
    body: Any
    owner: str
    sent_ms: int


def envelope(record: SQSRecord) -> Envelope:
    """The submission a message carries, who sent it and when."""
    try:
        body = json.loads(record.body)
    except ValueError:
        raise InvalidTask("body: not valid JSON", field="body") from None
    if isinstance(body, dict) and body.get("detail-type") == SUBMIT_DETAIL_TYPE:
        try:
            sent_ms = clock.to_ms(datetime.fromisoformat(body["time"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidTask("time: not an ISO-8601 event time", field="time") from None
        # The rule is on this account's default bus: the queue's account when none is given.
        account = body.get("account") or record.event_source_arn.split(":")[4]
        return Envelope(body.get("detail"), f"events:{account}", sent_ms)
    attributes = record.attributes
    return Envelope(body, owner_id(attributes.sender_id), int(attributes.sent_timestamp))


def _reject(record: SQSRecord, error: TaskError) -> None:
    """Park a refused message, with why, on the submit dead-letter queue."""
    aws.client("sqs").send_message(
        QueueUrl=settings().submit_dead_letter_queue_url,
        MessageBody=record.body,
        MessageAttributes={
            "error": {"DataType": "String", "StringValue": error.message},
            "error_code": {"DataType": "String", "StringValue": error.code},
            "error_field": {"DataType": "String", "StringValue": error.field or "body"},
            "message_id": {"DataType": "String", "StringValue": record.message_id},
        },
    )
    logger.warning("submission refused", message_id=record.message_id, field=error.field)


DISPATCH_MARGIN_S = 5  # of the invocation's time, kept back from starting the batch's tasks


def submit_batch(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Store every message's task (Lambda's partial batch reply for those that may pass
    later), then start the ones due within the look-ahead, packed."""
    config, stored_due = settings(), []

    def submit_record(record: SQSRecord) -> None:
        try:
            message = envelope(record)
            submitted = submit_task(
                message.body, message.owner, config, base_ms=message.sent_ms, dispatch=False
            )
        except TaskError as error:
            _reject(record, error)
            return
        logger.info("submitted", task_id=submitted.task["id"], new=submitted.created)
        if submitted.item is not None and due_soon(submitted.item, config):
            stored_due.append(due_task(submitted.item))

    reply = process_partial_response(event, submit_record, processor, context)
    if stored_due:
        left_s = context.get_remaining_time_in_millis() / 1000 - DISPATCH_MARGIN_S
        try:
            report = dispatch_all(stored_due, config, time.monotonic() + max(1.0, left_s))
        except (BotoCoreError, ClientError) as fault:
            logger.warning("batch not dispatched", tasks=len(stored_due), fault=repr(fault))
            left = tuple(stored_due)
        else:
            logger.info("dispatched", **report.as_dict())
            left = report.left
        look_again_now(left, config)  # for the reconciler's next look to start
    return reply
