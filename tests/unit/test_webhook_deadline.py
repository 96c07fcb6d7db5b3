"""A webhook attempt ends by its limit whatever the receiver does: one that trickles its
answer's head, a byte at a time, restarts the read timeout with every byte."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tocsin.errors import TransientTargetError
from tocsin.settings import settings
from tocsin.targets.base import Delivery
from tocsin.targets.webhook import WebhookTarget

DELIVERY = Delivery(task_id="t", version=1, idempotency_key="t:1", payload_json=b'{"a":1}')
LIMIT_S = 4.0  # the attempt's limit with a 1 s webhook timeout (connect and read, retried)
SLACK_S = 4.0  # room for a loaded machine: the trickle would hold it 16 s longer
TRICKLE_S = 20.0  # far past the attempt's limit


@pytest.fixture
def trickling() -> Iterator[int]:
    """A receiver that answers a status line, then a header byte every 0.2 s for TRICKLE_S."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            ends = time.monotonic() + TRICKLE_S
            while time.monotonic() < ends and not stop.is_set():
                try:
                    connection.sendall(b"z")
                except OSError:  # the sender gave up
                    return
                time.sleep(0.2)

    threading.Thread(target=answer, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def test_a_receiver_that_trickles_its_answer_cannot_hold_an_attempt_past_its_limit(
    trickling, monkeypatch
):
    monkeypatch.setenv("WEBHOOK_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("WEBHOOK_ALLOWED_HOSTS", "127.0.0.1")
    settings.cache_clear()
    try:
        target = WebhookTarget(url=f"http://127.0.0.1:{trickling}/hook")
        target.prepare()
        began = time.monotonic()
        with pytest.raises(TransientTargetError, match=r"no answer within 1 s"):
            target.send(DELIVERY)
        assert time.monotonic() - began < LIMIT_S + SLACK_S  # shut at its limit, not let run
    finally:
        settings.cache_clear()
