"""A request its caller cut short, as a sandbox killed mid-request leaves one, is neither
carried out nor answered by the endpoint that serves moto to the sandboxes: a form body cut
anywhere may still parse, as a shorter request AWS would never have received."""

import socket
import ssl
import time
from urllib.parse import urlsplit

import boto3
import pytest
from moto import mock_aws

from tocsin.local import moto_endpoint, tls

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

SCOPE = "Credential=AKIDEXAMPLE/20261128/us-east-1/sqs/aws4_request"


def sent_cut_short(url: str, body: bytes, cut_at: int) -> None:
    """POST `body` whole in its Content-Length, then only its first `cut_at` bytes, then
    go away (the killed sandbox's connection ends)."""
    parts = urlsplit(url)
    head = (
        f"POST / HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Authorization: AWS4-HMAC-SHA256 {SCOPE}, SignedHeaders=host, Signature=0\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    context = ssl.create_default_context(cafile=str(tls.authority().bundle))
    with (
        socket.create_connection((parts.hostname, parts.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=parts.hostname) as connection,
    ):
        connection.sendall(head + body[:cut_at])


def test_a_request_cut_short_is_not_carried_out():
    with mock_aws(), moto_endpoint.serving_moto(tls.authority().server_context()) as endpoint:
        sqs = boto3.client("sqs", region_name="us-east-1")
        queue = sqs.create_queue(QueueName="cut")["QueueUrl"]
        body = f"Action=SendMessage&QueueUrl={queue}&MessageBody=a-whole-message".encode()
        sent_cut_short(endpoint.url, body, len(body) - len("-message"))
        time.sleep(1)  # the server reads to the end of what came, then would act
        reply = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0)
        assert reply.get("Messages", []) == []
