"""What the embedded runtime keeps across a restart: its tables, queue messages and secrets.

On AWS the services hold this state; locally it lives in moto, in memory, and would die
with the process. A snapshot keys every table and queue by its logical id in the
template, since moto names them with a random suffix per stack. Executions cannot be
kept: a task they held (PENDING and already started, or RUNNING in its executor) is
started again at the same version. A RUNNING task may have acted before the stop: what it
sent and could not mark is in the sent log (`tocsin.sent`), restored with the tables, and
its next executor records that instead of sending again.
"""

import json
from pathlib import Path
from typing import Any

import boto3

from tocsin import clock
from tocsin.finder import HORIZON
from tocsin.index_keys import check_keys, in_check_shard, writers_own
from tocsin.model import TaskStatus
from tocsin.reconcile import Reconciled, reconcile
from tocsin.settings import Settings, settings
from tocsin.store import TaskStore

BATCH = 25  # BatchWriteItem's limit
PARTS = {"tables", "queues", "secrets"}


class StateFileError(ValueError):
    """The state file cannot be read as a snapshot: the runtime does not start on it."""


def snapshot(stack_name: str) -> dict[str, Any]:
    """Every item of the stack's tables, every message of its queues, its secrets' values."""
    tables, queues = _resources(stack_name)
    dynamodb = boto3.client("dynamodb")
    state: dict[str, Any] = {"tables": {}, "queues": {}, "secrets": {}}
    for logical_id, name in tables.items():
        pages = dynamodb.get_paginator("scan").paginate(TableName=name, ConsistentRead=True)
        state["tables"][logical_id] = [item for page in pages for item in page["Items"]]
    for logical_id, url in queues.items():
        state["queues"][logical_id] = [
            {"body": m.body, "attributes": m.message_attributes} for m in _queue(url)._messages
        ]
    client = boto3.client("secretsmanager")
    for secret in client.list_secrets()["SecretList"]:
        value = client.get_secret_value(SecretId=secret["ARN"])["SecretString"]
        state["secrets"][secret["Name"]] = value
    return state


def restore(stack_name: str, state: dict[str, Any]) -> None:
    """Put a snapshot's items, messages and secret values into a freshly created stack."""
    tables, queues = _resources(stack_name)
    dynamodb = boto3.client("dynamodb")
    for logical_id, items in state["tables"].items():
        for start in range(0, len(items), BATCH):
            writes = [{"PutRequest": {"Item": item}} for item in items[start : start + BATCH]]
            dynamodb.batch_write_item(RequestItems={tables[logical_id]: writes})
    for logical_id, messages in state["queues"].items():
        url = queues[logical_id]
        backend, name = _sqs_backend(url), url.rsplit("/", 1)[1]
        for message in messages:
            backend.send_message(name, message["body"], message_attributes=message["attributes"])
    client = boto3.client("secretsmanager")
    for name, value in state["secrets"].items():
        client.put_secret_value(SecretId=name, SecretString=value)


def requeue_interrupted() -> list[str]:
    """Tasks whose executions died with the last runtime (none of them runs here): each one
    such an execution may have held is put in a check shard and looked at by the
    reconciler at once, which starts it again (requeued, if it was RUNNING); their ids."""
    config, now = settings(), clock.now_ms()
    store = TaskStore(config.tasks_table)
    horizon = store.horizon(HORIZON) or 0
    request: dict[str, Any] = {"ConsistentRead": True}
    table = boto3.resource("dynamodb").Table(config.tasks_table)
    while True:
        page = table.scan(**request)
        for item in page["Items"]:
            if _maybe_held(item, horizon, config):
                task_id = item["task_id"]
                store.look_again(task_id, int(item["version"]), check_keys(task_id, now, config))
        if "LastEvaluatedKey" not in page:
            break
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    report = reconcile(config, until_ms=now)
    restarted = (Reconciled.REQUEUED, Reconciled.STARTED_LATE)
    return [task_id for task_id, outcome in report.tasks if outcome in restarted]


def _maybe_held(item: dict[str, Any], finder_horizon: int, config: Settings) -> bool:
    """Whether an execution may have held the task: RUNNING, or PENDING and started (by the
    finder, up to its horizon, or by its writer), or put for a look."""
    if item.get("status") == TaskStatus.RUNNING:
        return True
    if item.get("status") != TaskStatus.PENDING or "gsi_pk" not in item:
        return False
    due, placed = int(item["due_ms"]), int(item.get("placed_ms", 0))
    return in_check_shard(item) or due <= finder_horizon or writers_own(due, placed, config)


def load(path: Path) -> dict[str, Any] | None:
    """A snapshot saved by `save`, or None when there is none yet."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StateFileError(f"{path} cannot be read: {error}") from error
    if not isinstance(saved, dict) or set(saved) != PARTS:
        raise StateFileError(f"{path} is not a Tocsin state file ({', '.join(sorted(PARTS))})")
    return saved


def save(path: Path, state: dict[str, Any]) -> None:
    """Write a snapshot whole, or not at all: a crash mid-write leaves the last one."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def _resources(stack_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The stack's tables (logical id -> name) and queues (logical id -> URL)."""
    tables, queues = {}, {}
    client = boto3.client("cloudformation")
    for resource in client.describe_stack_resources(StackName=stack_name)["StackResources"]:
        kind = resource.get("ResourceType")
        if kind == "AWS::DynamoDB::Table":
            tables[resource["LogicalResourceId"]] = resource["PhysicalResourceId"]
        elif kind == "AWS::SQS::Queue":
            queues[resource["LogicalResourceId"]] = resource["PhysicalResourceId"]
    return tables, queues


def _sqs_backend(url: str) -> Any:
    """moto's SQS of the queue at `url` (https://sqs.<region>.amazonaws.com/<account>/<name>)."""
    from moto.sqs.models import sqs_backends

    region = url.split("/")[2].split(".")[1]
    account = url.split("/")[3]
    return sqs_backends[account][region]


def _queue(url: str) -> Any:
    """moto's queue: its messages whether visible or not (in flight ones count too)."""
    return _sqs_backend(url).get_queue(url.rsplit("/", 1)[1])
