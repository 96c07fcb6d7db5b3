"""`tocsin chaos`: faults injected into the embedded runtime, then every task judged.

Each scenario gets a fresh runtime (the real template, state machine and handlers), a
webhook receiver and its own batch of tasks. A fault is switched on at a seam outside
the product: a botocore hook on a client, a wrapper on a moto backend, the DynamoDB
process's answers, a wrapper on the runtime's Lambda invoke, or the receiver's replies.
The judge then reads every task and every arrival: duplicates (a version delivered more
than once), early (delivered before its due time), lost (neither delivered nor in a state
that says why) and dlq_missing (a FAILED task with no dead-letter message holding its error).
"""

import json
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from botocore.exceptions import EndpointConnectionError
from moto.core.exceptions import JsonRESTError

from tocsin import aws, clock
from tocsin.dispatch import Batch, due_task, execution_arn
from tocsin.finder import HORIZON as FINDER_HORIZON
from tocsin.fire.writes import TableUnavailable
from tocsin.index_keys import LOOK_AFTER_MS
from tocsin.local.dynamodb_process import Fault
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import api_event
from tocsin.measure import most_within, placed_long_ago
from tocsin.measure.receiver import Arrival, WebhookReceiver, allowing
from tocsin.reconcile import Reconciled, reconcile
from tocsin.settings import settings
from tocsin.store import DUE_INDEX, HORIZONS_KEY

LEAD_IN_MS = 6000  # tasks fall due from this far ahead, so every path has room to run
EXECUTORS = "ExecutorFunction"


def _tasks() -> list[dict[str, Any]]:
    """Every task in the table (not the horizons, nor a flow's ledger: no task id holds
    the `~` their keys begin with), page after page: a page holds 1 MB, and 2,000 tasks
    with their tries were two."""
    table, items, more = aws.resource("dynamodb").Table(settings().tasks_table), [], {}
    while True:
        page = table.scan(**more)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            break
        more = {"ExclusiveStartKey": page["LastEvaluatedKey"]}
    return [item for item in items if not item["task_id"].startswith("~")]


# Three attempts, each pause within the invocation: a task that keeps failing ends FAILED
# within the run's minute, as the scenarios judge it (the defaults retry for a day).
CHAOS_RETRY = {"max_attempts": 3, "min_backoff_s": 0.5, "max_backoff_s": 2}


@dataclass
class Trial:
    """One scenario's world: its runtime, receiver, tasks and what it expects of them."""

    runtime: EmbeddedRuntime
    receiver: WebhookReceiver
    rng: random.Random
    due: dict[str, int] = field(default_factory=dict)  # idempotency key -> due ms
    extra_creations: int = 0  # submissions beyond the first that created a task again
    may_fail: set[str] = field(default_factory=set)  # ids the scenario means to fail
    # Versions whose invocation was killed while it sent: delivery is at least once there
    # (docs/reliability.md), so a second delivery is counted apart, not as a duplicate.
    may_repeat: set[str] = field(default_factory=set)
    notes: dict[str, Any] = field(default_factory=dict)  # what a scenario saw, reported as is
    faults_met: Counter[str] = field(default_factory=Counter)  # by kind, as they happened
    flow: dict[str, Any] | None = None  # the tasks' flow, whose limits are judged too
    retry: dict[str, Any] = field(default_factory=lambda: CHAOS_RETRY)  # the tasks' policy
    runtimes: ExitStack = field(default_factory=ExitStack)  # this runtime, and any restarted
    exits: ExitStack = field(default_factory=ExitStack)  # the scenario's faults
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def roll(self) -> float:
        """A random number in [0, 1), safe to draw from the runtime's many threads."""
        with self._lock:
            return self.rng.random()

    def met(self, fault: str, times: int = 1) -> None:
        """Count a fault the run met: a run that met none of its faults proves nothing."""
        with self._lock:
            self.faults_met[fault] += times

    def met_injected(self, names: dict[str, str]) -> None:
        """Count the faults the DynamoDB process injected, by error code, as `names` names
        them (a code it has not injected counts 0)."""
        injected = self.runtime.dynamodb.usage()["injected"]
        for code, name in names.items():
            self.met(name, injected.get(code, 0))

    def body(self, task_id: str, due_ms: int, path: str = "/ok") -> dict[str, Any]:
        """A task of the run, tried again as its policy says (CHAOS_RETRY, unless the
        scenario names another)."""
        return {
            "id": task_id,
            "due_at": clock.to_iso(due_ms),
            "type": "webhook",
            "target": {"url": f"{self.receiver.url}{path}"},
            "payload": {"task": task_id},
            "retry": self.retry,
            **({"flow": self.flow} if self.flow else {}),
        }

    def plan(
        self, count: int, prefix: str, spread_ms: int = 3000, lead_in_ms: int = LEAD_IN_MS
    ) -> list[tuple[str, int]]:
        """Ids and due times from `lead_in_ms` ahead, at random over `spread_ms`."""
        start = clock.now_ms() + lead_in_ms
        plan = [(f"{prefix}-{i}", start + self.rng.randrange(spread_ms)) for i in range(count)]
        for task_id, due_ms in plan:
            self.due[f"{task_id}:1"] = due_ms
        return plan

    def store(
        self,
        count: int,
        prefix: str,
        path: str = "/ok",
        spread_ms: int = 3000,
        lead_in_ms: int = LEAD_IN_MS,
    ) -> list[str]:
        """PENDING tasks written straight to the table, for the finder to find; `path` may
        hold `{id}`, the task's id."""
        from tocsin.store import TaskStore
        from tocsin.submit import new_item

        store, now = TaskStore(settings().tasks_table), clock.now_ms()
        plan = self.plan(count, prefix, spread_ms, lead_in_ms)
        for task_id, due_ms in plan:
            body = self.body(task_id, due_ms, path.format(id=task_id))
            store.create(placed_long_ago(new_item(body, "chaos", now, settings())))
        return [task_id for task_id, _ in plan]

    def api(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        raw = None if body is None else json.dumps(body)
        reply = self.runtime.invoke("ApiFunction", api_event(method, target, raw, "chaos"))
        return int(reply["statusCode"]), json.loads(reply["body"])

    def restart(self) -> None:
        """Stop the runtime (it saves its state) and start another on that state."""
        self.runtime.stop()
        saved = json.loads(self.runtime.state_file.read_text())  # type: ignore[union-attr]
        at_stop = Counter(
            item["status"]["S"] for item in saved["tables"]["TasksTable"] if "status" in item
        )
        self.notes["at_stop"] = dict(at_stop)
        unfinished = sum(at_stop[status] for status in ("PENDING", "RETRYING", "RUNNING"))
        self.met("tasks_unfinished_at_stop", unfinished)
        self.runtime = self.runtimes.enter_context(
            _runtime(self.runtime.state_file, self.receiver.url, self.runtime.lambda_limits)
        )

    def finder_until_done(self, runs: int = 30) -> None:
        """Run the finder until nothing due is left PENDING; a crashed run is run again."""
        for _ in range(runs):
            try:
                report = self.runtime.run_finder()
            except Exception:  # the injected crash: the next run picks the tasks up
                continue
            if report["backlog"] == 0:
                return

    def settle(self, timeout_s: float = 90) -> None:
        """Wait until every task is final (or the time is up) and no execution runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            statuses = set(self.statuses())
            if statuses <= {"SUCCEEDED", "FAILED", "CANCELLED"} and not self._running():
                return
            if statuses & {"PENDING", "RETRYING"}:
                self.finder_until_done(runs=1)
            time.sleep(0.2)

    def statuses(self) -> Counter[str]:
        """How many tasks are in each status now."""
        return Counter(item["status"] for item in _tasks())

    def _running(self) -> bool:
        return any(e.status == "RUNNING" for e in self.runtime.executions())

    def judge(self) -> dict[str, int]:
        items = _tasks()
        answered = [a for a in self.receiver.received() if 200 <= a.status < 300]
        delivered = Counter(a.idempotency_key for a in answered)
        first: dict[str, int] = {}
        for arrival in answered:
            first.setdefault(arrival.idempotency_key, arrival.arrival_ms)
        in_dlq = self._dead_letters()
        counts = Counter(tasks=len(items))
        unplanned: dict[str, str] = {}  # task id: its stored error, for the report
        for item in items:
            key = _current(item)
            status = item["status"]
            counts["fired"] += delivered[key] > 0
            counts["failed_to_dlq"] += status == "FAILED"
            counts["cancelled"] += status == "CANCELLED"
            if status == "FAILED" and item["task_id"] not in self.may_fail:
                counts["unexpected_failures"] += 1
                unplanned[item["task_id"]] = item.get("error", "")
            explained = (
                (status == "SUCCEEDED" and delivered[key] > 0)
                or status == "FAILED"
                or (status == "CANCELLED" and delivered[key] == 0)
            )
            counts["lost"] += not explained
            counts["dlq_missing"] += status == "FAILED" and key not in in_dlq
        # Sent again because its answer was not written within the sender's limit: it gave up
        limit_ms = settings().webhook_timeout_s * 1000
        by_key: dict[str, list[Arrival]] = {}
        for arrival in answered:
            by_key.setdefault(arrival.idempotency_key, []).append(arrival)
        doubled = []
        for key, times in delivered.items():
            if key in self.may_repeat:
                counts["delivered_again_after_a_kill"] += times - 1
            elif all(_unanswered_within(a, limit_ms) for a in _but_last(by_key[key])):
                counts["delivered_again_after_a_late_answer"] += times - 1
            else:
                counts["duplicates"] += times - 1
                doubled += [key] * (times > 1)
            counts["early"] += first[key] < self.due.get(key, 0)
        if self.may_repeat:
            self.notes["delivered_again_after_a_kill"] = counts["delivered_again_after_a_kill"]
        if counts["delivered_again_after_a_late_answer"]:
            self.notes["delivered_again_after_a_late_answer"] = counts[
                "delivered_again_after_a_late_answer"
            ]
        current = {_current(item) for item in items}
        counts["duplicates"] += len(set(delivered) - current)  # an old version, after a change
        counts["duplicates"] += self.extra_creations
        if unplanned:
            self.notes["unplanned_failures"] = unplanned
        if doubled:
            self.notes["delivered_twice"] = doubled
        counts["over_limits"] = self._over_limits()
        return {name: counts[name] for name in JUDGED}

    def _over_limits(self) -> int:
        """By how much the sends of the tasks' flow, where they arrived, went over its rate
        in some second and over its parallelism at some moment (0 without a flow)."""
        if self.flow is None:
            return 0
        sends = [a.arrival_ms for a in self.receiver.received()]
        most = {"rate": most_within(sends, 1000), "parallelism": self.receiver.most_in_flight}
        self.notes["flow"] = {f"most_{name}": most[name] for name in most} | self.flow
        return sum(max(0, most[name] - self.flow[name]) for name in most if name in self.flow)

    def _dead_letters(self) -> set[str]:
        sqs, keys = boto3.client("sqs"), set()
        while True:
            batch = sqs.receive_message(
                QueueUrl=self.runtime.dead_letter_queue_url, MaxNumberOfMessages=10
            ).get("Messages", [])
            if not batch:
                return keys
            for message in batch:
                body = json.loads(message["Body"])
                named = body["batch"]["tasks"] if "batch" in body else [body]
                keys.update(f"{task['task_id']}:{task['version']}" for task in named)


JUDGED = (
    "tasks",
    "fired",
    "duplicates",
    "early",
    "lost",
    "failed_to_dlq",
    "cancelled",
    "unexpected_failures",
    "dlq_missing",
    "over_limits",
)
HOLES = ("duplicates", "early", "lost", "unexpected_failures", "dlq_missing", "over_limits")


def _current(item: dict[str, Any]) -> str:
    return f"{item['task_id']}:{int(item['version'])}"


# -- the scenarios -------------------------------------------------------------------------


def _together(work: list[Callable[[], Any]], name: str) -> None:
    """Run each callable on its own thread (`name` and its number), all at once, and wait
    for them all."""
    threads = [threading.Thread(target=one, name=f"{name}{n}") for n, one in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


FINDER_CRASHES = 3


def finders_horizon_write(params: dict[str, Any]) -> bool:
    """Whether an UpdateItem's parameters (at `before-parameter-build`) move the finder's
    horizon (not the reconciler's, on the same item)."""
    horizon = params.get("ExpressionAttributeNames", {}).get("#h") == FINDER_HORIZON
    return params["Key"]["task_id"] == HORIZONS_KEY["task_id"] and horizon


def finder_crash(trial: Trial, tasks: int) -> None:
    """The finder dies after its StartExecutions and before its horizon moves, three runs
    in a row, with new tasks stored between them: each next run reads the same entries
    again, packed the same or (with the newcomers) differently."""
    crashes = [FINDER_CRASHES]
    client = aws.resource("dynamodb").meta.client

    def crash(params: dict[str, Any], **_: Any) -> None:
        if finders_horizon_write(params) and crashes[0]:
            crashes[0] -= 1
            trial.met("finder_crashes")
            raise EndpointConnectionError(endpoint_url="https://dynamodb")

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", crash)
    trial.exits.callback(
        client.meta.events.unregister, "before-parameter-build.dynamodb.UpdateItem", crash
    )
    for part in range(FINDER_CRASHES + 1):
        trial.store(tasks // (FINDER_CRASHES + 1), f"crash{part}")
        trial.finder_until_done(runs=1)
    trial.finder_until_done()


@contextmanager
def finders_in_step(parties: int) -> Iterator[list[str]]:
    """While open, a finder on a thread named "finder…" waits, once it has read every due
    shard, until `parties` finders have: all read the same due tasks before any starts one
    or moves the horizon, as runs at once on AWS can (finders merely started together often
    end one before another reads). Yields the names of the threads that waited."""
    client = aws.resource("dynamodb").meta.client
    barrier, seen, held = threading.Barrier(parties, timeout=60), threading.local(), []

    def count(params: dict[str, Any], **_: Any) -> None:
        """A finder's read of a due shard: up to a moment ahead (the reconciler, first in
        the same invocation, reads the same shards up to a moment past, and its checks)."""
        values = params.get("ExpressionAttributeValues", {})
        shard_read = params.get("IndexName") == DUE_INDEX and "check" not in str(values[":shard"])
        ahead = int(values.get(":until", 0)) > clock.now_ms()
        if shard_read and ahead and threading.current_thread().name.startswith("finder"):
            seen.reads = getattr(seen, "reads", 0) + 1

    def hold(**_: Any) -> None:
        if getattr(seen, "reads", 0) == settings().shards and not getattr(seen, "held", False):
            seen.held = True
            held.append(threading.current_thread().name)
            barrier.wait()

    hooks = (("before-parameter-build.dynamodb.Query", count), ("after-call.dynamodb.Query", hold))
    for event, handler in hooks:
        client.meta.events.register(event, handler)
    try:
        yield held
    finally:
        for event, handler in hooks:
            client.meta.events.unregister(event, handler)


def racing_finders(trial: Trial, tasks: int) -> None:
    """Two, then five finders at once over the same due tasks, each reading them all
    before any goes on. The five's tasks fall due past the horizon the two left (the
    look-ahead), so that they too race over tasks no finder has started; each race must
    start all of its tasks itself (`tasks_raced`), not leave them to the reconciler."""
    from tocsin.store import TaskStore

    spread_ms = 1000
    ids = trial.store(tasks // 2, "two", spread_ms=spread_ms)
    for finders, prefix in ((2, "two"), (5, "five")):
        if finders == 5:  # due just past the two's horizon, and inside the five's look-ahead
            horizon = TaskStore(settings().tasks_table).horizon(FINDER_HORIZON) or 0
            ids = trial.store(
                tasks // 2, prefix, lead_in_ms=horizon + 1 - clock.now_ms(), spread_ms=spread_ms
            )
            time.sleep(spread_ms / 1000)
        with finders_in_step(finders) as held:
            _together([trial.runtime.run_finder] * finders, "finder")
        trial.met("finders_in_step", len(held))
        trial.met("tasks_raced", len(set(ids) & _started(trial.runtime)))


def _started(runtime: EmbeddedRuntime) -> set[str]:
    """The ids of the tasks some execution of the task machine was started with."""
    inputs = (e.input_data or {} for e in runtime.executions())  # moto keeps them parsed
    return {task["task_id"] for data in inputs for task in data.get("tasks", [])}


def throttled_starts(trial: Trial, tasks: int) -> None:
    """StartExecution answers ThrottlingException on half the calls."""
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    start = StepFunctionsParserBackend.start_execution

    def throttled(backend: Any, *args: Any, **kwargs: Any) -> Any:
        if trial.roll() < 0.5:
            trial.met("throttled_starts")
            raise JsonRESTError("ThrottlingException", "Rate exceeded")
        return start(backend, *args, **kwargs)

    trial.exits.enter_context(
        mock.patch.object(StepFunctionsParserBackend, "start_execution", throttled)
    )
    trial.store(tasks, "throttled")
    trial.finder_until_done()


def dynamodb_faults(trial: Trial, tasks: int) -> None:
    """A third of UpdateItem calls (claims, marks) are throttled or fail with a 500."""
    faults = [
        Fault("ProvisionedThroughputExceededException", 400, 1 / 6),
        Fault("InternalServerError", 500, 1 / 6),
    ]
    # In the DynamoDB process, which ends with the runtime: no need to take them back.
    trial.runtime.dynamodb.set_faults("UpdateItem", faults, seed=trial.rng.randrange(2**32))
    met = {
        "ProvisionedThroughputExceededException": "throttled_writes",
        "InternalServerError": "writes_answered_500",
    }
    trial.exits.callback(trial.met_injected, met)
    trial.store(tasks, "dynamodb")
    trial.finder_until_done()


def ambiguous_writes(trial: Trial, tasks: int) -> None:
    """A quarter of UpdateItem calls (marks, claims, final marks) commit, then answer 500:
    botocore sends them again, and each retry must find its own write."""
    faults = [Fault("InternalServerError", 500, 1 / 4, after_commit=True)]
    trial.runtime.dynamodb.set_faults("UpdateItem", faults, seed=trial.rng.randrange(2**32))
    trial.exits.callback(trial.met_injected, {"InternalServerError": "committed_then_500"})
    trial.store(tasks, "ambiguous")
    trial.finder_until_done()


# The scenario's: the local lead (5 s), the window and one webhook attempt (19 s) before the 3 s
# an executor keeps for its final marks: it starts no attempt that could outlast its time.
EXECUTOR_TIMEOUT_S = 30.0


def executor_timeouts(trial: Trial, tasks: int) -> None:
    """For a third of the tasks, the first invocation of their batch hangs past the
    executor's timeout before it reaches the handler (Lambda answers `Sandbox.Timedout`
    and kills the sandbox); Fire retries it."""
    ids = trial.store(tasks, "timeout")
    hanging = set(trial.rng.sample(ids, max(1, len(ids) // 3)))
    runtime, invoke = trial.runtime, trial.runtime.invoke
    _executors_time_out(runtime)

    def hangs(logical_id: str, event: Any) -> Any:
        named = {t["task_id"] for t in event.get("tasks", [])} if isinstance(event, dict) else set()
        if logical_id.endswith(EXECUTORS) and named & hanging:
            hanging.difference_update(named)
            trial.met("timed_out_invocations")
            time.sleep(EXECUTOR_TIMEOUT_S + 1)
            raise SandboxKilled("injected: the sandbox was killed at its timeout")
        return invoke(logical_id, event)

    trial.exits.enter_context(mock.patch.object(runtime, "invoke", hangs))
    trial.finder_until_done()


def _executors_time_out(runtime: EmbeddedRuntime) -> None:
    """The executors' invocations end after EXECUTOR_TIMEOUT_S, not the template's 120 s."""
    for logical_id in list(runtime.functions):
        if logical_id.endswith(EXECUTORS):
            runtime.time_out_at(logical_id, EXECUTOR_TIMEOUT_S)


def unmarked_sends(trial: Trial, tasks: int) -> None:
    """For a third of the tasks the Tasks table refuses the final mark after the send
    (throttled, every try to the invocation's margin): the executor logs the send and
    fails; Fire's retry takes the task over, finds the send in the log, and marks it from
    there instead of sending again. The DynamoDB process refuses them, so the executors'
    sandboxes under --lambda-limits meet it too."""
    ids = trial.store(tasks, "unmarked")
    refused = trial.rng.sample(ids, max(1, len(ids) // 3))
    _executors_time_out(trial.runtime)
    sent_table = settings().sent_table
    faults = [
        Fault(
            "ProvisionedThroughputExceededException",
            400,
            1.0,
            when=('":status"', f'"{task_id}"'),
            until_item=(sent_table, f"{task_id}:1"),
        )
        for task_id in refused
    ]
    dynamodb = trial.runtime.dynamodb
    dynamodb.set_faults("UpdateItem", faults, seed=trial.rng.randrange(2**32))
    trial.exits.callback(dynamodb.set_faults, "UpdateItem", [], seed=0)  # off: the rest runs
    trial.exits.callback(
        trial.met_injected, {"ProvisionedThroughputExceededException": "final_marks_refused"}
    )
    trial.finder_until_done()
    trial.settle()
    logged = boto3.resource("dynamodb").Table(sent_table).scan()["Items"]
    trial.met("sends_logged", len(logged))


class SandboxKilled(Exception):
    """What the hanging invocation meets once Lambda has answered for it."""


# Under Lambda's limits: the executors end at this, so that a frozen invocation is killed
# soon; it leaves room for the lead, the window, one attempt and the final marks' margin.
SANDBOX_TIMEOUT_S = 20.0
WEBHOOK = "WebhookExecutorFunction"


class NeedsLambdaLimits(RuntimeError):
    """A scenario that kills sandboxes, run without them."""


def lambda_kills(trial: Trial, tasks: int) -> None:
    """Under --lambda-limits, an executor's sandbox dies while it sends, its target reached
    and the answer not yet read: for a sixth of the tasks it is frozen until Lambda's
    Timeout kills it (`Sandbox.Timedout`), for another sixth its memory runs out
    (`Lambda.Unknown`); and a fifth of the final marks hang in DynamoDB past the
    invocation's end. Fire's retry takes each task over once the dead invocation's lease
    is over; what the dead one delivered may be delivered again (at least once, counted
    apart), as may what a sandbox whose memory was cut sends in a later invocation, which
    it may not outlive either; a send whose final mark hung is logged in time and not sent
    again."""
    pool = trial.runtime.sandboxes
    if pool is None:
        raise NeedsLambdaLimits("lambda-kills kills sandboxes: run it with --lambda-limits")
    trial.runtime.time_out_at(WEBHOOK, SANDBOX_TIMEOUT_S)
    # the first final mark hangs whatever the draw, so that every run meets one
    hang = Fault("hang", 0, 1 / 5, hang_s=SANDBOX_TIMEOUT_S + 5, when=('":status"',), first=1)
    trial.runtime.dynamodb.set_faults("UpdateItem", [hang], seed=trial.rng.randrange(2**32))
    trial.exits.callback(trial.met_injected, {"hang": "final_marks_hung"})
    ids = trial.store(tasks, "killed", spread_ms=9000)  # a batch a second: a kill hits few
    chosen = trial.rng.sample(ids, max(2, len(ids) // 3))
    kills = {task_id: KILLS[i % 2] for i, task_id in enumerate(chosen)}
    arrived: set[str] = set()
    cut: set[Any] = set()  # environments whose memory was cut: they die in this send or a later
    lock = threading.Lock()

    def kill_mid_send(arrival: Any) -> None:
        with lock:
            arrived.add(arrival.task_id)
            kill = kills.pop(arrival.task_id, None)
        for environment in pool.busy(WEBHOOK):
            batch = environment.running or {}
            named = {f"{t['task_id']}:{t['version']}" for t in batch.get("tasks", [])}
            if arrival.idempotency_key not in named:
                continue
            if environment in cut:  # what it sends now dies with it if its memory runs out
                trial.may_repeat.update(named)
            elif kill is not None and kill(environment):
                trial.may_repeat.update(named)
                trial.met(kill.__name__)
                if kill is out_of_memory:
                    cut.add(environment)
                return
        if kill is not None:  # it missed (its sandbox grew past the cut): a later task's turn
            with lock:
                later = [t for t in ids if t not in arrived and t not in kills]
                if later:
                    kills[later[0]] = kill

    trial.receiver.on_arrival = kill_mid_send
    trial.exits.callback(setattr, trial.receiver, "on_arrival", None)
    trial.finder_until_done()
    _until_no_execution_runs_nor_lease_holds(trial)
    with lock:
        kills.clear()  # the kills are over: what the reconciler starts lives (but in a cut one)
    # Its look two minutes past the tasks' due times, brought forward: it requeues each task
    # a dead invocation left RUNNING (whose Fire retries ran out while its lease held).
    report = reconcile(settings(), max(trial.due.values()) + LOOK_AFTER_MS + 1)
    trial.notes["requeued_by_the_reconciler"] = report.outcomes[Reconciled.REQUEUED]


def _until_no_execution_runs_nor_lease_holds(trial: Trial, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [item for item in _tasks() if item["status"] == "RUNNING"]
        leases = [int(item.get("lease_until", 0)) for item in running]
        if not trial._running() and max(leases, default=0) < clock.now_ms():
            return
        time.sleep(0.5)


def frozen_until_its_timeout(environment: Any) -> bool:
    """The sandbox stops where it is; Lambda's Timeout ends it."""
    os.kill(environment.child.pid, signal.SIGSTOP)
    return True


# A sandbox sending grows between its usage read and the limit's write, and the kernel
# will not set a limit under what it holds: read again and write again this often. With
# one try, a run of `lambda-kills` at 15 tasks now and then met no kill of this kind.
OUT_OF_MEMORY_TRIES = 5


def out_of_memory(environment: Any) -> bool:
    """The sandbox's memory limit comes down to what it holds: its next pages are refused
    and the kernel kills it, as Lambda does past a function's MemorySize."""
    memory = environment.groups.memory
    for _ in range(OUT_OF_MEMORY_TRIES):
        held = int((memory / "memory.usage_in_bytes").read_text())
        try:
            for limit in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
                if (memory / limit).exists():
                    (memory / limit).write_text(str(held + 64 * 1024))
        except OSError:  # it grew meanwhile: the kernel would not shrink the limit under it
            continue
        return True
    return False


KILLS = (frozen_until_its_timeout, out_of_memory)


def executor_faults(trial: Trial, tasks: int) -> None:
    """Executor invocations fail as a whole the first time for half the tasks (the table
    out of reach: the state machine retries, and the retry claims again); a tenth of the
    targets refuse their task for good."""
    ids = trial.store(tasks, "executor", "/executor/{id}")
    permanent = set(trial.rng.sample(ids, max(1, len(ids) // 10)))
    trial.may_fail |= permanent
    for task_id in permanent:
        trial.receiver.status_for[f"/executor/{task_id}"] = 410
    transient = set(trial.rng.sample(sorted(set(ids) - permanent), len(ids) // 2))
    invoke = trial.runtime.invoke

    def failing(logical_id: str, event: Any) -> Any:
        named = {t["task_id"] for t in event.get("tasks", [])} if isinstance(event, dict) else set()
        if logical_id.endswith(EXECUTORS) and named & transient:
            transient.difference_update(named)
            trial.met("invocations_failed")
            raise TableUnavailable("injected: the table is out of reach")
        return invoke(logical_id, event)

    trial.exits.enter_context(mock.patch.object(trial.runtime, "invoke", failing))
    trial.finder_until_done()


def webhook_faults(trial: Trial, tasks: int) -> None:
    """The receiver answers 500 or 429, hangs past the timeout or drops the connection,
    then recovers; one path answers 500 for good."""
    scripts: dict[str, list[Any]] = {
        "/e500": [500, 500],
        "/e429": [429],
        "/hang": ["hang"],
        "/close": ["close"],
    }
    per_path = max(1, tasks // 5)
    for path, script in scripts.items():
        for task_id in trial.store(per_path, path.strip("/"), path + "/{id}"):
            trial.receiver.script_for[f"{path}/{task_id}"] = list(script)
    for task_id in trial.store(per_path, "down", "/down/{id}"):
        trial.receiver.status_for[f"/down/{task_id}"] = 500
        trial.may_fail.add(task_id)
    planned = sum(len(script) for script in trial.receiver.script_for.values())

    def replies_met() -> None:
        left = sum(len(script) for script in trial.receiver.script_for.values())
        trial.met("receiver_faults", planned - left)

    trial.exits.callback(replies_met)
    trial.finder_until_done()


# A receiver's outage: it answers 503 for three times the span its tasks fall due in (90 s
# for 2,000 tasks), then 200. The host is held back (tocsin.holds): one task probes it on
# its own backoff (doubling from 1 s), the others wait on the hold, and once a probe is
# answered they go at the stack's HostRecoveryRate.
OUTAGE_SPAN_MS_PER_TASK = 15
OUTAGE_RETRY = {"min_backoff_s": 1, "max_backoff_s": 3600}


def outage(trial: Trial, tasks: int) -> None:
    """Every task goes to one host that answers 503 from before the first is due until
    three times their span after; none may fail. The attempts the host met during the
    outage (one a task claimed before the hold began, and the probes), how many tasks were
    tried more than once, and the most arrivals in any second after it are reported."""
    trial.retry = OUTAGE_RETRY
    spread_ms = max(3000, tasks * OUTAGE_SPAN_MS_PER_TASK)
    ids = trial.store(tasks, "outage", "/outage/{id}", spread_ms=spread_ms)
    down = {f"/outage/{task_id}" for task_id in ids}
    for path in down:
        trial.receiver.status_for[path] = 503
    outage_s = (LEAD_IN_MS + 3 * spread_ms) / 1000
    recovery = threading.Timer(outage_s, lambda: [trial.receiver.status_for.pop(p) for p in down])
    recovery.start()
    trial.exits.callback(recovery.cancel)
    trial.finder_until_done()
    rate = settings().host_recovery_rate
    # the first probe after the recovery comes within the outage's length again (its
    # backoff doubles), then the tasks drain at the recovery rate
    trial.settle(timeout_s=2.5 * outage_s + tasks / rate + 60)
    refused = [a for a in trial.receiver.received() if a.status == 503]
    trial.met("outage_answers", len(refused))
    per_task = Counter(a.task_id for a in refused)
    after = sorted(a.arrival_ms for a in trial.receiver.received() if a.status == 200)
    # when each was written, as its executor stamped it: the receiver here is a thread of
    # the runtime's own busy process, and stamps what it reads late by its wait for a turn
    written = sorted(
        clock.to_ms(datetime.fromisoformat(item["fired_at"]))
        for item in _tasks()
        if "fired_at" in item
    )
    trial.notes["outage"] = {
        "seconds": outage_s,
        "attempts_during": len(refused),
        "tried_more_than_once": sum(1 for n in per_task.values() if n > 1),
        "most_attempts_of_one_task": max(per_task.values(), default=0) + 1,
        "recovery_rate": rate,
        "most_in_any_second_after": most_within(after, 1000),
        "most_written_in_any_second_after": most_within(written, 1000),
    }


CHAOS_FLOW = {"key": "chaos-receiver", "rate": 20, "parallelism": 3}
SLOW_ANSWER_S = 0.5  # at 3 in flight, 6 answers a second where 15 are due: the parallelism binds


def flow_limits(trial: Trial, tasks: int) -> None:
    """Tasks of one flow (20 a second, 3 in flight) due within one second at a receiver
    that answers slowly, and fails one task in five twice before it answers 200: the
    flow's limits hold where its sends arrive, retries included, and nothing is lost or
    sent twice."""
    trial.flow = CHAOS_FLOW
    trial.receiver.answer_after_s = SLOW_ANSWER_S
    ids = trial.store(tasks, "flow", "/flow/{id}", spread_ms=1000)
    for task_id in ids[::5]:
        trial.receiver.script_for[f"/flow/{task_id}"] = [500, 500]
    planned = sum(len(script) for script in trial.receiver.script_for.values())

    def replies_met() -> None:
        left = sum(len(script) for script in trial.receiver.script_for.values())
        trial.met("receiver_faults", planned - left)
        trial.met("slow_answers", len(trial.receiver.received()))

    trial.exits.callback(replies_met)
    trial.finder_until_done()


RACE_WINDOW_MS = (-1500, 700)  # around the wake, which the claims follow
RACE_SPACING_MS = 25  # between the races' due times, on average: their API calls keep pace


def wake_ms(task_id: str, due_ms: int) -> int:
    """The wake time of the task's execution, read from its input: the claim follows it.
    The execution is the one its claim names, else the one its writer started (a batch of
    its own). Without one (on a loaded machine the API can leave its start to the finder)
    the nearest guess is a lead before it is due: an execution wakes that much or more."""
    from tocsin.store import TaskStore

    guess_ms = due_ms - settings().lead_ms
    item = TaskStore(settings().tasks_table).get(task_id) or {}
    if not item:
        return guess_ms
    name = item.get("execution") or Batch((due_task(item),)).execution_name
    arn = execution_arn(settings().state_machine_arn, name)
    sfn = aws.client("stepfunctions")
    try:
        given = json.loads(sfn.describe_execution(executionArn=arn)["input"])
    except sfn.exceptions.ExecutionDoesNotExist:  # not started (yet)
        return guess_ms
    return clock.to_ms(datetime.fromisoformat(given["wake_at"]))


def cancel_and_reschedule_races(trial: Trial, tasks: int) -> None:
    """Cancels and reschedules land around each task's claim (its execution's wake time),
    their offsets spread evenly over RACE_WINDOW_MS: some before the claim (cancelled and
    never fired, or rescheduled), some after it (409, and the task fires once).

    Each task's race starts as soon as it is submitted, and the tasks fall due a full lead
    later than elsewhere, RACE_SPACING_MS apart on average: its execution wakes a lead
    before it is due, and an act planned before the wake must not find it past."""
    lead_ms = int(trial.runtime.parameters["LeadMilliseconds"])
    spread_ms = max(3000, tasks * RACE_SPACING_MS)
    plan = sorted(trial.plan(tasks, "race", spread_ms, LEAD_IN_MS + lead_ms), key=lambda p: p[1])
    low, high = RACE_WINDOW_MS
    answers: dict[str, tuple[str, int]] = {}

    def act(task_id: str, due_ms: int, offset_ms: int, reschedule: bool) -> None:
        time.sleep(max(0, wake_ms(task_id, due_ms) + offset_ms - clock.now_ms()) / 1000)
        if reschedule:
            new_due = clock.now_ms() + 3000
            status, _ = trial.api("PATCH", f"/tasks/{task_id}", {"due_at": clock.to_iso(new_due)})
            if status == 200:
                trial.due[f"{task_id}:2"] = new_due
        else:
            status, _ = trial.api("DELETE", f"/tasks/{task_id}")
        answers[task_id] = ("PATCH" if reschedule else "DELETE", status)

    racing = []
    for n, (task_id, due_ms) in enumerate(plan):
        assert trial.api("POST", "/tasks", trial.body(task_id, due_ms))[0] == 201
        kind = n % 2  # cancels and reschedules each get offsets across the whole window
        share = (n // 2) / max(1, (len(plan) - 1) // 2)
        offset = round(low + share * (high - low))
        racing.append(threading.Thread(target=act, args=(task_id, due_ms, offset, kind == 0)))
        racing[-1].start()
    for thread in racing:
        thread.join()
    trial.settle()
    sent = [a for a in trial.receiver.received() if 200 <= a.status < 300]
    delivered = Counter(a.task_id for a in sent)
    keys = {a.task_id: a.idempotency_key for a in sent}
    trial.notes["cancelled_never_fired"] = sum(
        answer == ("DELETE", 200) and delivered[task_id] == 0 for task_id, answer in answers.items()
    )
    trial.notes["refused_409_fired_once"] = sum(
        answer[1] == 409 and delivered[task_id] == 1 for task_id, answer in answers.items()
    )
    trial.notes["rescheduled"] = sum(answer == ("PATCH", 200) for answer in answers.values())
    trial.notes["rescheduled_fired_once_as_version_2"] = sum(
        answer == ("PATCH", 200) and delivered[task_id] == 1 and keys[task_id] == f"{task_id}:2"
        for task_id, answer in answers.items()
    )
    trial.notes["unexpected_answers"] = sum(
        answer[1] not in (200, 409) for answer in answers.values()
    )


RESTART_SPREAD_MS = 20_000


def restart(trial: Trial, tasks: int) -> None:
    """The runtime stops mid-run, with tasks fired, in their gate (RUNNING), started and
    waiting, and not yet found, then starts again on the same state.

    The stop lets invocations under way finish (as Lambda would), so the tasks then in
    their gates end SUCCEEDED; the dispatched tasks spread over RESTART_SPREAD_MS, well
    past a lead, so that many executions are still waiting to wake at the stop."""
    dispatched = trial.store(tasks - tasks // 4, "restart", spread_ms=RESTART_SPREAD_MS)
    trial.finder_until_done()
    trial.store(tasks // 4, "unfound")  # overdue by the restart: they fire at once, late
    last_due = max(trial.due[f"{task_id}:1"] for task_id in dispatched)
    while len(trial.receiver.received()) < len(dispatched) // 4 and clock.now_ms() < last_due:
        time.sleep(0.05)
    trial.restart()
    trial.finder_until_done()


DUPLICATE_CLIENTS = 5


def duplicate_submissions(trial: Trial, tasks: int) -> None:
    """Five clients submit each id with the same body at the same moment (a barrier per id),
    as five API environments would on AWS: each runs the API's submission (`submit_task`)
    at once. (Here the API's handler runs one request at a time: its HTTP resolver keeps
    the request it answers on itself.) Each answer is counted (`submissions`): one created
    per id, the others the task as stored; a conflict or an error is reported by name."""
    from tocsin.errors import Conflict
    from tocsin.submit import submit_task

    plan = trial.plan(max(1, tasks // DUPLICATE_CLIENTS), "dup")
    barriers = {task_id: threading.Barrier(DUPLICATE_CLIENTS) for task_id, _ in plan}
    answers: Counter[str] = Counter()
    created: Counter[str] = Counter()

    def client() -> None:
        for task_id, due_ms in plan:
            barriers[task_id].wait()
            try:
                submitted = submit_task(trial.body(task_id, due_ms), "chaos")
                answer = "created" if submitted.created else "as_stored"
            except Conflict:
                answer = "conflict"
            except Exception as error:  # a hole: counted, and named in the notes
                answer = f"error: {type(error).__name__}"
            with trial._lock:
                answers[answer] += 1
                created[task_id] += answer == "created"

    _together([client] * DUPLICATE_CLIENTS, "client")
    trial.extra_creations = sum(max(0, n - 1) for n in created.values())
    trial.notes["submissions"] = dict(answers)


SCENARIOS: dict[str, Callable[[Trial, int], None]] = {
    "finder-crash": finder_crash,
    "racing-finders": racing_finders,
    "throttled-starts": throttled_starts,
    "dynamodb-faults": dynamodb_faults,
    "ambiguous-writes": ambiguous_writes,
    "executor-timeouts": executor_timeouts,
    "unmarked-sends": unmarked_sends,
    "executor-faults": executor_faults,
    "webhook-faults": webhook_faults,
    "cancel-reschedule": cancel_and_reschedule_races,
    "restart": restart,
    "duplicate-submissions": duplicate_submissions,
    "lambda-kills": lambda_kills,
    "flow-limits": flow_limits,
    "outage": outage,
}
SANDBOXED = {"lambda-kills"}  # only with --lambda-limits


def _runtime(state_file: Path, receiver_url: str, lambda_limits: bool) -> EmbeddedRuntime:
    parameters = {"LogLevel": "ERROR", **allowing(receiver_url)}
    return EmbeddedRuntime(
        parameters, finder_interval_s=None, state_file=state_file, lambda_limits=lambda_limits
    )


@contextmanager
def trial(seed: int, lambda_limits: bool = False) -> Iterator[Trial]:
    # A shorter webhook timeout keeps the hanging receiver's scenario quick. A 200 that a
    # busy machine's receiver (a thread of this process) writes later than it is an
    # ambiguous failure, retried and delivered twice by design: such a repeat is counted
    # apart (`delivered_again_after_a_late_answer`), not as a duplicate.
    with (
        mock.patch.dict("os.environ", {"WEBHOOK_TIMEOUT_SECONDS": "5"}),
        WebhookReceiver(hang_s=6) as receiver,
        tempfile.TemporaryDirectory(prefix="tocsin-chaos-") as folder,
        ExitStack() as runtimes,
    ):
        state_file = Path(folder) / "state.json"
        runtime = runtimes.enter_context(_runtime(state_file, receiver.url, lambda_limits))
        world = Trial(runtime, receiver, random.Random(seed), runtimes=runtimes)
        with world.exits:
            yield world


def run_scenario(
    name: str, tasks: int, seed: int = 7, lambda_limits: bool = False
) -> dict[str, Any]:
    """Run one scenario on a fresh runtime and judge every task."""
    with trial(seed, lambda_limits) as world:
        SCENARIOS[name](world, tasks)
        world.settle()  # the tasks fire with the fault still on
        world.exits.close()  # then it is off: anything left runs as after a recovery
        world.settle()
        return {**world.judge(), **world.notes, "faults_met": dict(world.faults_met)}


def main(
    names: list[str], tasks: int, seed: int, as_json: bool, lambda_limits: bool = False
) -> int:
    """Run the scenarios one by one, with progress, then a table (or JSON, last line)."""
    import logging

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    # moto logs every failed execution with its state tree: the judge reports them instead.
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    console = Console(stderr=as_json)
    results: dict[str, dict[str, Any]] = {}
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("scenarios", total=len(names))
        for name in names:
            progress.update(bar, description=name)
            results[name] = run_scenario(name, tasks, seed, lambda_limits)
            progress.advance(bar)
    holes = sum(r[k] for r in results.values() for k in HOLES)
    if as_json:
        print(json.dumps(results))
        return 1 if holes else 0
    table = Table("scenario", *JUDGED, title="Tocsin chaos: every task judged")
    for name, result in results.items():
        table.add_row(name, *(str(result[k]) for k in JUDGED))
    console.print(table)
    for name, result in results.items():
        if "flow" in result:
            console.print(f"{name}: flow and what its receiver saw at most {result['flow']}")
        if result["faults_met"]:
            met = ", ".join(f"{fault} {n}" for fault, n in result["faults_met"].items())
            console.print(f"{name}: faults met: {met}")
        for task_id, error in result.get("unplanned_failures", {}).items():
            console.print(f"{name}: {task_id} failed, unplanned: {error}", markup=False)
        if "at_stop" in result:
            console.print(f"{name}: tasks by status at the stop {result['at_stop']}")
    for name, result in results.items():
        if "cancelled_never_fired" in result:
            console.print(
                f"{name}: {result['cancelled_never_fired']} cancelled and never fired, "
                f"{result['refused_409_fired_once']} refused with 409 and fired once, "
                f"{result['rescheduled']} rescheduled "
                f"({result['rescheduled_fired_once_as_version_2']} fired once as version 2), "
                f"{result['unexpected_answers']} other answers"
            )
        if "submissions" in result:
            answers = ", ".join(f"{answer} {n}" for answer, n in result["submissions"].items())
            console.print(f"{name}: submissions answered {answers}")
        if "delivered_again_after_a_kill" in result:
            console.print(
                f"{name}: {result['delivered_again_after_a_kill']} delivered again after their "
                "invocation was killed while it sent (at least once: docs/reliability.md); "
                f"{result.get('requeued_by_the_reconciler', 0)} requeued by the reconciler"
            )
    console.print(
        "no task duplicated, early, lost or failed unexpectedly"
        if not holes
        else f"{holes} problems"
    )
    return 1 if holes else 0


def _but_last(arrivals: list[Arrival]) -> list[Arrival]:
    """Every arrival of a key but its last to arrive."""
    return sorted(arrivals, key=lambda arrival: arrival.arrival_ms)[:-1]


def _unanswered_within(arrival: Arrival, limit_ms: float) -> bool:
    """Whether its answer was not written within `limit_ms` of its arrival (or not at all):
    its sender had none to go on."""
    return not arrival.answered_ms or arrival.answered_ms - arrival.arrival_ms > limit_ms
