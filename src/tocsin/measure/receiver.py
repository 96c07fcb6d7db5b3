"""A webhook receiver on 127.0.0.1: the stopwatch at the far end, where lateness is measured."""

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import urlsplit

from tocsin.local.http_thread import LocalServer, StampsArrivals, stop_serving


@dataclass(frozen=True)
class Arrival:
    arrival_ms: int
    path: str
    idempotency_key: str
    task_id: str
    body: bytes
    headers: dict[str, str]
    status: int = 200  # what the sender got back: 0 when the receiver hung up or timed out
    answered_ms: int = 0  # when the answer was written (0: not yet, or none)


Reply = int | Literal["hang", "close"]


def delivered(arrival: Arrival) -> bool:
    """Answered 2xx: the attempt that ends a task's retries."""
    return 200 <= arrival.status < 300


def allowing(url: str) -> dict[str, str]:
    """Runtime parameters that let webhooks reach the receiver at `url` (its host and port)
    and no other internal address, as `WebhookAllowedHosts` does on AWS."""
    return {"WebhookAllowedHosts": urlsplit(url).netloc}


ARRIVALS_PATH = "/_arrivals"
ANSWER_AFTER_MS = "TOCSIN_RECEIVER_ANSWER_AFTER_MS"  # how a ReceiverProcess is told
REFUSE_FIRST = "TOCSIN_RECEIVER_REFUSE_FIRST"


class WebhookReceiver:
    """Records every POST with the millisecond it arrived and answers it.

    The answer is the next of `script_for[path]` while it lasts (a status, "hang": say
    nothing for `hang_s`, or "close": drop the connection), then `status_for[path]`, or 200,
    given `answer_after_s` after the request arrived (a slow receiver), with the headers of
    `headers_for[path]` (a Retry-After, say). With `refuse_first`, each task's first that
    many requests are answered 503 whatever the path says (a bench's retried tasks). It
    counts the requests it holds at once, arrived and not yet answered (`most_in_flight`).
    """

    def __init__(self, port: int = 0, hang_s: float = 15.0, tls: ssl.SSLContext | None = None):
        self.arrivals: list[Arrival] = []
        self.status_for: dict[str, int] = {}
        self.script_for: dict[str, list[Reply]] = {}
        self.headers_for: dict[str, dict[str, str]] = {}
        self.hang_s = hang_s
        self.on_arrival: Callable[[Arrival], None] | None = None  # run before each answer
        self.answer_after_s = 0.0
        self.refuse_first = 0
        self._refused: dict[str, int] = {}  # by task id, while refuse_first lasts
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()
        self._server = LocalServer(("127.0.0.1", port), self._handler_class())
        self._server.tls = tls  # HTTPS, as a webhook's receiver on the internet answers
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self._server.tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        stop_serving(self._server, self._thread)

    def received(self) -> list[Arrival]:
        with self._lock:
            return list(self.arrivals)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Wait until at least `count` requests arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.arrivals) >= count:
                return True
            time.sleep(0.02)
        return len(self.arrivals) >= count

    def _reply_to(self, path: str, task_id: str) -> Reply:
        with self._lock:
            refused = self._refused.get(task_id, 0)
            if refused < self.refuse_first:
                self._refused[task_id] = refused + 1
                return 503
            script = self.script_for.get(path)
            if script:
                return script.pop(0)
            return self.status_for.get(path, 200)

    def _record(self, arrival: Arrival) -> None:
        with self._lock:
            self.arrivals.append(arrival)

    def _answered(self, arrival: Arrival) -> None:
        """`arrival`'s answer written now: a sender that gave up on it before may have
        sent it again, by design (`tocsin chaos` tells those repeats apart)."""
        with self._lock:
            at = next(
                i for i in range(len(self.arrivals) - 1, -1, -1) if self.arrivals[i] is arrival
            )
            self.arrivals[at] = replace(arrival, answered_ms=time.time_ns() // 1_000_000)

    def _holding(self, more: int) -> None:
        """One request more held (1), or answered (-1)."""
        with self._lock:
            self.in_flight += more
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(StampsArrivals):
            def do_POST(self) -> None:
                receiver._holding(1)
                try:
                    reply = self._take()
                finally:  # before the answer: its sender may send again once it has it
                    receiver._holding(-1)
                if not isinstance(reply, int):
                    self.close_connection = True
                    return
                self.send_response(reply)
                self.send_header("Content-Length", "0")
                for name, value in receiver.headers_for.get(self.path, {}).items():
                    self.send_header(name, value)
                self.end_headers()
                receiver._answered(self.arrival)

            def _take(self) -> Reply:
                """Read and record the request, and wait as told: the reply to give."""
                arrived = self.arrived_ns // 1_000_000  # its first bytes, by the kernel
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                task_id = self.headers.get("Tocsin-Task-Id", "")
                reply = receiver._reply_to(self.path, task_id)
                arrival = Arrival(
                    arrival_ms=arrived,
                    path=self.path,
                    idempotency_key=self.headers.get("Idempotency-Key", ""),
                    task_id=task_id,
                    body=body,
                    headers=dict(self.headers.items()),
                    status=reply if isinstance(reply, int) else 0,
                )
                receiver._record(arrival)
                self.arrival = arrival
                if receiver.on_arrival is not None:
                    receiver.on_arrival(arrival)
                time.sleep(receiver.answer_after_s)
                if reply == "hang":
                    time.sleep(receiver.hang_s)
                return reply

            def do_GET(self) -> None:
                """`/_arrivals`: what arrived so far, as JSON; `/_arrivals/tasks`: how many
                tasks arrived and were answered 2xx (for ReceiverProcess)."""
                arrivals = receiver.received()
                if self.path == ARRIVALS_PATH:
                    listed: Any = [
                        {**asdict(a), "body": a.body.decode("latin-1")} for a in arrivals
                    ]
                elif self.path == f"{ARRIVALS_PATH}/tasks":
                    listed = len({a.task_id for a in arrivals if delivered(a)})
                elif self.path == f"{ARRIVALS_PATH}/most_in_flight":
                    listed = receiver.most_in_flight
                else:
                    self.send_error(404)
                    return
                answer = json.dumps(listed).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                """Quiet: the demo reports arrivals itself."""

        return Handler


class ReceiverProcess:
    """A WebhookReceiver in a process of its own, answering 200 to every POST (but each
    task's first `refuse_first`), `answer_after_ms` after it arrived; over HTTPS with `tls`
    (the certificate of `tocsin.local.tls.authority()`).

    On AWS the receiver is another machine; here, in the scheduler's process, it would
    share its interpreter lock, and a busy scheduler would delay the stopwatch as well.
    """

    def __init__(self, tls: bool = False, answer_after_ms: int = 0, refuse_first: int = 0):
        self._context: ssl.SSLContext | None = None
        self._files: list[str] = []
        self._told = {ANSWER_AFTER_MS: str(answer_after_ms), REFUSE_FIRST: str(refuse_first)}
        if tls:
            from tocsin.local.tls import authority

            made = authority()
            self._context = ssl.create_default_context(cafile=made.bundle)
            self._files = [str(made.certificate), str(made.key)]

    def __enter__(self) -> "ReceiverProcess":
        command = [sys.executable, "-m", "tocsin.measure.receiver", *self._files]
        environment = {**os.environ, **self._told}
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()  # the child serves until its stdin closes
        self._process.wait(timeout=10)

    def received(self) -> list[Arrival]:
        listed = self._get(ARRIVALS_PATH)
        return [Arrival(**{**a, "body": a["body"].encode("latin-1")}) for a in listed]

    def tasks_arrived(self) -> int:
        """How many tasks were delivered (answered 2xx): cheap enough to poll for progress."""
        return int(self._get(f"{ARRIVALS_PATH}/tasks"))

    def most_in_flight(self) -> int:
        """The most requests it held at once, arrived and not yet answered."""
        return int(self._get(f"{ARRIVALS_PATH}/most_in_flight"))

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30, context=self._context) as reply:
            return json.load(reply)


if __name__ == "__main__":  # arguments: a certificate chain and its key, for HTTPS
    from tocsin.local.tls import server_context

    with WebhookReceiver(tls=server_context(*sys.argv[1:3]) if sys.argv[1:] else None) as serving:
        serving.answer_after_s = int(os.environ.get(ANSWER_AFTER_MS, "0")) / 1000
        serving.refuse_first = int(os.environ.get(REFUSE_FIRST, "0"))
        print(serving.url, flush=True)
        sys.stdin.read()
