"""A failed task's dead letter: ids, the execution and the error, nothing more.

Never the payload or the target: target headers may hold credentials, and redrive reads
the task from the table. The whole-batch letters of the state machine hold `batch.tasks`.
"""

import json
from typing import Any

from tocsin import aws
from tocsin.settings import settings


def send_dead_letter(
    task_id: str, version: int, task_type: str, execution: str, error: dict[str, str]
) -> None:
    """Put one failed task version on the dead-letter queue (botocore retries the send)."""
    body: dict[str, Any] = {
        "task_id": task_id,
        "version": version,
        "task_type": task_type,
        "execution": execution,
        "error": error,
    }
    aws.client("sqs").send_message(
        QueueUrl=settings().dead_letter_queue_url, MessageBody=json.dumps(body)
    )
