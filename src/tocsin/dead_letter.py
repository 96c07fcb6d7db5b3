"""A failed task's dead letter: ids, the execution and the error, nothing more.

A task is marked FAILED before its letter is sent, and stays in a check shard until the
letter is known sent: a failer that dies or meets an SQS outage in between leaves the
letter owed, and the reconciler sends it (`index_keys.LETTER_GRACE_MS`). A letter may
so be sent twice, never lost; `task_id` and `version` tell the copies apart.

Never the payload or the target: target headers may hold credentials, and redrive reads
the task from the table. The whole-batch letters of the state machine hold `batch.tasks`.
"""

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws
from tocsin.observability import logger
from tocsin.settings import settings
from tocsin.store import TaskStore


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


def send_letter(
    store: TaskStore,
    task_id: str,
    version: int,
    task_type: str,
    execution: str,
    error: dict[str, str],
) -> bool:
    """Send a FAILED version's letter and record it sent; False if either failed (the
    letter is then still owed, for the reconciler)."""
    try:
        send_dead_letter(task_id, version, task_type, execution, error)
        store.letter_sent(task_id, version)
    except (BotoCoreError, ClientError) as fault:
        logger.warning("dead letter owed", task_id=task_id, version=version, fault=repr(fault))
        return False
    return True
