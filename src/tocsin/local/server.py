"""`tocsin serve`: the task API on 127.0.0.1, over the embedded runtime.

Each HTTP request becomes the API Gateway HTTP API (payload 2.0) event the deployed API
would pass, and goes to the same ApiFunction handler. There is no IAM here: the caller is
the `X-Tocsin-Principal` header (default `local-user`), placed where API Gateway's IAM
authorizer puts the principal. The deployed API never reads that header.

It also serves the console at / (`tocsin.console`), the API's OpenAPI document at
/openapi.json and Swagger UI at /swagger.
"""

import base64
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tocsin import clock
from tocsin.console.server import Reply, Upstream, serving_console
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.stack import ACCOUNT_ID

PRINCIPAL_HEADER = "X-Tocsin-Principal"
DEFAULT_PRINCIPAL = "local-user"


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


def runtime_upstream(runtime: EmbeddedRuntime, principal: str) -> Upstream:
    """API calls answered by the runtime's ApiFunction, as API Gateway would pass them; the
    caller is the `X-Tocsin-Principal` header, or `principal`."""

    def call(method: str, target: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        text = body.decode("utf-8", "replace") if body is not None else None
        caller = headers.get(PRINCIPAL_HEADER.lower()) or principal
        reply = runtime.invoke("ApiFunction", api_event(method, target, text, caller, headers))
        payload = reply.get("body") or ""
        raw = base64.b64decode(payload) if reply.get("isBase64Encoded") else payload.encode()
        given = {name.lower(): value for name, value in (reply.get("headers") or {}).items()}
        content_type = given.pop("content-type", "application/json")
        return Reply(int(reply["statusCode"]), content_type, raw, tuple(given.items()))

    return call


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
def serving(
    runtime: EmbeddedRuntime, port: int = 0, principal: str = DEFAULT_PRINCIPAL
) -> Iterator[str]:
    """Serve the API of `runtime` and the console on 127.0.0.1:`port` (0 picks one), acting
    as `principal` for requests that name no caller; yields the base URL."""
    session = {"principal": principal, "api": "the embedded runtime (tocsin serve)"}
    upstream = runtime_upstream(runtime, principal)
    with serving_console(upstream, session, port, pages=_DOCUMENTATION) as url:
        yield url
