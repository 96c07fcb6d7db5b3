"""The runtime's DynamoDB process reads HTTP itself and hands moto a request made from its
WSGI environ: moto must see what its own path from an HTTP request gives it, and the
process must answer HTTP/1.1 as a server does (connections kept open, closed when asked,
a request it cannot read refused)."""

import json
import os
import socket

import pytest
from botocore.awsrequest import AWSPreparedRequest
from moto.core.request import normalize_request
from moto.dynamodb.responses import DynamoHandler

from tocsin.local.dynamodb_process import DYNAMODB_HOST, DynamoDBProcess, _moto_request
from tocsin.local.stack import REGION

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

BODY = json.dumps({"TableName": "t", "Key": {"id": {"S": "é"}}}).encode()
SENT = {
    "Host": "127.0.0.1:4000",
    "X-Amz-Target": "DynamoDB_20120810.GetItem",
    "Content-Type": "application/x-amz-json-1.0",
    "User-Agent": "Boto3/1.40.0 md/Botocore#1.44.8",
    "amz-sdk-request": "attempt=1",
    "Content-Length": str(len(BODY)),
}


def _as_moto_sees_it(request) -> dict:
    url = f"https://{DYNAMODB_HOST}/"
    handler = DynamoHandler()
    handler.setup_class(request, url, request.headers)
    return {
        "method": request.method,
        "path": request.path,
        "body": request.data,
        "headers": {name.lower(): value for name, value in request.headers.items()},
        "action": handler._get_action(),
        "region": handler.region,
        "params": handler.params,
    }


def test_moto_sees_the_request_as_its_own_http_path_gives_it():
    by_moto = normalize_request(
        AWSPreparedRequest(
            "POST", f"https://{DYNAMODB_HOST}/", SENT | {"Host": DYNAMODB_HOST}, BODY, False
        )
    )
    lowered = {name.lower(): value for name, value in SENT.items()}
    ours = _moto_request("/", lowered, BODY)
    assert _as_moto_sees_it(ours) == _as_moto_sees_it(by_moto)
    assert _as_moto_sees_it(ours)["region"] == REGION
    assert _as_moto_sees_it(ours)["params"]["Key"] == {"id": {"S": "é"}}


@pytest.fixture(scope="module")
def child():
    process = DynamoDBProcess(dict(os.environ))
    endpoint = process.wait_until_ready()
    yield endpoint.rsplit(":", 1)[1]
    process.hand_back()


def _exchange(port: str, raw: bytes) -> bytes:
    """What the process answers to `raw` before it closes the connection (or goes quiet)."""
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as connection:
        connection.sendall(raw)
        answer = b""
        try:
            while chunk := connection.recv(65536):
                answer += chunk
        except TimeoutError:
            answer += b"<still open>"
    return answer


def test_a_connection_serves_requests_until_the_client_asks_to_close(child):
    usage = b"GET /_tocsin/usage HTTP/1.1\r\nhost: x\r\n\r\n"
    last = b"GET /_tocsin/usage HTTP/1.1\r\nHOST: x\r\nConnection: close\r\n\r\n"
    answer = _exchange(child, usage + usage + last)
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert not answer.endswith(b"<still open>")


def test_a_request_it_cannot_read_gets_400_and_the_connection_ends(child):
    for raw in (
        b"NONSENSE\r\n\r\n",
        b"GET /_tocsin/usage HTTP/2.0\r\n\r\n",
        b"GET /_tocsin/usage HTTP/1.1\r\nno colon here\r\n\r\n",
    ):
        answer = _exchange(child, raw)
        assert answer.split(b"\r\n")[0].split(b" ")[1] == b"400", raw
        assert not answer.endswith(b"<still open>")
