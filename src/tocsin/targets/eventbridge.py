"""EventBridge target: put events whose detail is the task envelope, ten to a call."""

from typing import Any

from pydantic import Field, field_validator

from tocsin import aws
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.fire import wire
from tocsin.targets.base import (
    ACCOUNT_REGION,
    PARTITION,
    Answer,
    BatchedTarget,
    Delivery,
    aws_target_call,
)

_TRANSIENT_ENTRY_ERRORS = {"ThrottlingException", "InternalFailure", "InternalException"}


class EventBridgeTarget(BatchedTarget):
    aws_services = ("events",)
    event_bus: str = Field(
        default="default",
        pattern=rf"^({PARTITION}:events:{ACCOUNT_REGION}:event-bus/)?[A-Za-z0-9._/-]{{1,256}}$",
    )
    detail_type: str = Field(min_length=1, max_length=128)
    source: str = Field(default="tocsin", pattern=r"^[A-Za-z0-9._-]{1,256}$")

    @field_validator("source")
    @classmethod
    def _not_reserved(cls, source: str) -> str:
        if source.startswith("aws."):
            raise ValueError("sources starting with 'aws.' are reserved for AWS")
        return source

    def batch_key(self) -> str:
        return self.event_bus

    def entry(self, delivery: Delivery) -> dict[str, Any]:
        return {
            "EventBusName": self.event_bus,
            "Source": self.source,
            "DetailType": self.detail_type,
            "Detail": delivery.envelope(),
        }

    @classmethod
    def send_entries(
        cls, key: str, entries: list[dict[str, Any]], turn: wire.Turn = wire.NOW
    ) -> list[Answer]:
        with aws_target_call(turn):
            reply = aws.target_client("events").put_events(Entries=entries)
        return [_answer(result) for result in reply["Entries"]]


def _answer(result: dict[str, Any]) -> Answer:
    """One entry of PutEvents' reply (in the order of the entries): its event or its error."""
    code = result.get("ErrorCode")
    if not code:
        return {"event_id": result["EventId"]}
    kind = TransientTargetError if code in _TRANSIENT_ENTRY_ERRORS else PermanentTargetError
    return kind(f"{code}: {result.get('ErrorMessage')}")
