"""DynamoDB in a process of its own, so the embedded runtime uses the machine's second core.

Everything else the runtime runs shares one interpreter lock. moto's DynamoDB took about
40 % of it (py-spy, `tocsin bench` spread 1,000: each request parses its expressions and
copies the item), so it runs here, in a child process behind a local HTTP endpoint. The
runtime's clients reach it through AWS_ENDPOINT_URL_DYNAMODB, botocore's own setting:
handlers, Powertools and moto's state machine interpreter use it unchanged.

The child answers with moto's own request handling, one request at a time, as
DynamoDB's conditional writes are atomic. Four paths beside the API are the runtime's:
`GET /_tocsin/usage` (requests by action, the write units they were billed, CPU seconds,
peak memory), `POST /_tocsin/faults` (a share of one action's requests refused, for
`tocsin chaos`), `POST /_tocsin/reset` (every table, count and fault gone) and
`/_tocsin/journal` (POST: keep each write served from now on, in the order it was served,
with what it was billed; GET: what was kept. The tests replay them on DynamoDB Local,
AWS's own engine, and compare its units with the meter's).

A runtime's stop hands its child back emptied, and the next runtime of the same process
takes it (a new child costs about a second of CPU to start moto): the tests start hundreds
of runtimes, one after another, in each process. Each stack names its tables afresh, so a
thread that a stopped runtime left behind finds no table of the next one's here.
"""

import gc
import io
import json
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tocsin.local.http_thread import LocalServer, whole_body
from tocsin.local.moto_patches import dynamodb_patches
from tocsin.local.stack import ACCOUNT_ID, REGION
from tocsin.local.write_units import WRITES, Metering

DYNAMODB_HOST = f"dynamodb.{REGION}.amazonaws.com"  # moto reads the region from the URL
MAX_HEADERS = 100  # as http.client allows

USAGE_PATH, FAULTS_PATH, RESET_PATH = "/_tocsin/usage", "/_tocsin/faults", "/_tocsin/reset"
JOURNAL_PATH = "/_tocsin/journal"
ERROR_TYPE_PREFIX = "com.amazonaws.dynamodb.v20120810#"
READY_TIMEOUT_S = 60.0
_DATE: list[Any] = [0, ""]  # the second, and its Date header
# A request's garbage dies young, while the items that survive a collection live on in the
# tables: the young generation is collected every 10,000 new objects (Python: 700) and the
# older ones five and ten times less often. Python's thresholds took 2.1 s of this process's
# CPU in `dense` (6,000 tasks), a full collection of the tables 0.1 s each; these, 1.3 s.
GC_THRESHOLDS = (10_000, 50, 100)


@dataclass(frozen=True)
class Fault:
    """An error DynamoDB can answer with, and the share of requests that get it; with
    `after_commit`, the request is carried out first (an ambiguous write: it committed,
    and the caller sees a failure); with `hang_s`, it is neither carried out nor answered
    (a write that hangs); with `until_item`, only until that item is written (a task's
    final mark refused until its send is logged, whichever process writes the log)."""

    code: str
    status: int
    share: float
    after_commit: bool = False
    hang_s: float = 0.0  # instead of an error, no answer for this long, then a dropped line
    when: tuple[str, ...] = ()  # only bodies holding each text (`":status"`: a final mark)
    first: int = 0  # the first this many requests it applies to meet it, whatever the share
    until_item: tuple[str, ...] = ()  # a table's name and an item's hash key


def _fault(when: list[str], until_item: list[str], **rest: Any) -> Fault:
    """A fault as `set_faults` sent it, its lists tuples again (a fault is counted by value)."""
    return Fault(when=tuple(when), until_item=tuple(until_item), **rest)


def process_usage() -> dict[str, float]:
    """This process's CPU seconds so far and its peak resident memory (MiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": own.ru_utime + own.ru_stime, "peak_memory_mb": round(own.ru_maxrss / 1024, 1)}


# -- the child ------------------------------------------------------------------------------


@dataclass
class _Service:
    """What the child's request threads share."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)  # faults met, by code
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    applied: Counter[Fault] = field(default_factory=Counter)  # requests each fault applied to
    rng: random.Random = field(default_factory=random.Random)
    metering: Metering | None = None  # made with moto's backend, at the first request
    cpu_s_before: float = 0.0  # the process's CPU seconds at the last reset
    journal: list[dict[str, Any]] | None = None  # the writes served, once asked to keep them

    def fault_for(self, action: str, body: bytes) -> Fault | None:
        """Under the lock: count the request, and pick the fault it meets, if any."""
        self.requests[action] += 1
        roll, below = self.rng.random(), 0.0
        for fault in self.faults.get(action, []):
            if any(text.encode() not in body for text in fault.when) or self._holds(fault):
                continue
            self.applied[fault] += 1
            below += fault.share
            if roll < below or self.applied[fault] <= fault.first:
                self.injected[fault.code] += 1
                return fault
        return None

    @staticmethod
    def _holds(fault: Fault) -> bool:
        """Whether the item the fault waits for is written (a fault without one: never)."""
        if not fault.until_item:
            return False
        from moto.dynamodb.models import dynamodb_backends

        name, key = fault.until_item
        backend = dynamodb_backends[ACCOUNT_ID][REGION]
        table = backend.get_table(name)
        return backend.get_item(name, {table.hash_key_attr: {"S": key}}) is not None

    def meter(self) -> Metering:
        if self.metering is None:
            from moto.dynamodb.models import dynamodb_backends

            self.metering = Metering(dynamodb_backends[ACCOUNT_ID][REGION])
        return self.metering

    def usage(self) -> dict[str, Any]:
        """Since the last reset, but the peak memory: the process's own."""
        billed = dict(self.metering.billed) if self.metering else {}
        own = process_usage()
        return {
            "requests": dict(self.requests),
            "write_units": billed,
            "injected": dict(self.injected),
            "cpu_s": own["cpu_s"] - self.cpu_s_before,
            "peak_memory_mb": own["peak_memory_mb"],
        }

    def reset(self) -> None:
        """Under the lock: as the child was when it started, but for moto's warm imports."""
        from moto.dynamodb.models import dynamodb_backends

        dynamodb_backends[ACCOUNT_ID][REGION].reset()
        self.requests.clear()
        self.injected.clear()
        self.faults = {}
        self.applied.clear()
        self.metering = None
        self.journal = None
        self.cpu_s_before = process_usage()["cpu_s"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # botocore keeps its connections open
    # The answer goes out in two writes (head, then body). With Nagle's algorithm on, the
    # body waits for the client's delayed ACK of the head: 40 ms per request, 20 a second
    # on a connection (measured: 304 a second once off).
    disable_nagle_algorithm = True
    # Head and body go out in one send, at the end of each request (http.server flushes
    # then): unbuffered, each was a send of its own (the sends: 5 % of py-spy's samples).
    wbufsize = 1 << 16
    service = _Service()

    def parse_request(self) -> bool:
        """The request line and headers, one a line, as botocore and urllib send them, the
        names in lower case: http.server reads headers with the email package (a twentieth
        of a request's CPU here). A request it cannot read gets 400 and the connection ends."""
        self.command, self.close_connection = "", True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.request_version = "HTTP/1.0"
            self.send_error(400, "Bad request line")
            return False
        self.command, self.path, self.request_version = words
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = self.rfile.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon:
                self.send_error(400, "Bad header line")
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers  # type: ignore[assignment]
        connection = headers.get("connection", "").lower()
        keep = connection == "keep-alive" or self.request_version == "HTTP/1.1"
        self.close_connection = connection == "close" or not keep
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, formatted once a second (a few % of a request's CPU each time)."""
        second = int(time.time() if timestamp is None else timestamp)
        if _DATE[0] != second:
            _DATE[:] = [second, super().date_time_string(second)]
        return str(_DATE[1])

    def do_GET(self) -> None:
        if self.path == JOURNAL_PATH:
            with self.service.lock:
                return self._reply(200, {}, json.dumps(self.service.journal or []).encode())
        if self.path != USAGE_PATH:
            return self._reply(404, {}, b"")
        # Not behind the requests' lock: under a backlog the usage waited its turn for more
        # than the caller's 10 s. Each counter is copied at once, under the interpreter lock.
        self._reply(200, {}, json.dumps(self.service.usage()).encode())

    def do_POST(self) -> None:
        body = whole_body(self)
        if body is None:
            return None
        if self.path == FAULTS_PATH:
            return self._set_faults(json.loads(body))
        if self.path == RESET_PATH:
            with self.service.lock:
                self.service.reset()
            return self._reply(200, {}, b"{}")
        if self.path == JOURNAL_PATH:
            with self.service.lock:
                self.service.journal = []
            return self._reply(200, {}, b"{}")
        action = self.headers.get("x-amz-target", "").rpartition(".")[2]
        with self.service.lock:
            fault = self.service.fault_for(action, body)
            if fault is None or fault.after_commit:
                meter = self.service.meter()
                written = json.loads(body) if action in WRITES and body else {}
                writing = meter.before(action, written)
                billed = Counter(meter.billed)
                status, headers, answer = _answer(self.path, self.headers, body)
                meter.after(writing, status, answer)
                if written and self.service.journal is not None:
                    self.service.journal.append(
                        {"action": action, "body": written, "status": status}
                        | {"billed": dict(meter.billed - billed)}
                    )
        if fault is not None and fault.hang_s:
            time.sleep(fault.hang_s)
            self.close_connection = True
            return None
        if fault is not None:
            error = {"__type": ERROR_TYPE_PREFIX + fault.code, "message": "injected fault"}
            headers = {"x-amzn-RequestId": str(uuid.uuid4())}  # as every AWS answer has
            return self._reply(fault.status, headers, json.dumps(error).encode())
        self._reply(status, headers, answer.encode() if isinstance(answer, str) else answer)

    def _set_faults(self, faults: dict[str, Any]) -> None:
        with self.service.lock:
            self.service.rng.seed(faults["seed"])
            self.service.applied.clear()
            self.service.faults = {
                action: [_fault(**fault) for fault in listed]
                for action, listed in faults["actions"].items()
            }
        self._reply(200, {}, b"{}")

    def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """moto's headers, each once, without the ones this server writes itself (moto's
        dict also carries the status, and its content type under either spelling)."""
        sent = {name.lower(): value for name, value in headers.items()}
        for own in ("content-length", "server", "date", "status"):
            sent.pop(own, None)
        sent.setdefault("content-type", "application/x-amz-json-1.0")
        self.send_response(status)
        for name, value in sent.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        """Quiet: the runtime's clients see every answer."""


def _answer(path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], Any]:
    """moto's answer to a DynamoDB request: its DynamoDB handler, as moto's stubber calls it
    once it has matched the URL against every service's patterns (a tenth of a request's
    CPU here, where every request is DynamoDB's)."""
    from moto.core.exceptions import HTTPException
    from moto.dynamodb.responses import DynamoHandler

    request = _moto_request(path, headers, body)
    try:
        return DynamoHandler.dispatch(request, f"https://{DYNAMODB_HOST}{path}", request.headers)
    except HTTPException as error:
        return error.code, error.get_headers(), error.get_body()


def _moto_request(path: str, headers: dict[str, str], body: bytes) -> Any:
    """moto's request (a werkzeug Request) made from its WSGI environ, as a WSGI server
    makes one, addressed to DynamoDB in the runtime's region. moto makes it from an HTTP
    request with werkzeug's test EnvironBuilder instead: 0.2 ms of CPU, a tenth of a claim's."""
    from moto.core.request import Request

    path_only, _, query = path.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path_only,
        "QUERY_STRING": query,
        "SERVER_NAME": DYNAMODB_HOST,
        "SERVER_PORT": "443",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "CONTENT_TYPE": headers.get("content-type", ""),
        "CONTENT_LENGTH": str(len(body)),
    }
    for name, value in headers.items():
        if name not in ("content-type", "content-length", "host", "transfer-encoding"):
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    environ["HTTP_HOST"] = DYNAMODB_HOST
    return Request(environ)


def serve() -> None:
    """The child's life: moto's DynamoDB on a free local port (printed), until stdin closes
    (the parent closes it at its stop, or by exiting); the process then ends with its
    threads, requests under way or not, as a stopped service would."""
    from moto import mock_aws

    with mock_aws(), dynamodb_patches():
        server = LocalServer(("127.0.0.1", 0), _Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        gc.freeze()  # moto's modules and models: out of every collection from now on
        gc.set_threshold(*GC_THRESHOLDS)
        print(server.server_address[1], flush=True)
        sys.stdin.read()


# -- the parent -----------------------------------------------------------------------------


def unsigned_to(endpoint: str) -> Callable[..., None]:
    """A botocore `before-call` hook: a request to this child goes unsigned, as botocore
    sends an operation AWS marks unauthenticated (`auth_type` "none"). Nothing here checks
    a signature (moto reads the account from the key, and without one takes its default,
    the runtime's), and SigV4 was a fifth of a DynamoDB call's CPU in the runtime's process
    (a claim's UpdateItem, 1.64 ms, then 1.32). Any other endpoint is signed as ever."""
    own = endpoint.rstrip("/") + "/"

    def hook(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if str(params.get("url", "")).startswith(own):
            context["auth_type"] = "none"

    return hook


def create_tables(endpoint: str, descriptions: list[dict[str, Any]]) -> None:
    """Create tables as described (DescribeTable's shape), keys and indexes, at `endpoint`
    (this process's child, or another engine)."""
    import boto3

    client = boto3.client("dynamodb", endpoint_url=endpoint)
    for table in descriptions:
        billing = table.get("BillingModeSummary", {}).get("BillingMode", "PAY_PER_REQUEST")
        indexes = {
            kind: [_created_index(index, billing) for index in table[kind]]
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes")
            if table.get(kind)
        }
        client.create_table(
            TableName=table["TableName"],
            KeySchema=table["KeySchema"],
            AttributeDefinitions=table["AttributeDefinitions"],
            BillingMode=billing,
            **_capacity(table, billing),
            **indexes,
        )


def _created_index(index: dict[str, Any], billing: str) -> dict[str, Any]:
    created = {key: index[key] for key in ("IndexName", "KeySchema", "Projection")}
    return created | _capacity(index, billing)


def _capacity(described: dict[str, Any], billing: str) -> dict[str, Any]:
    """A provisioned table's or index's read and write units, as described."""
    if billing != "PROVISIONED" or "ProvisionedThroughput" not in described:
        return {}
    units = described["ProvisionedThroughput"]
    names = ("ReadCapacityUnits", "WriteCapacityUnits")
    return {"ProvisionedThroughput": {name: units[name] for name in names}}


# Children emptied at a runtime's stop, with their endpoints: the next runtime takes one.
_idle: list[tuple[subprocess.Popen[str], str]] = []


def _start_child(environment: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tocsin.local.dynamodb_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environment,
        text=True,
    )


class DynamoDBProcess:
    """The child process, seen from one runtime: taken (an idle child, else a new one),
    endpoint, tables, usage, and handed back emptied at the runtime's stop."""

    def __init__(self, environment: dict[str, str]):
        self._child, self.endpoint = _idle.pop() if _idle else (_start_child(environment), "")
        self._handed_back = False
        self._last_usage: dict[str, Any] = {
            "requests": {},
            "write_units": {},
            "cpu_s": 0.0,
            "peak_memory_mb": 0.0,
        }

    def wait_until_ready(self) -> str:
        """The endpoint, once the child listens (it started while the parent built the rest)."""
        if self.endpoint:
            return self.endpoint
        assert self._child.stdout is not None
        ready = threading.Event()
        port: list[str] = []

        def read_port() -> None:
            port.append(self._child.stdout.readline().strip())  # type: ignore[union-attr]
            ready.set()

        threading.Thread(target=read_port, daemon=True).start()
        if not ready.wait(READY_TIMEOUT_S) or not port[0].isdigit():
            raise RuntimeError(f"the DynamoDB process did not start (exit {self._child.poll()})")
        self.endpoint = f"http://127.0.0.1:{port[0]}"
        return self.endpoint

    def create_tables(self, descriptions: list[dict[str, Any]]) -> None:
        create_tables(self.endpoint, descriptions)

    def usage(self) -> dict[str, Any]:
        """Requests by action, write units billed (`table`, `index`), CPU seconds and peak
        memory (MiB); at the stop, as they were."""
        if self.endpoint and not self._handed_back and self._child.poll() is None:
            with urllib.request.urlopen(self.endpoint + USAGE_PATH, timeout=10) as reply:
                self._last_usage = json.loads(reply.read())
        return self._last_usage

    def keep_journal(self) -> None:
        """From now on, keep each write served (see `journal`)."""
        self._post(JOURNAL_PATH, {})

    def journal(self) -> list[dict[str, Any]]:
        """Each write served since `keep_journal`, in order: its action, body, HTTP status
        and the units it was billed (`table`, `index`, `index:<name>`)."""
        with urllib.request.urlopen(self.endpoint + JOURNAL_PATH, timeout=10) as reply:
            return list(json.loads(reply.read()))

    def set_faults(self, action: str, faults: list[Fault], seed: int) -> None:
        """From now on, `action` requests meet these faults at their shares (none: cleared)."""
        body = {"seed": seed, "actions": {action: [vars(fault) for fault in faults]}}
        self._post(FAULTS_PATH, body)

    def _post(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.endpoint + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def hand_back(self) -> None:
        """This runtime is done with it: its usage kept, as `usage` answers from now on,
        then emptied and left idle for the next runtime of this process (or stopped, if it
        went down or cannot be emptied)."""
        try:
            self.wait_until_ready()
            self.usage()
            self._post(RESET_PATH, {})
        except (OSError, RuntimeError):
            self._stop()
        else:
            _idle.append((self._child, self.endpoint))
        self._handed_back = True

    def _stop(self) -> None:
        assert self._child.stdin is not None
        self._child.stdin.close()
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        if self._child.stdout is not None:
            self._child.stdout.close()


if __name__ == "__main__":
    serve()
