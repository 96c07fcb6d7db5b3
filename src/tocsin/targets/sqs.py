"""SQS target: send the task envelope; FIFO queues de-duplicate on the idempotency key."""

from typing import Any

from pydantic import Field

from tocsin import aws
from tocsin.targets.base import Delivery, Target, aws_target_errors, fifo_parameters


class SqsTarget(Target):
    aws_services = ("sqs",)
    queue_url: str = Field(
        pattern=r"^https://(sqs\.[a-z0-9-]+|[a-z0-9-]+\.queue|queue)\.amazonaws\.com(\.cn)?"
        r"/\d{12}/[A-Za-z0-9_-]{1,80}(\.fifo)?$"
    )
    message_group_id: str | None = Field(default=None, min_length=1, max_length=128)

    def send(self, delivery: Delivery) -> dict[str, Any]:
        message: dict[str, Any] = {"QueueUrl": self.queue_url, "MessageBody": delivery.envelope()}
        if self.queue_url.endswith(".fifo"):
            message.update(fifo_parameters(self.message_group_id, delivery))
        with aws_target_errors():
            reply = aws.target_client("sqs").send_message(**message)
        return {"message_id": reply["MessageId"]}
