"""The local stand-ins for other machines (a webhook's receiver, moto's endpoints for the
sandboxes, the DynamoDB process) take a gate's burst: when a batch's gate lets go, its
senders open their connections in the same millisecond, and every one is answered."""

import http.client
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest

from tocsin.local import tls
from tocsin.measure.receiver import WebhookReceiver

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

SENDERS = 300
UNTRUSTING = ssl.create_default_context()  # the system's authorities only


def test_connections_opened_at_once_by_a_batchs_senders_are_each_answered():
    with WebhookReceiver() as receiver:
        port = int(receiver.url.rsplit(":", 1)[1])
        go, answers = threading.Event(), []

        def post() -> None:
            go.wait()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/burst", body=b"{}")
                answers.append(connection.getresponse().status)
            except OSError as error:  # reset: the listen backlog overflowed
                answers.append(type(error).__name__)
            finally:
                connection.close()

        senders = [threading.Thread(target=post) for _ in range(SENDERS)]
        for sender in senders:
            sender.start()
        go.set()
        for sender in senders:
            sender.join()
        assert sorted(answers, key=str) == [200] * SENDERS
        assert len(receiver.received()) == SENDERS


def test_over_tls_a_stand_in_answers_whom_the_authority_vouches_for_and_no_one_else():
    """The sandboxes' stand-ins answer over TLS with a certificate for 127.0.0.1 that only
    a client trusting the run's authority accepts; the DynamoDB process, plain HTTP for the
    runtime's own clients, is reached through a TLS terminator in front of it."""
    authority = tls.authority()
    trusting = ssl.create_default_context(cafile=authority.bundle)
    with WebhookReceiver() as plain, tls.terminating(plain.url) as forwarded:
        with WebhookReceiver(tls=authority.server_context()) as direct:
            for url in (direct.url, forwarded):
                with urllib.request.urlopen(
                    urllib.request.Request(f"{url}/tls", data=b"{}"), context=trusting
                ) as reply:
                    assert reply.status == 200
                with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
                    urllib.request.urlopen(f"{url}/tls", data=b"{}", context=UNTRUSTING)
            assert [a.path for a in direct.received()] == ["/tls"]
        assert [a.path for a in plain.received()] == ["/tls"]


def test_a_receiver_times_a_request_by_when_its_bytes_arrived_not_when_it_got_to_them():
    """The receiver's own thread may come to a request late (a burst's hundreds of handler
    threads share one interpreter lock): its arrival is when the kernel received its first
    bytes, which the receiver's lateness measures."""
    with WebhookReceiver(tls=tls.authority().server_context()) as receiver:
        port = int(receiver.url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(tls.authority().bundle))
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)
        connection.connect()
        held = threading.Lock()
        with held:  # the receiver's handler waits for the interpreter, as under a burst
            holding = receiver._holding  # the handler's first step, before it reads a line
            receiver._holding = lambda more: (held.acquire(), held.release(), holding(more))
            sent_ms = time.time_ns() // 1_000_000
            connection.request("POST", "/late", body=b"{}", headers={"Tocsin-Task-Id": "t"})
            time.sleep(0.3)
        assert connection.getresponse().status == 200
    [arrival] = receiver.received()
    assert sent_ms <= arrival.arrival_ms < sent_ms + 100
