"""The embedded runtime's requests to its own DynamoDB process go unsigned (nothing there
checks a signature), and only those: a request to any other endpoint, DynamoDB Local's
or AWS's, is signed as botocore signs it."""

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from tocsin.local.dynamodb_process import unsigned_to

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

OWN = "http://127.0.0.1:812"


class _Answered:
    """botocore's `before-send`: keeps each request's headers and answers it, as the
    network would."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    def __call__(self, request, **_):
        self.headers.append(dict(request.headers))
        return AWSResponse(request.url, 200, {}, _Body(b'{"TableNames": []}'))


class _Body:
    def __init__(self, content: bytes) -> None:
        self.content = content

    def stream(self, **_):
        yield self.content


@pytest.mark.parametrize(
    ("endpoint", "signed"),
    [
        (OWN, False),
        (OWN + "/", False),
        ("http://127.0.0.1:8123", True),  # another port that starts with the same digits
        ("http://127.0.0.1:8000", True),  # DynamoDB Local, say
        (None, True),  # AWS
    ],
)
def test_only_the_runtimes_own_tables_get_unsigned_requests(endpoint, signed):
    session = boto3.Session(
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1"
    )
    session.events.register("before-call.dynamodb", unsigned_to(OWN))
    answered = _Answered()
    client = session.client("dynamodb", endpoint_url=endpoint)
    client.meta.events.register("before-send.dynamodb", answered)

    assert client.list_tables()["TableNames"] == []
    assert ("Authorization" in answered.headers[0]) is signed
    assert ("X-Amz-Date" in answered.headers[0]) is signed
