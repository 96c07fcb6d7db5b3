"""Who may talk to a console: a page of its own origin, on loopback, holding its token.

A console listens on 127.0.0.1, but any web page the user opens can still send requests
there: a `Host` other than its own is a DNS rebinding (another name resolving to
127.0.0.1), an `Origin` other than its own a cross-site request. Both are refused. Against
a deployed stack the console acts with the user's AWS credentials, so it also asks for a
random token, printed once in its URL and then kept in a same-site cookie.
"""

import hmac
import secrets
from dataclasses import dataclass
from http import cookies
from urllib.parse import parse_qs, urlsplit

COOKIE = "tocsin_console"


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


@dataclass(frozen=True)
class Guard:
    """The checks of one console listening on 127.0.0.1:`port`; `token` None: none asked."""

    port: int
    token: str | None = None

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})

    def refusal(self, headers: dict[str, str], target: str) -> Refusal | None:
        """Why a request for `target` with these headers (lower-case names) is refused
        (None: it may pass). The token comes in the cookie, or in the URL printed."""
        host = headers.get("host", "")
        if host not in self.hosts:
            return Refusal(421, f"Host {host!r} is not this console's")
        origin = headers.get("origin")
        if origin is not None and origin not in {f"http://{name}" for name in self.hosts}:
            return Refusal(403, f"Origin {origin!r} is not this console's")
        if self.token is None or self.admits(target):
            return None
        if not self._holds_token(headers.get("cookie", "")):
            return Refusal(401, "open the console with the URL it printed (its token)")
        return None

    def admits(self, target: str) -> bool:
        """Whether `target` (a path and query) carries the console's token."""
        given = parse_qs(urlsplit(target).query).get("token", [""])[0]
        return self.token is not None and hmac.compare_digest(given, self.token)

    def cookie(self) -> str:
        """The Set-Cookie value that keeps the token for the page's own requests."""
        return f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"

    def _holds_token(self, header: str) -> bool:
        jar = cookies.SimpleCookie()
        try:
            jar.load(header)
        except cookies.CookieError:
            return False
        held = jar.get(COOKIE)
        return held is not None and hmac.compare_digest(held.value, self.token or "")
