"""`tocsin serve`: the task API on 127.0.0.1, over the embedded runtime.

Each HTTP request becomes the API Gateway HTTP API (payload 2.0) event the deployed API
would pass, and goes to the same ApiFunction handler. There is no IAM here: the caller is
the `X-Tocsin-Principal` header (default `local-user`), placed where API Gateway's IAM
authorizer puts the principal. The deployed API never reads that header.
"""

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tocsin import clock
from tocsin.local.runtime import ACCOUNT_ID, EmbeddedRuntime

PRINCIPAL_HEADER = "X-Tocsin-Principal"
DEFAULT_PRINCIPAL = "local-user"
MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit


def api_event(
    method: str,
    target: str,
    body: str | None = None,
    principal: str | None = DEFAULT_PRINCIPAL,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The HTTP API event for a request; `target` is the path with its query string."""
    url = urlsplit(target)
    query = parse_qs(url.query, keep_blank_values=True)
    now = clock.now_ms()
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": url.path,
        "rawQueryString": url.query,
        "headers": {name.lower(): value for name, value in (headers or {}).items()},
        "requestContext": {
            "accountId": ACCOUNT_ID,
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": method,
                "path": url.path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": (headers or {}).get("User-Agent", ""),
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": "$default",
            "stage": "$default",
            "time": clock.to_iso_second(now),
            "timeEpoch": now,
        },
        "body": body,
        "isBase64Encoded": False,
    }
    if query:
        event["queryStringParameters"] = {name: ",".join(vs) for name, vs in query.items()}
    if principal:
        event["requestContext"]["authorizer"] = {
            "iam": {
                "accountId": ACCOUNT_ID,
                "callerId": principal,
                "userArn": f"arn:aws:iam::{ACCOUNT_ID}:user/{principal}",
                "userId": principal,
            }
        }
    return event


class _Handler(BaseHTTPRequestHandler):
    runtime: EmbeddedRuntime
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": {"code": "too_large", "message": "body over 10 MB"}})
            return
        body = self.rfile.read(length).decode("utf-8", "replace") if length else None
        principal = self.headers.get(PRINCIPAL_HEADER) or DEFAULT_PRINCIPAL
        event = api_event(self.command, self.path, body, principal, dict(self.headers.items()))
        reply = self.runtime.invoke("ApiFunction", event)
        payload = reply.get("body") or ""
        raw = base64.b64decode(payload) if reply.get("isBase64Encoded") else payload.encode()
        self.send_response(int(reply["statusCode"]))
        for name, value in (reply.get("headers") or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the CLI reports what matters


@contextmanager
def serving(runtime: EmbeddedRuntime, port: int = 0) -> Iterator[str]:
    """Serve the API of `runtime` on 127.0.0.1:`port` (0 picks one); yields the base URL."""
    handler = type("Handler", (_Handler,), {"runtime": runtime})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="api-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
