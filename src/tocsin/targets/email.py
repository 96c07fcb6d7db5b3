"""Email target: send through SES; a string payload is the body, anything else is shown as JSON."""

import json
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from tocsin import aws
from tocsin.fire import wire
from tocsin.targets.base import Delivery, Target, aws_target_call

EmailAddress = Annotated[
    str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)
]


class EmailTarget(Target):
    aws_services = ("ses",)
    source: EmailAddress
    to: list[EmailAddress] = Field(min_length=1, max_length=50)
    subject: str = Field(min_length=1, max_length=998)

    @property
    def host_key(self) -> str:
        return "ses"  # one endpoint for every identity of the stack's region

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        payload = json.loads(delivery.payload_json)
        text = payload if isinstance(payload, str) else json.dumps(payload, indent=2)
        with aws_target_call(turn):
            reply = aws.target_client("ses").send_email(
                Source=self.source,
                Destination={"ToAddresses": self.to},
                Message={"Subject": {"Data": self.subject}, "Body": {"Text": {"Data": text}}},
            )
        return {"message_id": reply["MessageId"]}
