"""SNS target: publish the task envelope; FIFO topics de-duplicate on the idempotency key."""

from typing import Any

from pydantic import Field

from tocsin import aws
from tocsin.targets.base import (
    ACCOUNT_REGION,
    PARTITION,
    Delivery,
    Target,
    aws_target_errors,
    fifo_parameters,
)


class SnsTarget(Target):
    aws_services = ("sns",)
    topic_arn: str = Field(
        pattern=rf"^{PARTITION}:sns:{ACCOUNT_REGION}:[A-Za-z0-9_-]{{1,256}}(\.fifo)?$"
    )
    # SNS refuses at publish a subject of 100 characters or more, or with a line break or
    # another control character (Publish, Subject): refused here, at submit, instead.
    subject: str | None = Field(
        default=None, min_length=1, max_length=99, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$"
    )
    message_group_id: str | None = Field(default=None, min_length=1, max_length=128)

    def send(self, delivery: Delivery) -> dict[str, Any]:
        message: dict[str, Any] = {"TopicArn": self.topic_arn, "Message": delivery.envelope()}
        if self.subject:
            message["Subject"] = self.subject
        if self.topic_arn.endswith(".fifo"):
            message.update(fifo_parameters(self.message_group_id, delivery))
        with aws_target_errors():
            reply = aws.target_client("sns").publish(**message)
        return {"message_id": reply["MessageId"]}
