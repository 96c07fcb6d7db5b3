"""Fixtures: the embedded runtime (the real template, ASL and handlers on moto) and a receiver."""

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from tocsin import clock
from tocsin.local.http_thread import serving_in_thread
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import api_event
from tocsin.measure import placed_long_ago
from tocsin.measure.receiver import WebhookReceiver
from tocsin.settings import settings
from tocsin.store import Claim, Holder, TaskStore
from tocsin.submit import new_item

# The tests' receivers listen on loopback, each on a port of its own: allow the host, as an
# operator would with WebhookAllowedHosts (nothing internal is allowed by default).
LOOPBACK_ALLOWED = {"WebhookAllowedHosts": "127.0.0.1"}

# moto's Step Functions interpreter logs each failed state with its whole parsed tree (tens
# of kB); the tests read an execution's history instead. An execution a stopped runtime
# left waiting, failing later on tables that are gone, printed it into the run's output.
logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Node ids as pytest 9.2 keeps them (`_id`), for two plugins that write them as before:
    - schemathesis 4.32 makes each operation's test with the function's name as its
      original name, which pytest 9.2 builds the node id from: the eleven operations had
      one id, and pytest-xdist, which tells tests apart by id, ran one of them;
    - pytest-xdist 3.8 tells a test's worker group (`xdist_group`) by a suffix it writes to
      `_nodeid`, which pytest 9.2 no longer reads: `--dist loadgroup` spread every group
      (pytest-xdist issue 1386). The suffix is written where pytest reads it."""
    grouping = getattr(config.option, "loadgroup", False)
    for item in items:
        nodeid = item.nodeid
        if "[" in item.name and not nodeid.endswith(item.name):  # a parameter may hold "::"
            nodeid = f"{nodeid.rpartition('::')[0]}::{item.name}"
        groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group")})
        if grouping and groups and "@" not in nodeid.rpartition("]")[2]:
            nodeid = f"{nodeid}@{'_'.join(groups)}"
        if nodeid != item.nodeid:
            item._id = type(item._id).parse(nodeid)


# In CI every test runs: one skipped (a tool missing, say) fails the run, as `make test`'s
# groups do there (see the Makefile), so a green CI run never hides a group that did not run.
STRICT = os.environ.get("CI", "").lower() in ("true", "1")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI, a run that skipped a test fails, naming each skipped test and its reason."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not STRICT or reporter is None or hasattr(session.config, "workerinput"):
        return
    skipped = reporter.stats.get("skipped", [])
    if not skipped:
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter.ensure_newline()
    reporter.write_sep("=", f"CI: {len(skipped)} skipped, and CI runs every test")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reporter.write_line(f"{report.nodeid}: {reason}")


# Where the tests' runtimes keep their tables: moto's (the default), or DynamoDB Local, AWS's
# own engine, for the pass of `make test` that runs the store-heavy tests again on it.
TABLES = os.environ.get("TOCSIN_TEST_TABLES", "moto")


def runtime_with(parameters: dict[str, str] | None = None, **options: Any) -> EmbeddedRuntime:
    """An embedded runtime as the tests use it, its template parameters as given: the
    receivers' loopback allowed, and no finder ticker (a test runs the finder itself)."""
    options.setdefault("tables", TABLES)
    return EmbeddedRuntime(
        {**LOOPBACK_ALLOWED, **(parameters or {})}, finder_interval_s=None, **options
    )


@pytest.fixture
def runtime() -> Iterator[EmbeddedRuntime]:
    with runtime_with() as running:
        yield running


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's retries without their waits: a test that runs them to exhaustion counts
    them, and waiting out the backoff (seconds a retry when throttled) proves nothing more."""
    from botocore.retries import standard

    monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", lambda self, context: 0.0)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as listening:
        yield listening


def webhook_task(url: str, due_ms: int, task_id: str, payload: Any = None) -> dict[str, Any]:
    return {
        "id": task_id,
        "due_at": clock.to_iso(due_ms),
        "type": "webhook",
        "target": {"url": url},
        "payload": payload if payload is not None else {"task": task_id},
    }


def call_api(
    runtime: EmbeddedRuntime,
    method: str,
    target: str,
    body: Any = None,
    principal: str | None = "alice",
) -> tuple[int, Any]:
    """One request through the API's handler, as API Gateway sends it (`body` a JSON value,
    or raw text); the status and the decoded reply."""
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    reply = runtime.invoke("ApiFunction", api_event(method, target, raw, principal))
    return reply["statusCode"], json.loads(reply["body"])


def table(name: str) -> Any:
    """A table of the runtime under test, as the tests read it: made once per runtime (a
    boto3 resource costs some 10 ms of CPU to make, and a wait reads the task 20 times a
    second: made at each read, the reads of 15 test processes took most of both cores)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB", "")
    return _table(name, endpoint, id(boto3.DEFAULT_SESSION))


@lru_cache(maxsize=4)
def _table(name: str, endpoint: str, session: int) -> Any:
    return boto3.resource("dynamodb").Table(name)


def all_tasks() -> list[dict[str, Any]]:
    return table(settings().tasks_table).scan()["Items"]


def all_schedules() -> list[dict[str, Any]]:
    return table(settings().schedules_table).scan()["Items"]


def stored(task_id: str) -> dict[str, Any]:
    reply = table(settings().tasks_table).get_item(Key={"task_id": task_id}, ConsistentRead=True)
    return reply["Item"]


def wait_for_status(task_id: str, statuses: set[str], timeout_s: float = 60) -> dict[str, Any]:
    """The task once in one of `statuses` (one not yet written, a callback say, is waited
    for too)."""
    tasks, deadline = table(settings().tasks_table), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        item = tasks.get_item(Key={"task_id": task_id}, ConsistentRead=True).get("Item")
        if item is not None and item["status"] in statuses:
            return item
        time.sleep(0.05)
    last = tasks.get_item(Key={"task_id": task_id}, ConsistentRead=True).get("Item")
    raise AssertionError(f"{task_id} was {last and last['status']}, wanted {statuses}")


def store_task(body: dict[str, Any], owner: str = "alice", submitted_ms: int | None = None) -> None:
    """One PENDING task in the due index, not yet dispatched (the finder's to find), as
    submitted at `submitted_ms` (now by default; earlier for a due time now refused)."""
    submitted = clock.now_ms() if submitted_ms is None else submitted_ms
    item = placed_long_ago(new_item(body, owner, submitted, settings()))
    TaskStore(settings().tasks_table).create(item)


TEST_ATTEMPT = "attempt-1"  # the invocation a test claims as


ENDED = -1  # a claim's lease that ran out: its invocation ended without letting go


def claim_as(execution: str, task_id: str, lease_ms: int = 60_000) -> Claim:
    """`execution` claims the task's first version as its executor would, in an invocation
    that has `lease_ms` left (ENDED: one that is over, killed or timed out)."""
    store = TaskStore(settings().tasks_table)
    holder = Holder(execution, TEST_ATTEMPT, clock.now_ms() + lease_ms)
    return store.claim(task_id, 1, holder, clock.now_ms())


def store_pending(
    receiver_url: str, count: int, due_in_ms: int, prefix: str, **changes: object
) -> list[str]:
    """`count` webhook tasks stored PENDING, due 37 ms apart from `due_in_ms` from now."""
    now = clock.now_ms()
    ids = [f"{prefix}-{i}" for i in range(count)]
    for i, task_id in enumerate(ids):
        store_task(webhook_task(receiver_url, now + due_in_ms + i * 37, task_id) | changes)
    return ids


# How late a test lets a task fire, set for a loaded CI machine (both Pythons' tests at once
# on two cores) and far above what the runtime does when calm (a few ms): a test that fires
# 20 tasks or more holds their p99 to MANY_P99_LATE_MS, one that fires a handful holds each
# to HANDFUL_LATE_MS. Before these bounds, every task fired 900 ms late passed every test.
MANY_P99_LATE_MS = 1_500
HANDFUL_LATE_MS = 250
MANY = 20


def assert_on_time(lateness_ms: list[int]) -> None:
    """Each task fired at or after its due millisecond, and late within the bounds above."""
    assert lateness_ms and min(lateness_ms) >= 0, f"fired early: {sorted(lateness_ms)[:5]}"
    if len(lateness_ms) >= MANY:
        p99 = sorted(lateness_ms)[math.ceil(0.99 * len(lateness_ms)) - 1]
        assert p99 <= MANY_P99_LATE_MS, f"p99 lateness {p99} ms of {len(lateness_ms)} tasks"
    else:
        assert max(lateness_ms) <= HANDFUL_LATE_MS, f"lateness {sorted(lateness_ms)} ms"


def arrivals_on_time(arrivals: list[Any], due_ms: dict[str, int]) -> None:
    """`assert_on_time` for what a receiver saw, by task id."""
    assert_on_time([a.arrival_ms - due_ms[a.task_id] for a in arrivals])


def last_json(output: str) -> Any:
    """The JSON a command prints last (`--json`: progress and tables may come before it)."""
    return json.loads(output.strip().splitlines()[-1])


@contextmanager
def hooked(client: Any, *hooks: tuple[str, Callable[..., Any]]) -> Iterator[None]:
    """Each `(event, handler)` on `client`'s botocore events meanwhile: how a test plays what
    AWS or the network would do to a request (a refusal, a lost connection, a delay, a
    partial answer)."""
    for event, handler in hooks:
        client.meta.events.register(event, handler)
    try:
        yield
    finally:
        for event, handler in hooks:
            client.meta.events.unregister(event, handler)


def stop_until_ended(execution_arn: str) -> None:
    """Stop an execution, again until it has ended: moto loses a stop that comes before the
    execution's Wait has begun."""
    sfn = boto3.client("stepfunctions")
    deadline = time.monotonic() + 10
    while sfn.describe_execution(executionArn=execution_arn)["status"] == "RUNNING":
        assert time.monotonic() < deadline, "the execution would not stop"
        sfn.stop_execution(executionArn=execution_arn)
        time.sleep(0.2)


def stop_executions() -> None:
    """The executions a step started, stopped before they wake: no executor call of theirs
    lands in the next function's record."""
    sfn = boto3.client("stepfunctions")
    for machine in sfn.list_state_machines()["stateMachines"]:
        listed = sfn.list_executions(stateMachineArn=machine["stateMachineArn"])
        for execution in listed["executions"]:
            if execution["status"] == "RUNNING":
                sfn.stop_execution(executionArn=execution["executionArn"])


def dead_letters(runtime) -> list[dict]:
    """Every message on the DLQ, once every execution has finished (each is received, so
    hidden for the queue's visibility timeout)."""
    assert runtime.wait_for_executions(30)
    sqs, letters = boto3.client("sqs"), []
    while batch := sqs.receive_message(
        QueueUrl=runtime.dead_letter_queue_url, MaxNumberOfMessages=10
    ).get("Messages", []):
        letters += [json.loads(m["Body"]) for m in batch]
    return letters


def batch_event(task_id: str, execution: str = "arn:aws:states:::execution:m:one") -> dict:
    """What Fire hands the webhook executor for a batch of this one stored task."""
    due_ms = int(stored(task_id)["due_ms"])
    return {
        "execution": execution,
        "task_type": "webhook",
        "tasks": [{"task_id": task_id, "version": 1, "due_ms": due_ms}],
    }


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server with `handler` (a peer that behaves as a test needs); its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    with serving_in_thread(server, "test-peer"):
        yield f"http://127.0.0.1:{server.server_address[1]}"


def serve(*arguments: str) -> tuple[subprocess.Popen, str]:
    """`tocsin serve` with these arguments, on a port the system picks, in a process of its
    own, once it listens; the process and its URL."""
    # Ctrl-C as a terminal delivers it: a shell that runs pytest in the background hands
    # its children SIGINT ignored, and Python then never raises KeyboardInterrupt.
    command = [sys.executable, "-X", "faulthandler", "-m", "tocsin.cli", "serve", "--port", "0"]
    server = subprocess.Popen(  # faulthandler: a stop that hangs shows where (stop())
        [*command, *arguments],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[1],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    while line.startswith("{"):  # a log line first: a restart's reconciler, say
        line = server.stdout.readline()
    listening = re.match(r"Tocsin API on (http://\S+) ", line)
    assert listening, "tocsin serve did not say where it listens"
    return server, listening[1]


def stop(server: subprocess.Popen, within_s: float = 60) -> None:
    """Ctrl-C to `tocsin serve`, which must end well within `within_s`; if it has not, each
    of its threads' stack goes to the test's output (faulthandler's dump at SIGABRT)."""
    server.send_signal(signal.SIGINT)
    try:
        assert server.wait(timeout=within_s) == 0
    except subprocess.TimeoutExpired:
        server.send_signal(signal.SIGABRT)
        server.wait(timeout=30)
        pytest.fail(f"tocsin serve did not stop {within_s} s after Ctrl-C: its threads above")


@contextmanager
def polling(runtime) -> Iterator[None]:
    """The runtime's queues polled, as Lambda's mappings would (the tests' runtimes run no
    poller): a bulk action's job is worked."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.1):
            runtime.poll_queues()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()
