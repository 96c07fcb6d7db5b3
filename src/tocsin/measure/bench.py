"""`tocsin bench`: precision and throughput on the embedded runtime, the baseline beside it.

Timing scenarios run the same task plan twice, one variant after the other in the same
run, each on a fresh runtime with a webhook receiver on 127.0.0.1:

* tocsin: tasks submitted through the API handler; the finder or the submit starts them;
  the execution wakes by the lead and the executor's gate picks the millisecond;
* baseline: the same state machine, each task a batch of its own whose Wait is on the due
  second itself and whose executor gets `due_ms` 0, so no lead and no gate: what a plain
  Step Functions timer gives.

Lateness is measured where the webhook arrives, by a receiver in a process of its own (on
AWS it is another machine: here it must not wait for the scheduler's GIL). The finder
scenarios replace StartExecution with a recorder (a token bucket in `throttled`): they
measure the finder's reads and pacing, not the executions.
"""

import functools
import json
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from unittest import mock

from botocore.awsrequest import AWSPreparedRequest, AWSResponse

from tocsin import aws, clock
from tocsin.dispatch import Batch, DueTask, attempt_limit_s, execution_arn, execution_input
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.sandbox import MB_PER_CORE
from tocsin.local.server import api_event
from tocsin.measure import most_within, placed_long_ago
from tocsin.measure.console_load import console_load
from tocsin.measure.cost import Pricing, Used, billed_usage, idle_finder_run, transitions
from tocsin.measure.demo import (
    PlannedTask,
    lateness_values,
    percentile,
    progress_bars,
    summarize,
)
from tocsin.measure.lambda_bench import lambda_limits
from tocsin.measure.receiver import ReceiverProcess, allowing, delivered
from tocsin.measure.scenario import Bench, write_items
from tocsin.model import TaskType
from tocsin.retry import SHORT_PAUSE_S
from tocsin.settings import Settings, settings

LOOKAHEAD_S = 20
FINDER_INTERVAL_S = 5.0
# Per task, so the first is due after all are submitted (an API call, or a batch write).
SUBMIT_ALLOWANCE_MS = {"tocsin": 60, "baseline": 60, "tocsin-stored": 2, "tocsin-stored-10k": 4}
PAD_10K = 10 * 1024 - 40  # with the rest of its payload, 10 KiB of JSON
START_DELAY_MS = 3000
GRACE_S = 20.0
BASELINE_MAX = 1000  # tasks the baseline runs of one plan (a random sample beyond that)


# -- timing: tocsin and the baseline on the same plan ------------------------------------


def baseline_input(task: DueTask, config: Any) -> dict[str, Any]:
    """A lone task's execution input with its wake on the due second and due_ms 0."""
    given = execution_input(Batch((task,)), config)
    plain_tasks = [{**entry, "due_ms": 0} for entry in given["tasks"]]
    return given | {"wake_at": clock.to_iso_second(task.due_ms), "tasks": plain_tasks}


def _body(task: PlannedTask, url: str, pad: int = 0, **fields: Any) -> dict[str, Any]:
    """A webhook task's submission, with the other `fields` given (a flow, a retry)."""
    return {
        "id": task.task_id,
        "due_at": clock.to_iso(task.due_ms),
        "type": "webhook",
        "target": {"url": f"{url}/bench"},
        "payload": {"task": task.task_id, **({"pad": "x" * pad} if pad else {})},
        **fields,
    }


def _submit_tocsin(
    runtime: EmbeddedRuntime, planned: list[PlannedTask], url: str, **fields: Any
) -> None:
    """Through the API handler, as a caller would: due soon starts at once, later the finder."""
    for task in planned:
        body = json.dumps(_body(task, url, **fields))
        reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", body))
        if reply["statusCode"] != 201:
            raise RuntimeError(f"submit {task.task_id}: {reply['body']}")


def _store_for_finder(
    runtime: EmbeddedRuntime,
    planned: list[PlannedTask],
    url: str,
    pad: int = 0,
    **fields: Any,
) -> None:
    """Written PENDING ahead of time, as submissions long before their due time leave them:
    the finder finds them within its look-ahead and packs each window's into one batch."""
    from tocsin.submit import new_item

    config, now = settings(), clock.now_ms()
    write_items(
        placed_long_ago(new_item(_body(task, url, pad, **fields), "bench", now, config))
        for task in planned
    )


def _start_baseline(runtime: EmbeddedRuntime, planned: list[PlannedTask], url: str) -> None:
    """Items out of the dispatch index, each with an execution of the baseline."""
    from tocsin.submit import new_item

    sfn, config = aws.client("stepfunctions"), settings()
    table = aws.resource("dynamodb").Table(config.tasks_table)
    for task in planned:
        item = new_item(_body(task, url), "bench", clock.now_ms(), config)
        for key in ("gsi_pk", "gsi_due_ms", "placed_ms"):
            item.pop(key)
        table.put_item(Item=item)
        due = DueTask(task.due_ms, task.task_id, 1, TaskType.WEBHOOK)
        sfn.start_execution(
            stateMachineArn=runtime.state_machine_arn,
            name=Batch((due,)).execution_name,
            input=json.dumps(baseline_input(due, config)),
        )


VARIANTS: dict[str, Callable[[EmbeddedRuntime, list[PlannedTask], str], None]] = {
    "tocsin": _submit_tocsin,
    "tocsin-stored": _store_for_finder,
    "tocsin-stored-10k": functools.partial(_store_for_finder, pad=PAD_10K),
    "baseline": _start_baseline,
}


Plan = Callable[[EmbeddedRuntime, str], tuple[list[PlannedTask], float]]


def timed_run(
    bench: Bench,
    label: str,
    plan: Plan,
    cost: Pricing | None,
    answer_after_ms: int = 0,
    observe: Callable[[ReceiverProcess], dict[str, Any]] | None = None,
    drain_s: float = 0,
    refuse_first: int = 0,
    parameters: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[int], list[Any]]:
    """On a fresh runtime (with the template `parameters` given) and a receiver (that
    answers `answer_after_ms` after each request arrives, and 503 to each task's first
    `refuse_first`): `plan` submits what is to fire (returning the tasks it expects and
    the seconds it took); then the figures of what was delivered (with what `observe` reads
    of the receiver and the runtime's tables once all fired), the lateness values and the
    deliveries. The tasks may take `drain_s` past the last one's due time (a flow's, a
    retry's), and GRACE_S more, to arrive."""
    started = time.monotonic()
    given = {"LookAheadSeconds": str(LOOKAHEAD_S), **(parameters or {})}
    with (
        ReceiverProcess(answer_after_ms=answer_after_ms, refuse_first=refuse_first) as receiver,
        bench.runtime(
            given | allowing(receiver.url), finder_interval_s=FINDER_INTERVAL_S
        ) as runtime,
    ):
        idle = idle_finder_run(runtime) if cost else None
        before = runtime.footprint()  # the stack is up: from here on, the tasks' own work
        usage_before, planning = Counter(runtime.usage), time.monotonic()
        planned, submit_s = plan(runtime, receiver.url)
        bar = bench.progress.add_task(label, total=len(planned))
        due_s = (planned[-1].due_ms - clock.now_ms()) / 1000
        deadline = time.monotonic() + due_s + drain_s + GRACE_S
        while time.monotonic() < deadline:
            fired = receiver.tasks_arrived()
            bench.progress.update(bar, completed=fired)
            if fired >= len(planned):
                break
            time.sleep(1)
        runtime.wait_for_executions(timeout_s=10)
        after = runtime.footprint()
        cpu_s = after["cpu_s"] - before["cpu_s"]
        dynamodb_cpu_s = after["dynamodb_cpu_s"] - before["dynamodb_cpu_s"]
        requests = after["dynamodb_requests"] - before["dynamodb_requests"]
        write_units = after["dynamodb_write_units"] - before["dynamodb_write_units"]
        every = receiver.received()
        arrivals = [a for a in every if delivered(a)]
        figures = summarize(planned, arrivals)
        executions = list(runtime.executions())
        steps = sum(transitions(e.execution_arn) for e in executions)
        figures.update(
            executions=len(executions),
            transitions_per_task=round(steps / len(planned), 3),
            submit_s=round(submit_s, 1),
            refused=len(every) - len(arrivals),
            **(observe(receiver) if observe else {}),
        )
        if cost and idle:
            used = Used(
                runtime.usage - usage_before, requests, write_units, time.monotonic() - planning
            )
            figures["cost"] = billed_usage(runtime, executions, used, len(planned), cost, idle)
    bench.progress.remove_task(bar)
    lateness = lateness_values(planned, arrivals)
    figures.update(
        abs_error_ms={"p99": percentile([abs(v) for v in lateness], 99)},
        wall_s=round(time.monotonic() - started, 1),
        cpu_ms_per_task=round(cpu_s * 1000 / len(planned), 1),
        cpu_ms_per_task_by_process={
            "runtime": round((cpu_s - dynamodb_cpu_s) * 1000 / len(planned), 1),
            "dynamodb": round(dynamodb_cpu_s * 1000 / len(planned), 1),
        },
        peak_memory_mb=runtime.footprint()["peak_memory_mb"],
    )
    return figures, lateness, arrivals


def _planned(prefix: str, offsets: list[int], variant: str) -> list[PlannedTask]:
    """Tasks due at `offsets` from the first whole second after the variant could submit
    them all (its allowance a task): offsets in distinct seconds stay apart."""
    start = clock.now_ms() + START_DELAY_MS + SUBMIT_ALLOWANCE_MS[variant] * len(offsets)
    start += 1000 - start % 1000
    return [PlannedTask(f"{prefix}-{i:05d}", start + o) for i, o in enumerate(offsets)]


def timed_variant(
    bench: Bench, variant: str, offsets: list[int], label: str
) -> tuple[dict[str, Any], list[int]]:
    """Run one variant on a fresh runtime; its figures and its lateness values."""

    def plan(runtime: EmbeddedRuntime, url: str) -> tuple[list[PlannedTask], float]:
        planned, submitting = _planned(variant, offsets, variant), time.monotonic()
        VARIANTS[variant](runtime, planned, url)
        return planned, time.monotonic() - submitting

    cost = bench.cost if variant != "baseline" else None
    figures, lateness, _ = timed_run(bench, f"{label} {variant}", plan, cost)
    return figures, lateness


def side_by_side(bench: Bench, label: str, offsets: list[int]) -> dict[str, Any]:
    """The same plan through tocsin, then through the baseline; tocsin's figures with the
    baseline's beside them and the ratio of their p99 absolute errors. A plan larger than
    BASELINE_MAX runs through the baseline as a random sample of that many of its tasks:
    one thread per waiting execution in moto's interpreter outruns any sensible run
    beyond that (5,000 did not finish in 30 minutes)."""
    tocsin, tocsin_lateness = timed_variant(bench, "tocsin", offsets, label)
    sample = offsets
    if len(offsets) > BASELINE_MAX:
        sample = sorted(bench.rng.sample(offsets, BASELINE_MAX))
    baseline, baseline_lateness = timed_variant(bench, "baseline", sample, label)
    tocsin_error = max(1, tocsin["abs_error_ms"]["p99"])
    return {
        **tocsin,
        "baseline": baseline | {"sample_of": len(offsets)},
        "baseline_to_tocsin_p99_error": round(baseline["abs_error_ms"]["p99"] / tocsin_error, 1),
        "samples": {"tocsin": tocsin_lateness, "baseline": baseline_lateness},
    }


def spread(bench: Bench) -> dict[str, Any]:
    """1,000 tasks at random milliseconds over 60 s."""
    tasks, span_ms = bench.size(1000), max(10_000, round(60_000 * min(1.0, bench.scale * 4)))
    offsets = sorted(bench.rng.randrange(span_ms) for _ in range(tasks))
    return side_by_side(bench, "spread", offsets)


def burst(bench: Bench, full: int = 200) -> dict[str, Any]:
    """`full` tasks due within one second, beyond the look-ahead: the finder starts them
    together, so their wakes are staggered ahead of the due second."""
    tasks = bench.size(full)
    past_look_ahead = int((LOOKAHEAD_S + 2 * FINDER_INTERVAL_S) * 1000)
    offsets = sorted(past_look_ahead + bench.rng.randrange(1000) for _ in range(tasks))
    return side_by_side(bench, "burst", offsets)


def sparse(bench: Bench) -> dict[str, Any]:
    """100 tasks over 100 s, each in a second of its own: every batch holds one task, the
    cost floor per task."""
    tasks = bench.size(100)
    offsets = [i * 1000 + bench.rng.randrange(1000) for i in range(tasks)]
    return side_by_side(bench, "sparse", offsets)


def dense(bench: Bench, variant: str = "tocsin-stored") -> dict[str, Any]:
    """6,000 tasks over 60 s (100 a second) at random milliseconds, written ahead for the
    finder, which packs each second's into one execution. Tocsin alone: the baseline's
    6,000 executions would swamp moto's interpreter (12-25 ms of CPU each)."""
    tasks = bench.size(6000)
    span_ms = max(10_000, round(60_000 * min(1.0, bench.scale * 10)))
    offsets = sorted(bench.rng.randrange(span_ms) for _ in range(tasks))
    figures, lateness = timed_variant(bench, variant, offsets, "dense")
    return {**figures, "samples": {"tocsin": lateness}}


def recurring(bench: Bench) -> dict[str, Any]:
    """100 schedules at rate(1 seconds) to rate(10 seconds) for 60 s, each from its own
    millisecond, created through the API beyond the look-ahead: the finder turns their
    occurrences into tasks and packs each second's into one execution. Every occurrence
    the expressions give is expected once, and none other."""
    count, span_ms = bench.size(100), max(10_000, round(60_000 * min(1.0, bench.scale * 4)))

    def plan(runtime: EmbeddedRuntime, url: str) -> tuple[list[PlannedTask], float]:
        base = clock.now_ms() + int((LOOKAHEAD_S + 2 * FINDER_INTERVAL_S) * 1000)
        base += 1000 - base % 1000
        planned, submitting = [], time.monotonic()
        for n in range(count):
            every_s, start = 1 + n % 10, base + bench.rng.randrange(1000)
            schedule_id = f"every{every_s}s-{n:03d}"
            body = {
                "id": schedule_id,
                "expression": f"rate({every_s} seconds)",
                "start_at": clock.to_iso(start),
                "end_at": clock.to_iso(base + span_ms),
                "type": "webhook",
                "target": {"url": f"{url}/bench"},
            }
            reply = runtime.invoke("ApiFunction", api_event("POST", "/schedules", json.dumps(body)))
            if reply["statusCode"] != 201:
                raise RuntimeError(f"schedule {schedule_id}: {reply['body']}")
            due = range(start, base + span_ms, every_s * 1000)
            planned += [PlannedTask(f"{schedule_id}.{ms}", ms) for ms in due]
        return sorted(planned, key=lambda task: task.due_ms), time.monotonic() - submitting

    figures, lateness, arrivals = timed_run(bench, "recurring", plan, bench.cost)
    arrived = {a.task_id for a in arrivals}  # the planned ones arrived are `fired`
    figures.update(schedules=count, unexpected=len(arrived) - figures["fired"])
    return {**figures, "samples": {"tocsin": lateness}}


FLOW_ANSWER_MS = 10  # the receiver's answer time: at 500 a second, 5 in flight on average
# How many times its ideal a flow's drain may take before what has not arrived is lost: on
# two cores the embedded runtime sends about 100 tasks a second, a fifth of the rate.
FLOW_DRAIN_ALLOWANCE = 20
# What the flow scenario reports of its tasks sent again with no flow
PLAIN_FIGURES = ("fired", "cpu_ms_per_task", "cpu_ms_per_task_by_process", "executions", "wall_s")


def flow(bench: Bench) -> dict[str, Any]:
    """5,000 tasks due within one second at one receiver, their flow at most 500 a second
    and 10 in flight (a smaller scale scales the rate with the tasks: the ideal drain stays
    10 s): written ahead for the finder, which packs them into batches whose invocations
    share the flow's ledger and leases. What the receiver saw (the most in flight at once,
    the most in any second), the drain against its ideal (tasks / rate), and how long flow
    control held each task. Then the same tasks with no flow, on a fresh runtime: what a
    plain task costs beside a flow's (`cpu_vs_plain`)."""
    tasks = bench.size(5000)
    limits = {"key": "bench-receiver", "rate": max(1, round(500 * tasks / 5000)), "parallelism": 10}
    offsets = sorted(bench.rng.randrange(1000) for _ in range(tasks))

    def plan_with(**fields: Any) -> Plan:
        def plan(runtime: EmbeddedRuntime, url: str) -> tuple[list[PlannedTask], float]:
            planned, submitting = _planned("flow", offsets, "tocsin-stored"), time.monotonic()
            _store_for_finder(runtime, planned, url, **fields)
            return planned, time.monotonic() - submitting

        return plan

    def observe(receiver: ReceiverProcess) -> dict[str, Any]:
        table = aws.resource("dynamodb").Table(settings().tasks_table)
        held = sorted(int(item["held_ms"]) for item in _scanned(table, "held_ms"))
        # when each send was written, as its executor stamped it (`fired_at`): the rate is
        # judged there. The receiver, on the same loaded machine, stamps what a CPU it
        # waits for lets it read, and once counted 11 in a second at a rate of 10 (make
        # test's seven groups at once); on AWS the network's jitter is the allowance.
        written = [
            clock.to_ms(datetime.fromisoformat(item["fired_at"]))
            for item in _scanned(table, "fired_at")
        ]
        return {
            "max_per_second": most_within(sorted(written), 1000),
            "max_in_flight": receiver.most_in_flight(),
            "held_ms": {q: percentile(held, n) for q, n in (("p50", 50), ("p99", 99))}
            | {"max": max(held, default=0)},
        }

    ideal_s = tasks / limits["rate"]
    figures, lateness, arrivals = timed_run(
        bench,
        "flow",
        plan_with(flow=limits),
        bench.cost,
        answer_after_ms=FLOW_ANSWER_MS,
        observe=observe,
        drain_s=FLOW_DRAIN_ALLOWANCE * ideal_s,
    )
    plain, _, _ = timed_run(bench, "flow: no flow", plan_with(), None, FLOW_ANSWER_MS)
    ours = sorted(a.arrival_ms for a in arrivals if a.task_id.startswith("flow-"))
    figures.update(
        max_per_second_at_receiver=most_within(ours, 1000),
        over_rate=max(0, figures["max_per_second"] - limits["rate"]),
        over_parallelism=max(0, figures["max_in_flight"] - limits["parallelism"]),
        drain_s=round((ours[-1] - ours[0]) / 1000 if ours else 0.0, 2),
        ideal_drain_s=round(ideal_s, 2),
        flow=limits,
        plain={key: plain[key] for key in PLAIN_FIGURES},
        cpu_vs_plain=round(figures["cpu_ms_per_task"] / max(0.1, plain["cpu_ms_per_task"]), 2),
    )
    return {**figures, "samples": {"tocsin": lateness}}


# How each run of `retried` retries the attempt its receiver refuses: not at all (nothing
# refused), within the invocation (a pause of up to SHORT_PAUSE_S), or through the dispatch
# index (RETRYING: a pause past it, and an execution of its own).
RETRY_WAYS: dict[str, dict[str, Any] | None] = {
    "answered": None,
    "in the invocation": {"min_backoff_s": 0.5, "max_backoff_s": 1},
    "through the index": {"min_backoff_s": 2 * SHORT_PAUSE_S, "max_backoff_s": 2 * SHORT_PAUSE_S},
}


def retried(bench: Bench) -> dict[str, Any]:
    """Sparse's plan (100 tasks over 100 s, each in a second of its own, submitted through
    the API) run once for each of RETRY_WAYS, side by side: answered at first, or refused
    once (503) and retried within the invocation or through the dispatch index. What an
    attempt costs is what a task refused once costs more than one answered at first. No
    host is held back (HostHoldFailures 0): the hold, which a host refusing every first
    attempt would meet, is priced apart (docs/reliability.md)."""
    offsets = [i * 1000 + bench.rng.randrange(1000) for i in range(bench.size(100))]
    runs = {}
    for way, retry in RETRY_WAYS.items():
        fields = {"retry": {"max_attempts": 3, **retry}} if retry else {}
        figures, _, _ = timed_run(
            bench,
            f"retried, {way}",
            functools.partial(_retried_plan, offsets, fields),
            bench.cost,
            drain_s=2.5 * SHORT_PAUSE_S if retry else 0,
            refuse_first=1 if retry else 0,
            parameters={"HostHoldFailures": "0"},
        )
        runs[way] = figures
    return {
        **{key: sum(f[key] for f in runs.values()) for key in ("early", "duplicates", "lost")},
        "by_way": runs,
        **({"per_attempt": per_attempt(runs)} if bench.cost else {}),
    }


def _retried_plan(
    offsets: list[int], fields: dict[str, Any], runtime: EmbeddedRuntime, url: str
) -> tuple[list[PlannedTask], float]:
    planned, submitting = _planned("retried", offsets, "tocsin"), time.monotonic()
    _submit_tocsin(runtime, planned, url, **fields)
    return planned, time.monotonic() - submitting


def per_attempt(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each retried way's cost over the answered run's, per attempt refused: in billed units
    a task, and in dollars a million."""
    plain = runs["answered"]["cost"]
    priced = {}
    for way, figures in runs.items():
        refused_per_task = figures["refused"] / max(1, figures["submitted"])
        if way == "answered" or not refused_per_task:
            continue
        cost = figures["cost"]
        more = {
            unit: (cost["per_task"][unit] - plain["per_task"][unit]) / refused_per_task
            for unit in cost["per_task"]
        }
        total = cost["usd_per_million_total"] - plain["usd_per_million_total"]
        priced[way] = {unit: round(value, 3) for unit, value in more.items()} | {
            "usd_per_million": round(total / refused_per_task, 2)
        }
    return priced


def _scanned(table: Any, attribute: str) -> Iterator[dict[str, Any]]:
    """Every item of `table` that holds `attribute`, that attribute only."""
    query: dict[str, Any] = {
        "ProjectionExpression": "#a",
        "FilterExpression": "attribute_exists(#a)",
        "ExpressionAttributeNames": {"#a": attribute},
    }
    while True:
        page = table.scan(**query)
        yield from page.get("Items", [])
        if "LastEvaluatedKey" not in page:
            return
        query["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# -- the finder: reads and pacing --------------------------------------------------------


@dataclass
class StartRecorder:
    """StartExecution's stand-in: records each start; with `burst` and `rate`, refuses with
    ThrottlingException beyond a token bucket, as AWS's StartExecution quota does."""

    burst: float = math.inf
    rate: float = math.inf
    starts: dict[str, float] = field(default_factory=dict)  # name -> time.monotonic()
    wakes: dict[str, str] = field(default_factory=dict)  # name -> the input's wake_at
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> its execution's name
    throttled: int = 0
    _tokens: float = math.inf
    _at: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tokens = self.burst

    def take(self, name: str, given: str) -> bool:
        """Record a start of `name` with input `given`, if the bucket has a token for it."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                self.throttled += 1
                return False
            self._tokens -= 1
            self.starts.setdefault(name, now)
            batch = json.loads(given)
            self.wakes.setdefault(name, batch["wake_at"])
            for task in batch["tasks"]:
                self.tasks.setdefault(task["task_id"], name)
        return True

    def answer(self, request: AWSPreparedRequest) -> AWSResponse:
        """The service's answer to a StartExecution request, made without moto: on AWS,
        Step Functions' work is elsewhere, and no part of the finder's cost."""
        asked = json.loads(request.body or b"{}")
        if not self.take(asked["name"], asked["input"]):
            return _json_response(request.url, 400, {"__type": "ThrottlingException"})
        arn = execution_arn(asked["stateMachineArn"], asked["name"])
        return _json_response(request.url, 200, {"executionArn": arn, "startDate": time.time()})


def _json_response(url: str, status: int, body: dict[str, Any]) -> AWSResponse:
    from moto.core.botocore_stubber import MockRawResponse  # the body moto's stub answers with

    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": "bench"}
    return AWSResponse(url, status, headers, MockRawResponse(json.dumps(body)))


START_EXECUTION = "before-send.sfn.StartExecution"


@contextmanager
def recording_starts(recorder: StartRecorder) -> Iterator[StartRecorder]:
    """StartExecution answered by `recorder` where moto's stub meets the request (botocore
    calls every `before-send` hook, so ours cannot simply come first)."""
    from moto.core.botocore_stubber import BotocoreStubber

    stub = BotocoreStubber.__call__

    def answered(stubber: Any, event_name: str, request: Any, **kwargs: Any) -> Any:
        if event_name == START_EXECUTION:
            return recorder.answer(request)
        return stub(stubber, event_name, request, **kwargs)

    with mock.patch.object(BotocoreStubber, "__call__", answered):
        yield recorder


def _store_tasks(bench: Bench, label: str, due_times: list[int]) -> list[str]:
    """PENDING tasks written in batches, as submissions leave them; their ids."""
    from tocsin.submit import new_item

    config, now = settings(), clock.now_ms()
    bar = bench.progress.add_task(f"{label} storing", total=len(due_times))
    ids = [f"{label}-{i:06d}" for i in range(len(due_times))]

    def items() -> Iterator[dict[str, Any]]:
        for i, (task_id, due_ms) in enumerate(zip(ids, due_times, strict=True)):
            body = {
                "id": task_id,
                "due_at": clock.to_iso(due_ms),
                "type": "sns",
                "target": {"topic_arn": "arn:aws:sns:us-east-1:123456789012:bench"},
            }
            yield placed_long_ago(new_item(body, "bench", now, config))
            if i % 500 == 0:
                bench.progress.update(bar, completed=i)

    write_items(items())
    bench.progress.remove_task(bar)
    return ids


def finder_scale(bench: Bench) -> dict[str, Any]:
    """100,000 tasks due over 30 days and 1,000 due within the look-ahead: one finder run
    must start exactly the due ones, reading about as many items as are due."""
    stored, due_now = bench.size(100_000), bench.size(1000)
    with bench.runtime({"LookAheadSeconds": "60"}) as runtime:
        now = clock.now_ms()
        later = [now + 3_600_000 + bench.rng.randrange(30 * 86_400_000) for _ in range(stored)]
        soon = [now + 5000 + bench.rng.randrange(50_000) for _ in range(due_now)]
        _store_tasks(bench, "later", later)
        due_ids = set(_store_tasks(bench, "due", soon))
        read = Counter[str]()
        client = aws.resource("dynamodb").meta.client

        def count(parsed: dict[str, Any], **_: Any) -> None:
            read["items"] += parsed.get("ScannedCount", 0)
            read["queries"] += 1

        client.meta.events.register("after-call.dynamodb.Query", count)
        started = time.monotonic()
        with recording_starts(StartRecorder()) as recorder:
            report = runtime.run_finder()
        seconds = time.monotonic() - started
        client.meta.events.unregister("after-call.dynamodb.Query", count)
    names = set(recorder.tasks)
    return {
        "stored": stored + due_now,
        "due": due_now,
        "found": report["found"],
        "started": len(names),
        "executions": len(recorder.starts),
        "started_not_due": len(names - due_ids),
        "due_not_started": len(due_ids - names),
        "items_read": read["items"],
        "queries": read["queries"],
        "read_per_due": round(read["items"] / due_now, 3),
        "finder_run_s": round(seconds, 2),
        "peak_memory_mb": runtime.footprint()["peak_memory_mb"],
    }


BUCKET_BURST, BUCKET_RATE = 1300, 300  # AWS's StartExecution quota in the largest regions
# Storing the tasks takes about 0.5-1.1 ms each here (10,000 took 10.8 s on a slow day), and
# ate into the scenario's margin before the finder ran at all.
STORE_ALLOWANCE_MS = 2


def throttled(bench: Bench) -> dict[str, Any]:
    """10,000 tasks due within one look-ahead, each in an execution of its own (BatchSize 1:
    the most starts they can need), started by the real finder against a token bucket of
    1,300 and 300/s: every start before its wake time, at the refill rate."""
    tasks = bench.size(10_000)
    burst_size, rate = BUCKET_BURST * tasks / 10_000, BUCKET_RATE * tasks / 10_000
    # The finder's threads scaled with the bucket: at --scale 0.01, sixteen threads against
    # 3 starts a second spent their retries on each other, and a run that meets a throttle
    # past its retries starts no more (0.55 of the refill, some starts late on a busy machine).
    workers = math.ceil(Settings.model_fields["dispatch_workers"].default * tasks / 10_000)
    # AWS's defaults for the lead and the wakes per second: no execution runs here, so the
    # embedded runtime's longer local lead has nothing to absorb.
    parameters = {
        "LookAheadSeconds": "60",
        "LeadMilliseconds": "2000",
        "WakesPerSecond": "300",
        "BatchSize": "1",
    }
    with (
        mock.patch.dict(os.environ, {"DISPATCH_WORKERS": str(workers)}),
        bench.runtime(parameters) as runtime,
    ):
        # Due 35-59 s after the first finder run, not after the bench began storing them:
        # the run reads whole batch windows, so its reach ends at its last whole second.
        first_run_ms = clock.now_ms() + tasks * STORE_ALLOWANCE_MS
        due = sorted(first_run_ms + 35_000 + bench.rng.randrange(24_000) for _ in range(tasks))
        _store_tasks(bench, "throttled", due)
        time.sleep(max(0.0, first_run_ms - clock.now_ms()) / 1000)
        bar = bench.progress.add_task("throttled starts", total=tasks)
        runs = 0
        with recording_starts(StartRecorder(burst_size, rate)) as recorder:
            epoch = time.monotonic() - clock.now_ms() / 1000  # monotonic -> epoch ms
            while clock.now_ms() < due[-1]:  # back to back, for as many runs as it takes
                runs += 1
                report = runtime.run_finder()
                bench.progress.update(bar, completed=len(recorder.tasks))
                if report["backlog"] == 0:
                    break
        bench.progress.remove_task(bar)
    late = [
        name
        for name, at in recorder.starts.items()
        if (at - epoch) * 1000 > clock.to_ms(datetime.fromisoformat(recorder.wakes[name]))
    ]
    times = sorted(recorder.starts.values())
    after_burst = len(times) - burst_size
    # With no start beyond the burst, the bucket never held the finder back: no rate to report.
    achieved = after_burst / (times[-1] - times[0]) if after_burst > 0 else None
    return {
        "tasks": tasks,
        "started": len(recorder.tasks),
        "not_started": tasks - len(recorder.tasks),
        "started_after_wake": len(late),
        "throttled_calls": recorder.throttled,
        "finder_runs": runs,
        "bucket": {"burst": burst_size, "refill_per_s": rate},
        "finder_threads": workers,
        "start_rate_per_s": None if achieved is None else round(achieved, 1),
        "start_rate_of_refill": None if achieved is None else round(achieved / rate, 3),
        "peak_memory_mb": runtime.footprint()["peak_memory_mb"],
    }


def aws_burst(bench: Bench) -> dict[str, Any]:
    """50,000 tasks due within one second, dispatched by the real finder with AWS's
    defaults, against StartExecution's quota; what the executions would then need, judged
    against AWS's other quotas (see tocsin.measure.aws_burst). No execution runs."""
    from tocsin.measure.aws_burst import START_QUOTA, StartedBatch, judge

    tasks = bench.size(50_000)
    parameters = {"LookAheadSeconds": "180", "LeadMilliseconds": "2000", "WakesPerSecond": "300"}
    with bench.runtime(parameters) as runtime:
        config = settings()
        # A minute after the finder's run, as a run a minute or more ahead finds a burst.
        due_second = (clock.now_ms() + tasks * STORE_ALLOWANCE_MS) // 1000 + 60
        due = sorted(due_second * 1000 + bench.rng.randrange(1000) for _ in range(tasks))
        ids = _store_tasks(bench, "aws-burst", due)
        due_of = dict(zip(ids, due, strict=True))
        bar = bench.progress.add_task("aws-burst finder", total=None)
        with recording_starts(StartRecorder(*START_QUOTA)) as recorder:
            epoch = clock.now_ms() / 1000 - time.monotonic()  # monotonic -> epoch seconds
            began = time.monotonic()
            report = runtime.run_finder()
            run_s = time.monotonic() - began
        bench.progress.remove_task(bar)
    members: dict[str, list[int]] = {}
    for task_id, name in recorder.tasks.items():
        members.setdefault(name, []).append(due_of[task_id])
    started = [
        StartedBatch(
            started_s=recorder.starts[name] + epoch,
            wake_s=clock.to_ms(datetime.fromisoformat(recorder.wakes[name])) / 1000,
            first_due_s=min(dues) / 1000,
            last_due_s=max(dues) / 1000,
            tasks=len(dues),
            attempt_s=attempt_limit_s(TaskType.SNS, config),
        )
        for name, dues in members.items()
    ]
    figures = judge(started, config.concurrency_budget, config.claims_per_second)
    return {
        **figures,
        "not_started": tasks - len(recorder.tasks),
        "throttled_starts": recorder.throttled,
        "finder_found": report["found"],
        "finder_run_s": round(run_s, 2),
    }


def cold_start(bench: Bench, rounds: int = 7) -> dict[str, Any]:
    """Each function's init CPU beside a bare boto3 handler's (see tocsin.measure.cold_start)."""
    from tocsin.measure import cold_start as init

    inits = rounds * (1 + len(init.function_folders()))
    task = bench.progress.add_task("cold start", total=inits)
    return init.measure(rounds, lambda done: bench.progress.advance(task, done))


SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "sparse": sparse,
    "spread": spread,
    "dense": dense,
    "burst": burst,
    "recurring": recurring,
    "flow": flow,
    "retried": retried,
    "finder-scale": finder_scale,
    "throttled": throttled,
    "cold-start": cold_start,
}
STRETCH = {  # by name only: not in "all"
    "dense-10k": lambda bench: dense(bench, "tocsin-stored-10k"),  # dense, 10 KiB payloads
    "burst-1000": lambda bench: burst(bench, 1000),
    "burst-5000": lambda bench: burst(bench, 5000),
    "aws-burst": aws_burst,
    "console": console_load,  # needs Chromium
    "lambda": lambda_limits,  # in Lambda-sized sandboxes: needs writable cgroups (root)
}


# -- the report ------------------------------------------------------------------------

TIMED = (
    "sparse",
    "spread",
    "dense",
    "dense-10k",
    "burst",
    "recurring",
    "flow",
    "burst-1000",
    "burst-5000",
)
RESULT_KEY = {"cold-start": "cold_start"}  # the scenarios whose results go by another name


def run(
    names: list[str],
    scale: float,
    seed: int,
    cost: Pricing | None,
    console: Any,
    tables: str = "moto",
    lambda_limits: bool = False,
    parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Each named scenario in turn, with progress bars; their figures by name."""
    with progress_bars(console, label_width=22, transient=True) as progress:
        bench = Bench(
            progress, random.Random(seed), scale, cost, tables, lambda_limits, parameters or {}
        )
        overall = progress.add_task("scenarios", total=len(names))
        results = {}
        for name in names:
            results[RESULT_KEY.get(name, name)] = {**SCENARIOS, **STRETCH}[name](bench)
            progress.advance(overall)
    return results


# Figures that break a promise when not zero, by scenario.
MUST_BE_ZERO = {
    **{name: ("early", "duplicates", "lost") for name in TIMED},
    "recurring": ("early", "duplicates", "lost", "unexpected"),
    "flow": ("early", "duplicates", "lost", "over_rate", "over_parallelism"),
    "retried": ("early", "duplicates", "lost"),
    "finder-scale": ("started_not_due", "due_not_started"),
    "throttled": ("not_started", "started_after_wake"),
    "aws-burst": ("not_started",),
    "lambda": ("early", "duplicates", "lost"),
}


def problems(results: dict[str, Any]) -> list[str]:
    """What broke a promise: tocsin early, duplicated or lost; a finder that missed."""
    return [
        f"{name}: {key} {figures[key]}"
        for name, figures in results.items()
        for key in MUST_BE_ZERO.get(name, ())
        if figures[key]
    ]


TIMING_ROWS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("tasks", lambda f: f["submitted"]),
    ("fired", lambda f: f["fired"]),
    ("early", lambda f: f["early"]),
    ("duplicates", lambda f: f["duplicates"]),
    ("lost", lambda f: f["lost"]),
    ("lateness p50", lambda f: f["lateness_ms"]["p50"]),
    ("lateness p90", lambda f: f["lateness_ms"]["p90"]),
    ("lateness p99", lambda f: f["lateness_ms"]["p99"]),
    ("lateness max", lambda f: f["lateness_ms"]["max"]),
    ("|error| p99", lambda f: f["abs_error_ms"]["p99"]),
    ("executions", lambda f: f["executions"]),
    ("transitions per task", lambda f: f["transitions_per_task"]),
    ("submit s", lambda f: f["submit_s"]),
    ("wall s", lambda f: f["wall_s"]),
    ("CPU ms per task", lambda f: f["cpu_ms_per_task"]),
    (
        "  runtime / DynamoDB",
        lambda f: "{runtime} / {dynamodb}".format(**f["cpu_ms_per_task_by_process"]),
    ),
    ("peak memory MiB", lambda f: f["peak_memory_mb"]),
]


def print_report(results: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    timed = {name: r for name, r in results.items() if name in TIMED}
    if timed:
        columns = [(name, "tocsin", r) for name, r in timed.items()]
        columns += [
            (name, "baseline", r["baseline"]) for name, r in timed.items() if "baseline" in r
        ]
        table = Table(
            "measure",
            *(f"{name}\n{variant}" for name, variant, _ in columns),
            title="Lateness where the webhook arrives, ms: the same plan through both variants",
        )
        for label, read in TIMING_ROWS:
            table.add_row(label, *(str(read(figures)) for _, _, figures in columns))
        console.print(table)
        for name, figures in timed.items():
            capacity = 1000 / max(0.1, figures["cpu_ms_per_task"])
            ratio = figures.get("baseline_to_tocsin_p99_error")
            compared = f"baseline/tocsin p99 absolute error = {ratio}x; " if ratio else ""
            console.print(
                f"{name}: {compared}the embedded runtime's capacity is about {capacity:.0f} "
                "tasks per CPU-second (its two processes together)"
            )
    if "flow" in results:
        _print_flow(results["flow"], console)
    if "retried" in results:
        _print_retried(results["retried"], console)
    for name in ("finder-scale", "throttled", "aws-burst", "console"):
        if name in results:
            table = Table("measure", "value", title=name)
            for key, value in results[name].items():
                table.add_row(key, str(value))
            console.print(table)
    if "cold_start" in results:
        _print_cold_start(results["cold_start"], console)
    if "lambda" in results:
        _print_lambda(results["lambda"], console)
    costs = {name: r["cost"] for name, r in timed.items() if "cost" in r}
    for name, cost in costs.items():
        title = f"cost model ({name}, DynamoDB {cost['billing']})"
        table = Table("unit", "per task", "$ per million tasks", title=title)
        for unit, amount in cost["per_task"].items():
            table.add_row(unit, str(amount), f"{cost['usd_per_million'][unit]:.2f}")
        table.add_row("total", "", f"{cost['usd_per_million_total']:.2f}")
        table.add_row(
            "EventBridge Scheduler (60 s precision)", "", f"{cost['scheduler_usd_per_million']:.2f}"
        )
        console.print(table)


def _print_flow(figures: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    limits = figures["flow"]
    table = Table("measure", "value", "limit or ideal", title="flow: what the receiver saw")
    table.add_row(
        "most in flight at once", str(figures["max_in_flight"]), str(limits["parallelism"])
    )
    table.add_row("most written in any second", str(figures["max_per_second"]), str(limits["rate"]))
    table.add_row(
        "most the receiver stamped in any second", str(figures["max_per_second_at_receiver"]), ""
    )
    table.add_row(
        "drain s (first to last arrival)", str(figures["drain_s"]), str(figures["ideal_drain_s"])
    )
    for q in ("p50", "p99", "max"):
        table.add_row(f"held ms {q}", str(figures["held_ms"][q]), "")
    plain = figures["plain"]
    table.add_row(
        "CPU ms a task, against the same tasks with no flow",
        f"{figures['cpu_ms_per_task']} ({figures['cpu_vs_plain']}x)",
        f"{plain['cpu_ms_per_task']} (2x at most)",
    )
    console.print(table)


def _print_retried(figures: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    ways, priced = figures["by_way"], figures.get("per_attempt", {})
    table = Table("measure", *ways, title="retried: one attempt refused (503), and retried")
    table.add_row("tasks", *(str(f["submitted"]) for f in ways.values()))
    table.add_row("fired", *(str(f["fired"]) for f in ways.values()))
    table.add_row("attempts refused", *(str(f["refused"]) for f in ways.values()))
    table.add_row("lateness p99 ms", *(str(f["lateness_ms"]["p99"]) for f in ways.values()))
    table.add_row("executions", *(str(f["executions"]) for f in ways.values()))
    if priced:
        totals = (f"{f['cost']['usd_per_million_total']:.2f}" for f in ways.values())
        table.add_row("$ per million tasks", *totals)
        for unit in ("usd_per_million", *ways["answered"]["cost"]["per_task"]):
            label = "$ per million attempts more" if unit == "usd_per_million" else f"  {unit}"
            table.add_row(label, *(str(priced.get(way, {}).get(unit, "")) for way in ways))
    console.print(table)


def _print_lambda(figures: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    title = (
        f"Lateness by memory size, ms: {figures['per_run']} tasks due in one millisecond, "
        "executors in Lambda-sized sandboxes"
    )
    columns = ("p50", "p99", "max", "executions", "post_gate_cpu_us", "throttled_ms")
    table = Table(
        "MB", "CPU share", "type", "p50", "p99", "max", "executions",
        "post-gate CPU µs a send", "throttled ms", "peak RSS MB", title=title,
    )  # fmt: skip
    for size, types in figures["by_memory"].items():
        for task_type, f in types.items():
            share = f"{int(size) / MB_PER_CORE:.3f}"
            row = (str(f[k]) for k in (*columns, "peak_rss_mb"))
            table.add_row(size, share, task_type, *row)
    console.print(table)
    moto = figures.get("moto_ms") or {}
    console.print(
        f"at {figures['memory_mb']} MB: {figures['cpu_share']} of a core given, "
        f"{figures['calibrated_share']} measured; {figures['tasks']} tasks, "
        f"{figures['fired']} fired, {figures['early']} early, {figures['duplicates']} "
        f"duplicated, {figures['lost']} lost; 200 KB bodies: peak RSS "
        f"{figures['bodies_peak_rss_mb']} MB; an SQS send is a call of up to ten; "
        f"moto's own time from a message's arrival to its SentTimestamp: p50 "
        f"{moto.get('p50')} ms, p99 {moto.get('p99')} ms"
    )


def _print_cold_start(figures: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from tocsin.measure.cold_start import BARE, executors_over

    python = figures[BARE]["python"]
    table = Table(
        "function", "init CPU ms", f"÷ {BARE}", title=f"Cold start: init CPU on Python {python}"
    )
    for name, measured in figures.items():
        table.add_row(name, str(measured["init_cpu_ms"]), str(measured["ratio"]))
    console.print(table)
    over = executors_over(figures)
    console.print(f"executors over 2x the bare handler: {', '.join(over) if over else 'none'}")


def _bins(*samples: list[int], count: int = 60) -> list[int]:
    """About `count` equal integer bins over every sample, with 0 on an edge."""
    low = min(min(v, default=0) for v in samples)
    high = max(max(v, default=0) for v in samples)
    step = max(1, (high - low) // count)
    return list(range(low // step * step, high + 2 * step, step))


def plot(results: dict[str, Any], path: str) -> None:
    """Lateness, one row per timing scenario: histograms of both variants on one scale,
    then of tocsin alone, whose milliseconds are one bar on the baseline's scale; for a
    scenario without a baseline, its histogram and the share of tasks by lateness."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [name for name in results if name in TIMED]
    figure, axes = plt.subplots(len(timed), 2, figsize=(13, 3.2 * len(timed)), squeeze=False)
    for (both, alone), name in zip(axes, timed, strict=True):
        samples = results[name]["samples"]
        bins = _bins(*samples.values())
        for variant, color in (("baseline", "tab:gray"), ("tocsin", "tab:blue")):
            if variant in samples:
                both.hist(samples[variant], bins=bins, alpha=0.7, color=color, label=variant)
        both.set_title(f"{name}: arrival minus due time")
        both.legend(loc="upper right")  # "best" searches every bar: slow with many
        both.set_ylabel("tasks")
        if "baseline" in samples:
            alone.hist(samples["tocsin"], bins=_bins(samples["tocsin"]), color="tab:blue")
            alone.set_title(f"{name}: tocsin alone")
            alone.set_ylabel("tasks")
        else:
            ordered = sorted(samples["tocsin"])
            shares = [(n + 1) / len(ordered) for n in range(len(ordered))]
            alone.plot(ordered, shares, color="tab:blue")
            alone.set_title(f"{name}: share of tasks fired within a lateness")
            alone.set_ylabel("share of tasks")
        for axis in (both, alone):
            axis.axvline(0, color="black", linewidth=0.8)
            axis.set_xlabel("lateness, ms (negative: early)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(
    names: list[str],
    scale: float,
    seed: int,
    as_json: bool,
    plot_path: str | None,
    cost: Pricing | None,
    tables: str = "moto",
    lambda_limits: bool = False,
    parameters: dict[str, str] | None = None,
) -> int:
    """Run, report (tables, or JSON as the last line), plot; 1 if a promise broke."""
    import logging

    from rich.console import Console

    logging.getLogger("moto").setLevel(logging.CRITICAL)
    console = Console(stderr=as_json)
    results = run(names, scale, seed, cost, console, tables, lambda_limits, parameters)
    if plot_path:
        plot(results, plot_path)
    for figures in results.values():
        figures.pop("samples", None)
    broken = problems(results)
    if as_json:
        print(json.dumps(results))
    else:
        print_report(results, console)
        console.print("; ".join(broken) if broken else "no task early, duplicated or lost")
    return 1 if broken else 0
