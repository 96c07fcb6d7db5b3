"""SQS target: send the task envelope, ten to a call (SendMessageBatch); FIFO queues
de-duplicate on the idempotency key."""

from typing import Any

from pydantic import Field

from tocsin.targets.base import Delivery, MessagesTarget, fifo_parameters


class SqsTarget(MessagesTarget):
    service, operation = "sqs", "send_message_batch"
    key_parameter, entries_parameter = "QueueUrl", "Entries"
    aws_services = ("sqs",)
    queue_url: str = Field(
        pattern=r"^https://(sqs\.[a-z0-9-]+|[a-z0-9-]+\.queue|queue)\.amazonaws\.com(\.cn)?"
        r"/\d{12}/[A-Za-z0-9_-]{1,80}(\.fifo)?$"
    )
    message_group_id: str | None = Field(default=None, min_length=1, max_length=128)

    def batch_key(self) -> str:
        return self.queue_url

    def entry(self, delivery: Delivery) -> dict[str, Any]:
        entry: dict[str, Any] = {"MessageBody": delivery.envelope()}
        if self.queue_url.endswith(".fifo"):
            entry.update(fifo_parameters(self.message_group_id, delivery))
        return entry
