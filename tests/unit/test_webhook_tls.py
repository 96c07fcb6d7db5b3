"""HTTPS webhooks connect to the checked address and still verify the certificate's name."""

import http.server
import socket
import ssl
import sys
import time

import pytest
import trustme

from tocsin.errors import PermanentTargetError
from tocsin.local.http_thread import serving_in_thread
from tocsin.settings import settings
from tocsin.targets.base import Delivery
from tocsin.targets.webhook import WebhookTarget

DELIVERY = Delivery(task_id="t", version=2, idempotency_key="t:2", payload_json=b'{"a":1}')


@pytest.fixture
def https_server(tmp_path, monkeypatch):
    """A TLS receiver on 127.0.0.1 with a certificate for hooks.test from a test CA."""
    authority = trustme.CA()
    certificate = authority.issue_cert("hooks.test")
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setenv("WEBHOOK_ALLOWED_HOSTS", "hooks.test,other.test")
    settings.cache_clear()
    seen: list[tuple[str, bytes]] = []
    connections: list[object] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def setup(self) -> None:
            connections.append(self.client_address)
            super().setup()

        def do_POST(self) -> None:
            seen.append(
                (self.headers["Host"], self.rfile.read(int(self.headers["Content-Length"])))
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            """A connection opened and closed unused (a send prepared, then not made) is
            the client's right, not an error to print."""
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    certificate.configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with serving_in_thread(server, "tls-peer"):
        # DNS stands in for the network: both names point at the local server.
        port = server.server_port
        answer = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
        yield port, seen, connections
    settings.cache_clear()


def test_https_post_reaches_the_named_host_over_verified_tls(https_server):
    port, seen, _ = https_server
    target = WebhookTarget(url=f"https://hooks.test:{port}/in?x=1")
    target.prepare()
    assert target.send(DELIVERY) == {"status": 204}
    assert seen == [(f"hooks.test:{port}", b'{"a":1}')]


def test_the_connection_is_open_before_the_gate_and_the_send_uses_it(https_server):
    """TCP and TLS handshakes happen in prepare(), so they do not count as lateness."""
    port, seen, connections = https_server
    target = WebhookTarget(url=f"https://hooks.test:{port}/in")
    target.prepare()
    deadline = time.monotonic() + 5
    while not connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(connections) == 1 and seen == []
    assert target.send(DELIVERY) == {"status": 204}
    assert len(connections) == 1 and len(seen) == 1


def test_a_certificate_for_another_name_is_refused(https_server):
    """Refused for good as the connection is opened, before the gate: nothing is sent."""
    port, seen, _ = https_server
    target = WebhookTarget(url=f"https://other.test:{port}/in")
    with pytest.raises(PermanentTargetError, match=r"not valid for 'other\.test'"):
        target.prepare()
        target.send(DELIVERY)
    assert seen == []
