"""The local stand-ins for other machines (a webhook's receiver, moto's endpoints for the
sandboxes, the DynamoDB process) take a gate's burst: when a batch's gate lets go, its
senders open their connections in the same millisecond, and every one is answered."""

import http.client
import threading

from tocsin.measure.receiver import WebhookReceiver

SENDERS = 300


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
