"""The typed targets: one module per task type, each a validated model that can `send`."""

from typing import Any

from tocsin.model import TaskType
from tocsin.targets.base import Delivery, Target
from tocsin.targets.email import EmailTarget
from tocsin.targets.eventbridge import EventBridgeTarget
from tocsin.targets.lambda_function import LambdaTarget
from tocsin.targets.sns import SnsTarget
from tocsin.targets.sqs import SqsTarget
from tocsin.targets.webhook import WebhookTarget

TARGETS: dict[TaskType, type[Target]] = {
    TaskType.WEBHOOK: WebhookTarget,
    TaskType.LAMBDA: LambdaTarget,
    TaskType.EVENTBRIDGE: EventBridgeTarget,
    TaskType.SQS: SqsTarget,
    TaskType.SNS: SnsTarget,
    TaskType.EMAIL: EmailTarget,
}


def parse_target(task_type: TaskType, raw: Any) -> Target:
    """Validate a target for its type (raises pydantic's ValidationError naming the field)."""
    return TARGETS[task_type].model_validate(raw)


__all__ = ["TARGETS", "Delivery", "Target", "parse_target"]
