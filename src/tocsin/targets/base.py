"""What every target shares: its validated shape, the delivery it sends, AWS error mapping."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict

from tocsin import aws
from tocsin.errors import PermanentTargetError, TransientTargetError

ACCOUNT_REGION = r"[a-z]{2}(-[a-z]+)+-\d:\d{12}"
PARTITION = r"arn:aws(-[a-z]+)*"


class Delivery(BaseModel):
    """One action: the task version it belongs to and the payload, as submitted."""

    task_id: str
    version: int
    idempotency_key: str
    payload_json: str

    def envelope(self) -> str:
        """The JSON most targets carry: ids for the receiver's own de-duplication, then payload."""
        return json.dumps(
            {
                "task_id": self.task_id,
                "version": self.version,
                "idempotency_key": self.idempotency_key,
                "payload": json.loads(self.payload_json),
            },
            separators=(",", ":"),
        )


def fifo_parameters(message_group_id: str | None, delivery: Delivery) -> dict[str, str]:
    """FIFO queues and topics: ordered within the group, de-duplicated on the idempotency key."""
    return {
        "MessageGroupId": message_group_id or delivery.task_id,
        "MessageDeduplicationId": delivery.idempotency_key,
    }


class Target(BaseModel):
    """A validated target. `prepare` runs before the gate, `send` at the due time."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    aws_services: ClassVar[tuple[str, ...]] = ()  # clients to create at init, not on the clock

    @property
    def attempt_limit_s(self) -> float:
        """The longest one `send` can take: an executor starts no attempt that could
        outlast its invocation (a killed attempt may have acted, unrecorded)."""
        return aws.TARGET_ATTEMPT_LIMIT_S

    def prepare(self) -> None:
        """Work that can be done ahead of the due time (resolving, checking)."""

    def send(self, delivery: Delivery) -> dict[str, Any]:
        raise NotImplementedError(type(self).__name__)


@contextmanager
def aws_target_errors() -> Iterator[None]:
    """Map what an AWS target API raises to the two failure kinds the state machine knows."""
    try:
        yield
    except ClientError as error:
        message = f"{aws.error_code(error)}: {error}"
        if aws.is_transient(error):
            raise TransientTargetError(message) from error
        raise PermanentTargetError(message) from error
    except BotoCoreError as error:
        raise TransientTargetError(f"{type(error).__name__}: {error}") from error
