"""What every target shares: its validated shape, the delivery it sends, AWS error mapping."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict

from tocsin import aws
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.fire import wire
from tocsin.targets import aws_call

ACCOUNT_REGION = r"[a-z]{2}(-[a-z]+)+-\d:\d{12}"
PARTITION = r"arn:aws(-[a-z]+)*"


class Delivery(BaseModel):
    """One action: the task version it belongs to and the payload, as submitted."""

    task_id: str
    version: int
    idempotency_key: str
    payload_json: bytes  # UTF-8
    attempt: int = 1  # which attempt this is: 1 for the first (a webhook's Tocsin-Attempt)

    def envelope(self) -> str:
        """The JSON most targets carry: ids for the receiver's own de-duplication, which
        attempt this is, then the payload."""
        return json.dumps(
            {
                "task_id": self.task_id,
                "version": self.version,
                "idempotency_key": self.idempotency_key,
                "attempt": self.attempt,
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
    """A validated target. `prepare` runs before the gate, `send` at the due time (a
    BatchedTarget's tasks go out by `send_entries` instead, ten to a call)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # The clients to create at init, not on the clock: the target's own (its sends), and
    # ours that its sends need (a webhook's signing secret).
    aws_services: ClassVar[tuple[str, ...]] = ()
    own_services: ClassVar[tuple[str, ...]] = ()

    @property
    def attempt_limit_s(self) -> float:
        """The longest one `send` can take: an executor starts no attempt that could
        outlast its invocation (a killed attempt may have acted, unrecorded)."""
        return aws.target_attempt_limit_s()

    @property
    def host_key(self) -> str:
        """Where its sends go, as a failing host is held back (`tocsin.holds`)."""
        raise NotImplementedError(type(self).__name__)

    def prepare(self) -> None:
        """Work that can be done ahead of the due time (resolving, checking)."""

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        """Build the request and write it at its `turn`; what came of it."""
        raise NotImplementedError(type(self).__name__)


# SendMessageBatch, PublishBatch and PutEvents each take ten entries a call
# (tocsin.model.BATCH_ENTRIES), and 256 KiB together (SQS allows 1 MiB since 2025, but a
# queue's MaximumMessageSize may be less).
BATCH_BYTES = 256 * 1024
TargetError = PermanentTargetError | TransientTargetError
Answer = dict[str, Any] | TargetError  # what one entry of a call came to


class BatchedTarget(Target):
    """A target whose API takes ten entries a call. The tasks of a batch due in one
    millisecond at one queue, topic or bus go out ten to a call: after the gate, each call's
    request building and signing is what a dense millisecond waits on, on the seventh of a
    core a 256 MB executor has."""

    def batch_key(self) -> str:
        """Where the call goes: targets with the same key can share one call."""
        raise NotImplementedError(type(self).__name__)

    @property
    def host_key(self) -> str:
        return self.batch_key()

    def entry(self, delivery: Delivery) -> dict[str, Any]:
        """This delivery's entry of the call, without its Id."""
        raise NotImplementedError(type(self).__name__)

    @classmethod
    def send_entries(
        cls, key: str, entries: list[dict[str, Any]], turn: wire.Turn = wire.NOW
    ) -> list[Answer]:
        """One call with `entries`, written at its `turn`: each entry's answer or error, in
        order. An error of the whole call is raised (a TargetError, for every entry)."""
        raise NotImplementedError(cls.__name__)


def entry_bytes(entry: dict[str, Any]) -> int:
    """What an entry counts against a call's 256 KiB: its text fields' UTF-8 bytes."""
    return sum(len(value.encode()) for value in entry.values() if isinstance(value, str))


class MessagesTarget(BatchedTarget):
    """SQS and SNS: a batch call whose reply lists its entries by Id, Successful and Failed
    (a failure the sender caused is permanent, any other transient, and so is an entry the
    reply leaves out)."""

    service: ClassVar[str]  # the client's
    operation: ClassVar[str]  # the client's method, and the names of its two parameters
    key_parameter: ClassVar[str]
    entries_parameter: ClassVar[str]

    @classmethod
    def send_entries(
        cls, key: str, entries: list[dict[str, Any]], turn: wire.Turn = wire.NOW
    ) -> list[Answer]:
        numbered = [{"Id": str(i), **entry} for i, entry in enumerate(entries)]
        call = getattr(aws.target_client(cls.service), cls.operation)
        with aws_target_call(turn):
            reply = call(**{cls.key_parameter: key, cls.entries_parameter: numbered})
        answers: list[Answer] = [TransientTargetError("no answer for this entry")] * len(entries)
        for done in reply.get("Successful", []):
            answers[int(done["Id"])] = {"message_id": done["MessageId"]}
        for failed in reply.get("Failed", []):
            message = f"{failed.get('Code')}: {failed.get('Message')}"
            kind = PermanentTargetError if failed.get("SenderFault") else TransientTargetError
            answers[int(failed["Id"])] = kind(message)
        return answers


@contextmanager
def aws_target_call(turn: wire.Turn) -> Iterator[None]:
    """A call of an AWS target's client, made in `turn` (written at its gate by the wire:
    `tocsin.targets.aws_call`); what it raises mapped to the two failure kinds."""
    try:
        with aws_call.through(turn):
            yield
    except ClientError as error:
        message = f"{aws.error_code(error)}: {error}"
        if aws.is_transient(error):  # throttled: counts towards the age only (tocsin.retry)
            raise TransientTargetError(message, throttled=aws.is_throttling(error)) from error
        raise PermanentTargetError(message) from error
    except BotoCoreError as error:
        raise TransientTargetError(f"{type(error).__name__}: {error}") from error
