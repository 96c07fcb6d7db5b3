"""The webhook address guard where it matters: in the API that accepts a target, in the
executor that connects to it, and in `tocsin serve`, which allows only what it is told."""

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import (
    runtime_with,
    serve,
    stop,
    store_task,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import Client, clock
from tocsin.client import InvalidRequest
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import api_event

PUBLIC = "93.184.216.34"  # a global address: the check passes it


class Listener:
    """A TCP server on loopback that only counts the connections it is offered."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.close()


@pytest.fixture
def guarded() -> Iterator[EmbeddedRuntime]:
    """The runtime as deployed by default: no host is allowed to be internal."""
    with EmbeddedRuntime(finder_interval_s=None) as running:
        yield running


def answer_for(monkeypatch, names: dict[str, list[str]]) -> list[str]:
    """DNS for `names`: each lookup takes the next of its answers (the last one repeats);
    other names resolve as usual. Returns the names looked up, in order."""
    real, asked = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in names:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = names[host].pop(0) if len(names[host]) > 1 else names[host][0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def resolver_failing(monkeypatch, failures: dict[str, list[BaseException]]) -> None:
    """DNS for `failures`' names raises each name's next error, then answers loopback;
    other names resolve as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if failures.get(host):
            raise failures[host].pop(0)
        return real("127.0.0.1" if host in failures else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


RESOLVED = ("try-again.example.com", "no-such.example.com", "unforeseen.example.com")


@pytest.mark.parametrize(
    "host", ["a..example.com", f"{'x' * 64}.example.com", f"{'a' * 60}.{'b' * 60}." * 3]
)
def test_a_host_that_is_no_dns_name_is_refused_at_submit(guarded, host):
    """An empty label, a label over 63 characters, a name over 253: 400 naming target.url,
    where the resolver would raise UnicodeError at fire time (or fail to resolve)."""
    body = webhook_task(f"https://{host}/hook", clock.now_ms() + 60_000, "bad")
    status, error = submit(guarded, body)
    assert status == 400 and error["error"]["field"] == "target.url", error
    assert "DNS name" in error["error"]["message"] or "253" in error["error"]["message"]


def test_resolver_failures_fail_a_task_alone_and_a_try_again_is_retried(receiver, monkeypatch):
    """One batch of three webhook tasks whose hosts' resolvers fail: "try again" (EAI_AGAIN)
    once, then resolves: fired on the second attempt; a name that does not exist (EAI_NONAME):
    failed for good on the first; an error the resolver should not raise (UnicodeError, as
    Python's does for a name it cannot encode): that task fails alone, at once, and the
    invocation goes on for the others (before, the whole batch's invocation failed and the
    task ended FAILED some ten minutes and three requeues later)."""
    resolver_failing(monkeypatch, {
        RESOLVED[0]: [socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")],
        RESOLVED[1]: [socket.gaierror(socket.EAI_NONAME, "Name or service not known")] * 3,
        RESOLVED[2]: [UnicodeError("label empty or too long")] * 3,
    })  # fmt: skip
    port = receiver.url.rsplit(":", 1)[1]
    allowed = ",".join(f"{name}:{port}" for name in RESOLVED)
    with runtime_with({"WebhookAllowedHosts": allowed}) as runtime:
        due_ms = (clock.now_ms() // 1000 + 4) * 1000  # one window: one batch
        for i, name in enumerate(RESOLVED):
            url = f"http://{name}:{port}/"
            store_task(webhook_task(url, due_ms + 10 * i, name.split(".")[0]))
        assert runtime.run_finder()["executions"] == 1
        ended = {"SUCCEEDED", "FAILED"}
        retried = wait_for_status("try-again", ended)
        gone = wait_for_status("no-such", ended)
        unforeseen = wait_for_status("unforeseen", ended, timeout_s=15)
    assert (retried["status"], int(retried["attempts"])) == ("SUCCEEDED", 2)
    assert (gone["status"], int(gone["attempts"])) == ("FAILED", 1)
    assert (unforeseen["status"], int(unforeseen["attempts"])) == ("FAILED", 1)
    assert "UnicodeError" in unforeseen["error"]
    assert [a.task_id for a in receiver.received()] == ["try-again"]


def submit(runtime, body: dict) -> tuple[int, dict]:
    reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", json.dumps(body)))
    return reply["statusCode"], json.loads(reply["body"])


@pytest.mark.slow
def test_the_executor_refuses_a_name_that_resolves_inside(guarded, listener, monkeypatch):
    """The name passes the API (it is not an address); the executor resolves it, finds
    loopback, fails the task for good and never connects."""
    answer_for(monkeypatch, {"inside.example.com": ["127.0.0.1"]})
    url = f"https://inside.example.com:{listener.port}/hook"
    status, _ = submit(guarded, webhook_task(url, clock.now_ms() + 1000, "inside"))
    assert status == 201
    item = wait_for_status("inside", {"FAILED"})
    assert "internal address 127.0.0.1" in item["error"] and int(item["attempts"]) == 1
    assert listener.connections == 0


@pytest.mark.slow
def test_dns_rebound_after_the_check_does_not_reach_loopback(guarded, listener, monkeypatch):
    """DNS answers a public address for the check and loopback for every lookup after: the
    executor connects to the address it checked, so loopback is never offered a connection.
    The public host is a stand-in that refuses (no real network)."""
    asked = answer_for(monkeypatch, {"rebind.example.com": [PUBLIC, "127.0.0.1"]})
    connected_to: list[str] = []
    real_connect = socket.create_connection

    def internet(address, *args, **kwargs):
        if address[1] == listener.port:  # the webhook's, not the local DynamoDB's
            connected_to.append(address[0])
        if address[0] == PUBLIC:
            raise ConnectionRefusedError(f"{PUBLIC} refused (stand-in)")
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", internet)
    url = f"https://rebind.example.com:{listener.port}/hook"
    body = webhook_task(url, clock.now_ms() + 1000, "rebound") | {"max_attempts": 1}
    assert submit(guarded, body)[0] == 201
    wait_for_status("rebound", {"FAILED"})
    assert asked == ["rebind.example.com"]  # resolved once, before the gate
    assert connected_to and set(connected_to) == {PUBLIC}
    assert listener.connections == 0
    assert stored("rebound")["status"] == "FAILED"


@pytest.mark.slow
@pytest.mark.tool
def test_serve_allows_exactly_the_hosts_it_is_told(receiver):
    """`tocsin serve --allow-host 127.0.0.1:<port>` lets webhooks reach that receiver and
    no other port of the same host."""
    allowed = receiver.url.removeprefix("http://")
    server, url = serve("--allow-host", allowed, "--finder-interval", "1")
    try:
        alice = Client(url, principal="alice")
        task = alice.submit(type="webhook", target={"url": f"{receiver.url}/in"}, delay=1)
        with pytest.raises(InvalidRequest) as refused:  # the API's own port, on the same host
            alice.submit(type="webhook", target={"url": f"{url}/"}, delay=1)
        assert refused.value.status == 400 and refused.value.field == "target.url"
        deadline = clock.now_ms() + 30_000
        while not receiver.received() and clock.now_ms() < deadline:
            threading.Event().wait(0.1)
        assert [arrival.task_id for arrival in receiver.received()] == [task.id]
    finally:
        stop(server)
