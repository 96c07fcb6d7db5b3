"""EventBridge target: put one event whose detail is the task envelope."""

from typing import Any

from pydantic import Field, field_validator

from tocsin import aws
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.targets.base import ACCOUNT_REGION, PARTITION, Delivery, Target, aws_target_errors

_TRANSIENT_ENTRY_ERRORS = {"ThrottlingException", "InternalFailure", "InternalException"}


class EventBridgeTarget(Target):
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

    def send(self, delivery: Delivery) -> dict[str, Any]:
        entry = {
            "EventBusName": self.event_bus,
            "Source": self.source,
            "DetailType": self.detail_type,
            "Detail": delivery.envelope(),
        }
        with aws_target_errors():
            reply = aws.target_client("events").put_events(Entries=[entry])
        result = reply["Entries"][0]
        code = result.get("ErrorCode")
        if code in _TRANSIENT_ENTRY_ERRORS:
            raise TransientTargetError(f"{code}: {result.get('ErrorMessage')}")
        if code:
            raise PermanentTargetError(f"{code}: {result.get('ErrorMessage')}")
        return {"event_id": result["EventId"]}
