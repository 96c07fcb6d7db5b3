"""`tocsin serve`: the task API on 127.0.0.1, over the embedded runtime.

Each HTTP request becomes the API Gateway HTTP API (payload 2.0) event the deployed API
would pass, and goes to the same ApiFunction handler. There is no IAM here: the caller is
the `X-Tocsin-Principal` header (default `local-user`), placed where API Gateway's IAM
authorizer puts the principal. The deployed API never reads that header.

It also serves the API's OpenAPI document at /openapi.json and Swagger UI at /swagger.
"""

import base64
import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tocsin import clock
from tocsin.local.http_thread import serving_in_thread
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.stack import ACCOUNT_ID

log = logging.getLogger(__name__)
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
        if self.command == "GET" and (page := _DOCUMENTATION.get(urlsplit(self.path).path)):
            self._send_page(*page())
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(413, {"error": {"code": "too_large", "message": "body over 10 MB"}})
            return
        body = self.rfile.read(length).decode("utf-8", "replace") if length else None
        principal = self.headers.get(PRINCIPAL_HEADER) or DEFAULT_PRINCIPAL
        event = api_event(self.command, self.path, body, principal, dict(self.headers.items()))
        try:
            reply = self.runtime.invoke("ApiFunction", event)
        except Exception:  # what API Gateway answers when the function fails
            log.exception("ApiFunction failed on %s %s", self.command, self.path)
            self._send(500, {"message": "Internal Server Error"})
            return
        payload = reply.get("body") or ""
        raw = base64.b64decode(payload) if reply.get("isBase64Encoded") else payload.encode()
        self.send_response(int(reply["statusCode"]))
        for name, value in (reply.get("headers") or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        self._send_page("application/json", json.dumps(body), status)

    def _send_page(self, content_type: str, text: str, status: int = 200) -> None:
        raw = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def __getattr__(self, name: str) -> Any:
        """`do_<METHOD>` for every method: the function answers those it has no route for."""
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the CLI reports what matters


def _openapi_json() -> tuple[str, str]:
    from tocsin.api import openapi_document

    return "application/json", json.dumps(openapi_document(), indent=2)


def _swagger_ui() -> tuple[str, str]:
    """Powertools' Swagger UI page, its script and style inline (no CDN), on our document."""
    from aws_lambda_powertools.event_handler.openapi.swagger_ui.html import generate_swagger_html

    assets = Path(generate_swagger_html.__code__.co_filename).parent
    script = (assets / "swagger-ui-bundle.min.js").read_text(encoding="utf-8")
    style = (assets / "swagger-ui.min.css").read_text(encoding="utf-8")
    spec = _openapi_json()[1].replace("</", "<\\/")
    return "text/html", generate_swagger_html(spec, script, style, "", None)


_DOCUMENTATION = {"/openapi.json": _openapi_json, "/swagger": _swagger_ui}


@contextmanager
def serving(runtime: EmbeddedRuntime, port: int = 0) -> Iterator[str]:
    """Serve the API of `runtime` on 127.0.0.1:`port` (0 picks one); yields the base URL."""
    handler = type("Handler", (_Handler,), {"runtime": runtime})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    with serving_in_thread(server, "api-server"):
        yield f"http://127.0.0.1:{server.server_address[1]}"
