"""The console's HTTP side: its page, its session, and the API behind one upstream.

`tocsin serve` and `tocsin console` differ only in their upstream: the embedded runtime's
ApiFunction, or a deployed stack's API with each call signed (`tocsin.console.remote`).
The page calls the API's own paths on its own origin, so both look the same to it.
"""

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from tocsin.console.guard import Guard
from tocsin.local.http_thread import serving_in_thread

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


# An API call: method, path with query, body, request headers (lower-case names).
Upstream = Callable[[str, str, bytes | None, dict[str, str]], Reply]
Page = Callable[[], tuple[str, str]]  # a content type and a text

ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
}
# The page loads its own script and style and calls its own origin, nothing else.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def asset(name: str) -> bytes:
    return resources.files("tocsin.console").joinpath("assets", name).read_bytes()


def json_reply(
    status: int, body: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    return Reply(status, "application/json", json.dumps(body).encode(), headers)


class ConsoleHandler(BaseHTTPRequestHandler):
    """Every request: the guard, then the console's own page, then the API upstream."""

    upstream: Upstream
    guard: Guard
    session: dict[str, str]  # whom the console acts as, and against what
    pages: dict[str, Page]  # more pages of this server (`tocsin serve`: its API's documents)
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        refusal = self.guard.refusal(headers, self.path)
        if refusal is not None:
            self._refuse(refusal.status, {"message": refusal.message})
            return
        path = urlsplit(self.path).path
        if self.command == "GET" and path == "/" and self.guard.admits(self.path):
            cookie = (("Set-Cookie", self.guard.cookie()), ("Location", "/"))
            self._reply(Reply(303, "text/plain", b"", cookie))  # the token leaves the URL
        elif self.command == "GET" and path in ASSETS:
            name, content_type = ASSETS[path]
            security = (("Content-Security-Policy", CONTENT_SECURITY_POLICY),)
            self._reply(Reply(200, content_type, asset(name), security))
        elif self.command == "GET" and path == "/console/session":
            self._reply(json_reply(200, self.session))
        elif self.command == "GET" and path in self.pages:
            content_type, text = self.pages[path]()
            self._reply(Reply(200, content_type, text.encode()))
        else:
            self._forward(headers)

    def _forward(self, headers: dict[str, str]) -> None:
        length = int(headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            self._refuse(413, {"error": {"code": "too_large", "message": "over 10 MB"}})
            return
        body = self.rfile.read(length) if length else None
        try:
            reply = self.upstream(self.command, self.path, body, headers)
        except Exception:  # what API Gateway answers when the function fails
            log.exception("the API failed on %s %s", self.command, self.path)
            reply = json_reply(500, {"message": "Internal Server Error"})
        self._reply(reply)

    def _refuse(self, status: int, body: dict[str, Any]) -> None:
        """Refuse a request whose body is left unread: the connection ends with the reply,
        else the body would be read as the next request."""
        self.close_connection = True
        self._reply(json_reply(status, body, (("Connection", "close"),)))

    def _reply(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def __getattr__(self, name: str) -> Any:
        """`do_<METHOD>` for every method: the API answers those it has no route for."""
        if name.startswith("do_"):
            return self._handle
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the CLI reports what matters


@contextmanager
def serving_console(
    upstream: Upstream,
    session: dict[str, str],
    port: int = 0,
    token: str | None = None,
    pages: dict[str, Page] | None = None,
) -> Iterator[str]:
    """Serve the console and `upstream` on 127.0.0.1:`port` (0 picks one); yields the URL
    a person opens (with the token, when one is asked)."""
    server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    guard = Guard(server.server_address[1], token)
    attributes = {"upstream": staticmethod(upstream), "guard": guard, "session": session}
    server.RequestHandlerClass = type(
        "Handler", (ConsoleHandler,), {**attributes, "pages": pages or {}}
    )
    server.daemon_threads = True
    with serving_in_thread(server, "console-server"):
        url = f"http://127.0.0.1:{guard.port}"
        yield f"{url}/?token={token}" if token else url
