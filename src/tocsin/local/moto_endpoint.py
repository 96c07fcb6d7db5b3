"""moto over HTTPS: this process's moto (its in-process backends, under mock_aws) answering
on a local port, for what sends real requests (the sandboxes' executors, AWS_ENDPOINT_URL).

Requests are SigV4-signed by their senders; the credential scope names the service and
region, and so the AWS host moto matches the request against. The endpoint stands in for
AWS's: when a request's first bytes reached it (the kernel's stamp) is when it reached
AWS, and what moto then took to answer it is moto's own time, which AWS would not take
from a burst (`calls`, kept while `recording`).
"""

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tocsin.local.http_thread import LocalServer, StampsArrivals, serving_in_thread, whole_body

ENDPOINT_PREFIXES = {"ses": "email"}  # signing name -> endpoint prefix, where they differ


@dataclass(frozen=True)
class Call:
    """One request the endpoint answered: when its first bytes arrived, when moto's answer
    was written, the service, the operation (X-Amz-Target, where the protocol names it
    so) and the body."""

    arrived_ns: int
    answered_ns: int
    service: str
    operation: str
    body: bytes


@dataclass
class MotoEndpoint:
    url: str
    recording: bool = False  # keep each request's Call (a bench reads them)
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, call: Call) -> None:
        if self.recording:
            with self._lock:
                self.calls.append(call)

    def recorded(self) -> list[Call]:
        with self._lock:
            return list(self.calls)


@contextmanager
def serving_moto(tls: ssl.SSLContext | None) -> Iterator[MotoEndpoint]:
    """moto on a local port, over TLS if given a context; yields the endpoint (its URL for
    AWS_ENDPOINT_URL)."""
    from botocore.awsrequest import AWSPreparedRequest
    from botocore.compat import HTTPHeaders
    from moto.core.models import botocore_stubber

    endpoint = MotoEndpoint("")

    class Handler(StampsArrivals):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self._answer()

        def do_GET(self) -> None:
            self._answer()

        def do_PUT(self) -> None:
            self._answer()

        def do_DELETE(self) -> None:
            self._answer()

        def _answer(self) -> None:
            body = whole_body(self)
            if body is None:
                return None
            scope = self.headers.get("authorization", "").split("Credential=", 1)[-1]
            try:
                _, _, region, service, _ = scope.split(",", 1)[0].split("/")
            except ValueError:
                return self._send(400, {}, b'{"message": "unsigned request"}')
            host = f"{ENDPOINT_PREFIXES.get(service, service)}.{region}.amazonaws.com"
            headers = HTTPHeaders()
            for name, value in self.headers.items():
                headers[name] = value
            headers.replace_header("Host", host) if "Host" in headers else None
            request = AWSPreparedRequest(
                method=self.command,
                url=f"https://{host}{self.path}",
                headers=headers,
                body=body,
                stream_output=False,
            )
            answer = botocore_stubber.process_request(request)
            if answer is None:
                return self._send(404, {}, b'{"message": "no such service here"}')
            status, reply_headers, reply = answer
            self._send(status, reply_headers, reply.encode() if isinstance(reply, str) else reply)
            operation = self.headers.get("X-Amz-Target", "")
            endpoint.record(Call(self.arrived_ns, time.time_ns(), service, operation, body))

        def _send(self, status: int, headers: dict[str, Any], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "server", "date", "status"):
                    self.send_header(name, str(value))
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = LocalServer(("127.0.0.1", 0), Handler)
    server.tls = tls
    with serving_in_thread(server, "moto-endpoint"):
        scheme = "https" if tls else "http"
        endpoint.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
        yield endpoint
