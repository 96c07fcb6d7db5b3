"""`tocsin bench --scenarios lambda`: precision under Lambda's limits.

500 tasks due in one millisecond, for the webhook and the SQS types, fired by executors in
Lambda-sized sandboxes (`tocsin.local.sandbox`) at the template's executor memory size and
at larger ones (a larger size buys a larger share of a core); then 500 webhook tasks with
200 KB bodies at the template's size, the split set to 500 (so in two executors of 250,
the most a webhook batch holds: `WEBHOOK_BATCH_MAX`);
then one executor's share of a split burst alone (see `one_invocation`).

Lateness is measured where each task's bytes arrive, by the kernel's receive stamp of their
first bytes (`tocsin.local.http_thread.first_bytes_ns`): at the webhook receiver, and at
the endpoint that stands in for SQS (`tocsin.local.moto_endpoint`), so that no stand-in's
own CPU counts as Tocsin's lateness. moto answers every queue call in one process; what it
took from that arrival to the message's SentTimestamp is reported apart (`moto_ms`).

Each run also reports what its executors did after their gates: the CPU their sandboxes'
cgroups spent from an invocation's first gate to its last write, per send (a call, for
SQS: `post_gate_cpu_us`), the invocations the burst took (`executions`) and the CFS
throttling the sandboxes met (`nr_throttled`, `throttled_ms`).
"""

import json
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import boto3

from tocsin import clock
from tocsin.dispatch import DueTask, burst_tasks, pack
from tocsin.local.sandbox import MB_PER_CORE
from tocsin.measure import placed_long_ago
from tocsin.measure.demo import PlannedTask, lateness_values, percentile, summarize
from tocsin.measure.receiver import Arrival, ReceiverProcess, allowing
from tocsin.measure.scenario import Bench, write_items
from tocsin.model import TaskType
from tocsin.settings import MAX_PAYLOAD_BYTES, settings

if TYPE_CHECKING:
    from tocsin.local.moto_endpoint import Call
    from tocsin.local.runtime import EmbeddedRuntime

SIZES_MB = (256, 512, 1024, MB_PER_CORE)  # the template's first, up to one whole vCPU
TYPES = ("webhook", "sqs")
TASKS = 500
BODY_BYTES = MAX_PAYLOAD_BYTES - 100  # about the most a payload may carry: 200 KB
AHEAD_MS = 15_000  # due this far from the finder's run: past the wake, the claims and init
GRACE_S = 60.0


def lambda_limits(bench: Bench) -> dict[str, Any]:
    """Every size and type, then the large bodies; the figures `--json` reports."""
    tasks = bench.size(TASKS)
    by_memory: dict[str, dict[str, Any]] = {}
    runs, default_lateness, calibration, at_default = [], [], {}, {}
    for memory_mb in SIZES_MB:
        for task_type in TYPES:
            figures, lateness, measured = same_millisecond(bench, memory_mb, task_type, tasks)
            runs.append(figures)
            by_memory.setdefault(str(memory_mb), {})[task_type] = {
                **figures["lateness_ms"],
                **{key: figures[key] for key in (*PER_RUN, *JUDGED)},
            }
            if memory_mb == SIZES_MB[0]:
                default_lateness += lateness
                calibration = calibration or measured
                at_default[task_type] = figures
    whole = {"BurstSendsPerInvocation": str(tasks)}  # no split: batches as large as may be
    bodies, _, _ = same_millisecond(bench, SIZES_MB[0], "webhook", tasks, BODY_BYTES, whole)
    runs.append(bodies)
    alone = {}  # what each executor of a split burst does, with the machine to itself
    for task_type in TYPES:
        share = min(burst_tasks(TaskType(task_type), settings().burst_sends), tasks)
        figures, _, _ = same_millisecond(bench, SIZES_MB[0], task_type, share)
        runs.append(figures)
        alone[task_type] = {
            **figures["lateness_ms"],
            "tasks": figures["submitted"],
            **{k: figures[k] for k in JUDGED},
        }
    return {
        "memory_mb": SIZES_MB[0],
        "per_run": tasks,
        "cpu_share": round(SIZES_MB[0] / MB_PER_CORE, 3),
        "calibrated_share": calibration.get("measured"),
        "tasks": sum(f["submitted"] for f in runs),
        **{k: sum(f[k] for f in runs) for k in ("fired", *JUDGED)},
        "lateness_ms": {
            **{f"p{p}": percentile(default_lateness, p) for p in (50, 90, 99)},
            "max": max(default_lateness, default=0),
        },
        "post_gate_cpu_us": {t: f["post_gate_cpu_us"] for t, f in at_default.items()},
        "executions": {t: f["executions"] for t, f in at_default.items()},
        "throttling": {
            t: {"nr_throttled": f["nr_throttled"], "throttled_ms": f["throttled_ms"]}
            for t, f in at_default.items()
        },
        "moto_ms": at_default.get("sqs", {}).get("moto_ms"),
        "by_memory": by_memory,
        "one_invocation": alone,
        "bodies_peak_rss_mb": bodies["peak_rss_mb"],
        "bodies": {**bodies["lateness_ms"], **{k: bodies[k] for k in (*PER_RUN, *JUDGED)}},
    }


JUDGED = ("early", "duplicates", "lost")  # each run's, and their sums: each should be 0
# What each run reports beside its lateness (`same_millisecond`).
PER_RUN = (
    "peak_rss_mb",
    "environments",
    "executions",
    "post_gate_cpu_us",
    "nr_throttled",
    "throttled_ms",
)


def same_millisecond(
    bench: Bench,
    memory_mb: int,
    task_type: str,
    tasks: int,
    body_bytes: int = 0,
    more: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[int], dict[str, Any]]:
    """`tasks` of `task_type` due in one millisecond, fired from sandboxes of `memory_mb`
    (`more`: other template parameters): the run's figures, its lateness values and the
    sandbox's calibration."""
    label = f"lambda {memory_mb} MB {task_type}" + (" bodies" if body_bytes else "")
    moto_ms: dict[str, int] = {}
    with ReceiverProcess(tls=True) as receiver:  # HTTPS, as the sandboxes reach AWS
        parameters = {
            "ExecutorMemorySize": str(memory_mb),
            **allowing(receiver.url),
            **(more or {}),
        }
        with bench.runtime(parameters, lambda_limits=True) as runtime:
            runtime.moto_endpoint.recording = True
            target = _target(task_type, receiver.url)
            due_ms = clock.now_ms() + AHEAD_MS
            planned = [PlannedTask(f"{task_type}-{i:04d}", due_ms) for i in range(tasks)]
            environments = _warmed(runtime, task_type, planned)
            _store(planned, task_type, target, "x" * body_bytes)
            runtime.run_finder()
            bar = bench.progress.add_task(label, total=len(planned))
            _wait_for_final(runtime, len(planned), due_ms, bench, bar)
            if task_type == "webhook":
                arrivals = receiver.received()
            else:
                arrivals, moto_ms = _at_the_queue(runtime.moto_endpoint.recorded(), target)
            _say_why_doubled(bench, label, arrivals)
            peak_rss_mb = runtime.sandboxes.peak_memory_mb()
            tally = runtime.sandboxes.tally(EXECUTORS[task_type])
            calibration = runtime.calibration[0] if runtime.calibration else {}
            bench.progress.remove_task(bar)
    figures = summarize(planned, arrivals) | {"peak_rss_mb": round(peak_rss_mb, 1)}
    figures |= {
        "environments": environments,
        "executions": tally.invocations,
        "post_gate_cpu_us": round(tally.post_gate_cpu_ns / 1000 / max(tally.sends, 1), 1),
        "nr_throttled": tally.nr_throttled,
        "throttled_ms": round(tally.throttled_ns / 1e6, 1),
    }
    if moto_ms:
        figures["moto_ms"] = moto_ms
    return figures, lateness_values(planned, arrivals), calibration


EXECUTORS = {"webhook": "WebhookExecutorFunction", "sqs": "SqsExecutorFunction"}


def _say_why_doubled(bench: Bench, label: str, arrivals: list[Arrival]) -> None:
    """Each task that arrived more than once, with what its item says of its attempts: a
    retry after an answer lost, or a send twice (the run's `duplicates`)."""
    from tocsin.store import TaskStore

    counts = Counter(a.task_id for a in arrivals)
    store = TaskStore(settings().tasks_table)
    for task_id in sorted(t for t, n in counts.items() if n > 1)[:5]:
        item = store.get(task_id) or {}
        said = {k: item.get(k) for k in ("status", "attempts", "tries", "lateness_ms")}
        bench.progress.console.print(f"{label}: {task_id} arrived {counts[task_id]} times: {said}")


def _warmed(runtime: "EmbeddedRuntime", task_type: str, planned: list[PlannedTask]) -> int:
    """An environment for each batch the finder will make of `planned`, started and idle
    before the run, as after earlier bursts: this machine's two cores cannot start dozens
    side by side in the lead, where Lambda starts each on a machine of its own."""
    config = settings()
    due = [DueTask(t.due_ms, t.task_id, 1, TaskType(task_type)) for t in planned]
    count = len(pack(due, config.batch_window_ms, config.batch_size, config.burst_sends))
    runtime.warm(EXECUTORS[task_type], count)
    return count


def _target(task_type: str, receiver_url: str) -> dict[str, Any]:
    if task_type == "webhook":
        return {"url": f"{receiver_url}/lambda"}
    queue = boto3.client("sqs").create_queue(QueueName="lambda-bench")["QueueUrl"]
    return {"queue_url": queue}


def _store(planned: list[PlannedTask], task_type: str, target: dict[str, Any], blob: str) -> None:
    """The tasks' items written for the finder, large bodies in the Bodies table."""
    from tocsin.submit import new_item

    config, now = settings(), clock.now_ms()

    def item(task: PlannedTask) -> dict[str, Any]:
        body = {"id": task.task_id, "due_at": clock.to_iso(task.due_ms), "type": task_type,
                "target": target, "payload": {"blob": blob}}  # fmt: skip
        return placed_long_ago(new_item(body, "bench", now, config))

    write_items(item(task) for task in planned)


def _wait_for_final(
    runtime: "EmbeddedRuntime", count: int, due_ms: int, bench: Bench, bar: Any
) -> None:
    """Until every task has ended (or GRACE_S past the due time)."""
    import time

    table = boto3.resource("dynamodb").Table(settings().tasks_table)
    deadline = time.monotonic() + (due_ms - clock.now_ms()) / 1000 + GRACE_S
    while time.monotonic() < deadline:
        items = table.scan(ProjectionExpression="#s", ExpressionAttributeNames={"#s": "status"})
        ended = sum(i.get("status") in ("SUCCEEDED", "FAILED") for i in items["Items"])
        bench.progress.update(bar, completed=ended)
        if ended >= count:
            break
        time.sleep(1)
    runtime.wait_for_executions(timeout_s=10)


def _at_the_queue(
    calls: list["Call"], target: dict[str, Any]
) -> tuple[list[Arrival], dict[str, int]]:
    """Each message on the queue as it arrived at the endpoint (its call's first bytes), and
    moto's own time: from there to the message's SentTimestamp (p50, p99 and max). A
    message the queue holds twice arrives twice; one that reached the endpoint in a call
    whose entries the queue does not hold did not arrive."""
    reached: dict[str, int] = {}  # each task's first arrival at the endpoint
    for call in calls:
        if call.operation.endswith(".SendMessageBatch"):
            for entry in json.loads(call.body)["Entries"]:
                task_id = json.loads(entry["MessageBody"])["task_id"]
                reached[task_id] = min(reached.get(task_id, call.arrived_ns), call.arrived_ns)
    arrivals, moto_ms = [], []
    for message in _queued(target):
        arrived_ms = reached[message.task_id] // 1_000_000
        arrivals.append(replace(message, arrival_ms=arrived_ms))
        moto_ms.append(message.arrival_ms - arrived_ms)
    took = {f"p{p}": percentile(moto_ms, p) for p in (50, 99)} | {"max": max(moto_ms, default=0)}
    return arrivals, took


def _queued(target: dict[str, Any]) -> list[Arrival]:
    """Every message on the queue, as arrivals at its SentTimestamp."""
    sqs, arrivals = boto3.client("sqs"), []
    while True:
        reply = sqs.receive_message(
            QueueUrl=target["queue_url"], MaxNumberOfMessages=10, AttributeNames=["SentTimestamp"]
        )
        messages = reply.get("Messages", [])
        if not messages:
            return arrivals
        for message in messages:
            envelope = json.loads(message["Body"])
            sent_ms = int(message["Attributes"]["SentTimestamp"])
            key = envelope["idempotency_key"]
            arrivals.append(Arrival(sent_ms, "", key, envelope["task_id"], b"", {}))
        sqs.delete_message_batch(
            QueueUrl=target["queue_url"],
            Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                     for n, m in enumerate(messages)],
        )  # fmt: skip
