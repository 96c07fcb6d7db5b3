"""TLS between the sandboxes and what stands in for other machines (`--lambda-limits`).

On AWS an executor reaches every endpoint over HTTPS: its requests are encrypted, and each
connection it opens after its gate costs a handshake on its share of a core. Here the
stand-ins (moto's endpoint, the DynamoDB process, the bench's webhook receiver) answer
over TLS with certificates for 127.0.0.1 from an authority made for this process, which
the sandboxes trust (AWS_CA_BUNDLE for botocore, SSL_CERT_FILE for webhooks).
"""

import atexit
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tocsin.local.http_thread import AcceptsTls, serving_in_thread

HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Authority:
    """A certificate authority's bundle and a server certificate for HOSTS, in files (a
    child process, the receiver, loads them by name)."""

    bundle: Path  # the authority's certificate: what clients trust
    certificate: Path  # the server's chain and key, PEM
    key: Path

    def server_context(self) -> ssl.SSLContext:
        return server_context(self.certificate, self.key)

    def client_environment(self) -> dict[str, str]:
        """What a sandbox needs to trust the stand-ins, and only them."""
        return {"AWS_CA_BUNDLE": str(self.bundle), "SSL_CERT_FILE": str(self.bundle)}


def server_context(certificate: str | Path, key: str | Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    return context


@cache
def authority() -> Authority:
    """This process's authority, made once (trustme: a CA and a certificate for HOSTS);
    its files are removed when the process ends."""
    import trustme

    folder = Path(tempfile.mkdtemp(prefix="tocsin-tls-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    made = trustme.CA()
    issued = made.issue_cert(*HOSTS)
    found = Authority(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    made.cert_pem.write_to_path(str(found.bundle))
    issued.cert_chain_pems[0].write_to_path(str(found.certificate))
    for more in issued.cert_chain_pems[1:]:
        more.write_to_path(str(found.certificate), append=True)
    issued.private_key_pem.write_to_path(str(found.key))
    return found


class _Forwarder(AcceptsTls, socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, upstream: tuple[str, int], context: ssl.SSLContext):
        self.upstream, self.tls = upstream, context
        super().__init__(("127.0.0.1", 0), _Forwarding)


class _Forwarding(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with socket.create_connection(self.server.upstream) as upstream:  # type: ignore[attr-defined]
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
            back.start()
            _pump(self.request, upstream)
            back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until `source` ends; then `sink` is told so (by TCP:
    SSLSocket.shutdown would drop the TLS state the other direction still reads with)."""
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with suppress(OSError):
        socket.socket.shutdown(sink, socket.SHUT_WR)


@contextmanager
def terminating(upstream_url: str) -> Iterator[str]:
    """A TLS endpoint in front of the plain HTTP one at `upstream_url` (the DynamoDB
    process, whose own server is shared with the runtime's clients); its https URL."""
    host, port = upstream_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    server = _Forwarder((host, int(port)), authority().server_context())
    with serving_in_thread(server, "tls-terminator"):
        yield f"https://127.0.0.1:{server.server_address[1]}"
