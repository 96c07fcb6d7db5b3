"""SNS target: publish the task envelope, ten to a call (PublishBatch); FIFO topics
de-duplicate on the idempotency key."""

from typing import Any

from pydantic import Field

from tocsin.targets.base import (
    ACCOUNT_REGION,
    PARTITION,
    Delivery,
    MessagesTarget,
    fifo_parameters,
)


class SnsTarget(MessagesTarget):
    service, operation = "sns", "publish_batch"
    key_parameter, entries_parameter = "TopicArn", "PublishBatchRequestEntries"
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

    def batch_key(self) -> str:
        return self.topic_arn

    def entry(self, delivery: Delivery) -> dict[str, Any]:
        entry: dict[str, Any] = {"Message": delivery.envelope()}
        if self.subject:
            entry["Subject"] = self.subject
        if self.topic_arn.endswith(".fifo"):
            entry.update(fifo_parameters(self.message_group_id, delivery))
        return entry
