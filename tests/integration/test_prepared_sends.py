"""After the gate, only bytes: every request is built and signed before its gate, on a
connection opened before it, and written by one writer at its millisecond
(`tocsin.fire.wire`)."""

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from standardwebhooks.webhooks import Webhook

from tests.conftest import hooked, store_task, stored, wait_for_status, webhook_task
from tests.integration.test_targets import SAMPLE_TARGETS, TARGETS
from tocsin import aws, clock
from tocsin.fire import wire
from tocsin.settings import settings
from tocsin.targets import webhook
from tocsin.targets.base import Delivery
from tocsin.targets.webhook import WebhookTarget

DELIVERY = Delivery(task_id="t", version=1, idempotency_key="t:1", payload_json=b'{"a":1}')


def test_every_request_is_built_and_signed_before_its_gate(runtime, receiver, monkeypatch):
    """A webhook's Standard Webhooks signature and an SQS call's SigV4 signature are made
    before their due millisecond, and the bytes arrive at it or after."""
    due = clock.now_ms() + 2500
    signed: list[int] = []
    sign = webhook.signature_headers
    monkeypatch.setattr(
        webhook, "signature_headers", lambda *a: (signed.append(clock.now_ms()), sign(*a))[1]
    )
    queue = TARGETS["sqs"]()
    queue.setup(runtime)
    for i in range(3):
        store_task(webhook_task(f"{receiver.url}/w", due, f"w{i}"))
        store_task(
            {**webhook_task("", due, f"q{i}"), "type": "sqs", "target": SAMPLE_TARGETS["sqs"]}
        )

    def signing(**_: Any) -> None:  # botocore signs in its request-created handler
        signed.append(clock.now_ms())

    with hooked(aws.target_client("sqs"), ("request-created.sqs", signing)):
        runtime.run_finder()
        for task_id in ("w0", "w1", "w2", "q0", "q1", "q2"):
            wait_for_status(task_id, {"SUCCEEDED"})
    assert len(signed) == 4 and max(signed) < due  # three webhooks, one call of three
    assert min(a.arrival_ms for a in receiver.received()) >= due
    assert min(stored(f"q{i}")["fired_at"] for i in range(3)) >= clock.to_iso(due)


class _At:
    """A turn at `fires_ms`, as the executor's turn for a task due then."""

    def __init__(self, fires_ms: int):
        self.fires_ms = fires_ms

    def send(self, sent: wire.Sent) -> wire.Sent:
        return wire.WIRE.send(replace(sent, fires_ms=self.fires_ms))

    def at_gate(self) -> None:
        pass


@pytest.fixture
def closes_the_first_connection(monkeypatch) -> Iterator[tuple[int, list[bytes]]]:
    """A receiver that closes its first connection, idle, at once (as a server whose
    keep-alive time ran out), and answers 200 on every later one; what it received."""
    monkeypatch.setenv("WEBHOOK_ALLOWED_HOSTS", "127.0.0.1")
    settings.cache_clear()
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        first = True
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            if first:
                first = False
                connection.close()
                continue
            with connection:
                received.append(connection.recv(65536))
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], received
    server.close()
    settings.cache_clear()


def test_a_connection_closed_while_it_waited_for_its_gate_is_opened_again_before_it(
    closes_the_first_connection,
):
    port, received = closes_the_first_connection
    target = WebhookTarget(url=f"http://127.0.0.1:{port}/hook")
    target.prepare()  # the connection the receiver closes
    gate_ms = clock.now_ms() + 300
    assert target.send(DELIVERY, _At(gate_ms)) == {"status": 200}
    assert len(received) == 1 and received[0].startswith(b"POST /hook HTTP/1.1\r\n")


def test_a_large_body_is_written_as_it_is_held_not_copied():
    """A 200 KB body goes out as the object the executor read it into (500 of them fit a
    256 MB executor), after a head of its own; a small one is written with its head."""
    left, right = socket.socketpair()
    with left, right:
        connection = wire.Connection(left, "example.com")
        body = b"x" * (200 * 1024)
        head, written = connection.request("POST", "/", [], body)
        assert written is body and head.endswith(b"\r\n\r\n")
        small_head, nothing = wire.Connection(left, "example.com").request("POST", "/", [], b"{}")
        assert nothing == b"" and small_head.endswith(b"\r\n\r\n{}")


def test_a_task_sent_long_past_its_due_second_is_signed_for_now(runtime, receiver):
    """A signature for a due second ten minutes past would be refused by the receiver's
    verifier (it takes five minutes of skew): the request is signed for its sending."""
    due = clock.now_ms() - 600_000
    store_task(webhook_task(f"{receiver.url}/late", due, "late"), submitted_ms=due - 5000)
    runtime.run_finder()
    wait_for_status("late", {"SUCCEEDED"})
    [arrival] = receiver.received()
    assert abs(int(arrival.headers["webhook-timestamp"]) - time.time()) < 60
    secret = boto3.client("secretsmanager").get_secret_value(SecretId=settings().webhook_secret_arn)
    assert Webhook(secret["SecretString"]).verify(arrival.body, arrival.headers) == {"task": "late"}
    assert json.loads(arrival.body) == {"task": "late"}


def test_a_signing_secret_that_cannot_be_read_for_now_fails_an_attempt_not_the_task(
    runtime, receiver
):
    """Secrets Manager refuses the first read (throttled): the attempt fails for now, and
    the task is sent signed at its next attempt; it was failed for good before."""
    webhook._secrets().clear_cache()  # the keys as yet unread
    refused: list[int] = []

    def throttle_once(**_: Any) -> None:
        if not refused:
            refused.append(clock.now_ms())
            error = {"Error": {"Code": "ThrottlingException"}}
            raise ClientError(
                error | {"ResponseMetadata": {"HTTPStatusCode": 400}}, "GetSecretValue"
            )

    client = aws.client("secretsmanager")
    with hooked(client, ("before-call.secrets-manager.GetSecretValue", throttle_once)):
        store_task(webhook_task(f"{receiver.url}/signed", clock.now_ms() + 1500, "signed"))
        runtime.run_finder()
        item = wait_for_status("signed", {"SUCCEEDED", "FAILED"})
    assert refused and item["status"] == "SUCCEEDED" and int(item["attempts"]) == 2
    [arrival] = receiver.received()
    assert "webhook-signature" in arrival.headers
