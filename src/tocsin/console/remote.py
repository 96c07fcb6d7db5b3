"""`tocsin console`: the console against a deployed stack's API, each call signed here.

The browser talks to 127.0.0.1 only; this process signs what it forwards with SigV4 from
the user's usual AWS credentials (the client's signer), so the page sees exactly what that
principal may see through the API, and never holds a credential.
"""

from typing import Any

import urllib3

from tocsin.client import signed_headers, signer_for
from tocsin.console.server import Reply, Upstream

FORWARDED = ("content-type",)  # of the browser's headers, what the API reads
TIMEOUT_S = 30.0  # API Gateway's own limit for an HTTP API


def signed_upstream(api_url: str, region: str | None = None, session: Any = None) -> Upstream:
    """Calls to `api_url`, signed for its region with the session's credentials."""
    base = api_url.rstrip("/")
    signer = signer_for(base, region, session)
    http = urllib3.PoolManager(timeout=TIMEOUT_S, retries=False)  # the page polls again

    def call(method: str, target: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        url = base + target
        given = {name: headers[name] for name in FORWARDED if name in headers}
        reply = http.request(
            method, url, body=body, headers=signed_headers(signer, method, url, body, given)
        )
        content_type = reply.headers.get("Content-Type", "application/json")
        return Reply(reply.status, content_type, reply.data)

    return call


def caller_arn(region: str | None = None) -> str:
    """Whom the credentials name (STS), as the page says; what it cannot learn, said so."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(boto3.client("sts", region_name=region).get_caller_identity()["Arn"])
    except (BotoCoreError, ClientError):
        return "your AWS credentials (STS did not say whom they name)"


def stack_api_url(stack: str, region: str | None = None) -> str:
    """The ApiUrl output of a deployed Tocsin stack."""
    import boto3

    described = boto3.client("cloudformation", region_name=region).describe_stacks(StackName=stack)
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Stacks"][0].get("Outputs", [])}
    if "ApiUrl" not in outputs:
        raise ValueError(f"stack {stack!r} has no ApiUrl output: is it a Tocsin stack?")
    return outputs["ApiUrl"]
