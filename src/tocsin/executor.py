"""What every typed executor does: validate the claimed task, gate, act once, report.

The state machine's Claim hands over the task item (DynamoDB JSON). The action runs under
Powertools Idempotency keyed by `<task_id>:<version>`, so a retried invocation after a
success returns the recorded result instead of acting again.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyPersistenceLayerError,
)
from aws_lambda_powertools.utilities.typing import LambdaContext
from boto3.dynamodb.types import TypeDeserializer
from pydantic import BaseModel, ValidationError

from tocsin import aws, clock, gate
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.model import DEFAULT_MAX_ATTEMPTS, TaskType, idempotency_key
from tocsin.observability import logger, metrics, tracer
from tocsin.settings import settings
from tocsin.store import TaskStore
from tocsin.targets import TARGETS, Delivery, Target, parse_target

_deserializer = TypeDeserializer()
idempotency_config = IdempotencyConfig(
    event_key_jmespath="idempotency_key", expires_after_seconds=24 * 3600
)


class ExecutorEvent(BaseModel):
    """What the state machine passes: the execution's task fields and the claimed item."""

    task_id: str
    version: int
    due_ms: int
    task: dict[str, Any]


@dataclass(frozen=True)
class ClaimedTask:
    task_id: str
    version: int
    due_ms: int
    task_type: TaskType
    target: Target
    payload_json: str
    max_attempts: int

    def delivery(self) -> Delivery:
        return Delivery(
            task_id=self.task_id,
            version=self.version,
            idempotency_key=idempotency_key(self.task_id, self.version),
            payload_json=self.payload_json,
        )


def claimed_task(event: dict[str, Any]) -> ClaimedTask:
    """Parse the executor's input; anything malformed is a permanent failure."""
    try:
        parsed = ExecutorEvent.model_validate(event)
        item = {name: _deserializer.deserialize(value) for name, value in parsed.task.items()}
        task_type = TaskType(item["task_type"])
        target = parse_target(task_type, json.loads(item["target"]))
        return ClaimedTask(
            task_id=parsed.task_id,
            version=parsed.version,
            due_ms=parsed.due_ms,
            task_type=task_type,
            target=target,
            payload_json=item["payload"],
            max_attempts=int(item.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
        )
    except (ValidationError, KeyError, ValueError, TypeError) as error:
        raise PermanentTargetError(f"malformed executor input: {error}") from error


@cache
def _persistence(table_name: str) -> DynamoDBPersistenceLayer:
    return DynamoDBPersistenceLayer(table_name=table_name, boto3_client=aws.client("dynamodb"))


def _deliver_once(task: ClaimedTask) -> dict[str, Any]:
    """Gate and send under the idempotency record (written before the gate, off the clock).

    A retry after a success gets the recorded fire time and result back, and does not act.
    When the record cannot be written, the attempt is retried, unless the send already
    happened: then the delivery is reported as it is, for a retry would send again.
    """
    sent: list[dict[str, Any]] = []

    def deliver(delivery: dict[str, Any]) -> dict[str, Any]:
        fired_ms = gate.wait_until(task.due_ms)
        sent.append({"fired_ms": fired_ms, "result": task.target.send(Delivery(**delivery))})
        return sent[0]

    once = idempotent_function(
        data_keyword_argument="delivery",
        config=idempotency_config,
        persistence_store=_persistence(settings().idempotency_table),
    )(deliver)
    try:
        return once(delivery=task.delivery().model_dump())
    except IdempotencyPersistenceLayerError as error:
        if not sent:
            raise TransientTargetError(f"idempotency store: {error}") from error
        logger.warning("delivered, but not recorded as delivered", task_id=task.task_id)
        return sent[0]


def _act(task: ClaimedTask) -> dict[str, Any]:
    """Prepare, gate and send, counting the attempt; the last allowed attempt fails for good."""
    try:
        attempt = TaskStore(settings().tasks_table).count_attempt(task.task_id, task.version)
    except Exception as error:  # the table is busy or down: the state machine tries again
        if aws.is_transient(error):
            raise TransientTargetError(f"attempt not recorded: {aws.error_code(error)}") from error
        raise
    if attempt is None:  # not claimed in the table: a hand-made event (events/ samples)
        logger.warning("attempt not counted", task_id=task.task_id, version=task.version)
        attempt = 1
    try:
        task.target.prepare()
        return _deliver_once(task)
    except TransientTargetError as error:
        if attempt >= task.max_attempts:
            raise PermanentTargetError(f"gave up after {attempt} attempts: {error}") from error
        raise


def execute(event: dict[str, Any], expected_type: TaskType) -> dict[str, Any]:
    """Validate, sleep until due, act once; the reply is what MarkSucceeded records."""
    task = claimed_task(event)
    if task.task_type is not expected_type:
        raise PermanentTargetError(f"a {task.task_type} task reached the {expected_type} executor")
    try:
        done = _act(task)
    except PermanentTargetError:
        metrics.add_metric(name="Failed", unit=MetricUnit.Count, value=1)
        raise
    lateness_ms = done["fired_ms"] - task.due_ms
    metrics.add_metric(name="Fired", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="LatenessMs", unit=MetricUnit.Milliseconds, value=lateness_ms)
    logger.info("fired", task_id=task.task_id, version=task.version, lateness_ms=lateness_ms)
    return {
        "fired_at": clock.to_iso(done["fired_ms"]),
        "fired_ms": done["fired_ms"],
        "lateness_ms": lateness_ms,
        "result": done["result"],
    }


def executor_handler(task_type: TaskType) -> Callable[[dict[str, Any], LambdaContext], Any]:
    """The Lambda handler of one task type's executor; its SDK clients are made now, at init."""
    _persistence(settings().idempotency_table)
    aws.resource("dynamodb")  # the attempt count on the Tasks table
    for service in TARGETS[task_type].aws_services:
        aws.client(service)

    @logger.inject_lambda_context(clear_state=True)
    @tracer.capture_lambda_handler(capture_response=False)
    @metrics.log_metrics
    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        idempotency_config.register_lambda_context(context)
        return execute(event, task_type)

    return handler
