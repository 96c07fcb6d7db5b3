"""Lambda target: invoke a function asynchronously with the task envelope."""

from typing import Any

from pydantic import Field

from tocsin import aws
from tocsin.fire import wire
from tocsin.targets.base import ACCOUNT_REGION, PARTITION, Delivery, Target, aws_target_call


class LambdaTarget(Target):
    aws_services = ("lambda",)
    function_arn: str = Field(
        pattern=rf"^{PARTITION}:lambda:{ACCOUNT_REGION}:function:[A-Za-z0-9_-]{{1,64}}"
        r"(:[A-Za-z0-9_$-]{1,128})?$"
    )

    @property
    def host_key(self) -> str:
        return self.function_arn

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        with aws_target_call(turn):
            reply = aws.target_client("lambda").invoke(
                FunctionName=self.function_arn,
                InvocationType="Event",
                Payload=delivery.envelope().encode(),
            )
        return {"status_code": reply["StatusCode"]}
