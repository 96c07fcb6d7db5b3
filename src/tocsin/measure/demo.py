"""`tocsin demo`: many webhook tasks on the embedded runtime, timed where they arrive."""

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tocsin import clock
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import serving
from tocsin.measure.receiver import Arrival, WebhookReceiver, allowing
from tocsin.submit import submit_task

# The first task is due after the demo has submitted them all: on AWS the callers do not share
# a CPU with the scheduler, here they do (about 50 ms of moto per submission at most).
START_DELAY_MS = 3000
SUBMIT_ALLOWANCE_MS = 50
GRACE_S = 15.0  # how long after the last due time the demo waits for stragglers


@dataclass(frozen=True)
class PlannedTask:
    task_id: str
    due_ms: int


def percentile(values: list[int], p: float) -> int:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def lateness_values(planned: list[PlannedTask], arrivals: list[Arrival]) -> list[int]:
    """First arrival minus due time, for each planned task that arrived."""
    due = {task.task_id: task.due_ms for task in planned}
    first: dict[str, int] = {}
    for arrival in arrivals:
        if arrival.task_id in due:
            first[arrival.task_id] = min(
                first.get(arrival.task_id, arrival.arrival_ms), arrival.arrival_ms
            )
    return [first[task_id] - due[task_id] for task_id in first]


def summarize(planned: list[PlannedTask], arrivals: list[Arrival]) -> dict[str, Any]:
    """Counts and lateness of what arrived, against what was submitted."""
    due = {task.task_id: task.due_ms for task in planned}
    ours = [a for a in arrivals if a.task_id in due]
    lateness = lateness_values(planned, ours)
    return {
        "submitted": len(planned),
        "fired": len(lateness),
        "duplicates": len(ours) - len(lateness),
        "early": sum(a.arrival_ms < due[a.task_id] for a in ours),
        "lost": len(planned) - len(lateness),
        "lateness_ms": {
            "p50": percentile(lateness, 50),
            "p90": percentile(lateness, 90),
            "p99": percentile(lateness, 99),
            "max": max(lateness, default=0),
        },
    }


def progress_bars(console: Console, label_width: int = 10, transient: bool = False) -> Progress:
    return Progress(
        TextColumn(f"{{task.description:<{label_width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )


OWNER = "demo"  # whose tasks the demo submits, and whom its console acts as


@dataclass(frozen=True)
class DemoOptions:
    tasks: int = 200
    spread_s: float = 60.0
    seed: int | None = None
    lookahead_s: int = 20
    finder_interval_s: float = 5.0
    tables: str = "moto"  # or "dynamodb-local" (tocsin.local.runtime.TABLE_ENGINES)
    lambda_limits: bool = False  # executors in Lambda-sized sandboxes (tocsin.local.sandbox)


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Submit webhooks due over the spread and report how they arrived."""
    tasks = options.tasks
    console = Console(stderr=True)
    rng = random.Random(options.seed)
    with (
        WebhookReceiver() as receiver,
        EmbeddedRuntime(
            {"LookAheadSeconds": str(options.lookahead_s), **allowing(receiver.url)},
            finder_interval_s=options.finder_interval_s,
            tables=options.tables,
            lambda_limits=options.lambda_limits,
        ) as runtime,
        serving(runtime, principal=OWNER) as url,
        progress_bars(console) as bar,
    ):
        console.print(f"Watch them in the console while the demo runs: {url}/")
        for line in runtime.sandbox_report():
            console.print(line)
        start = clock.now_ms() + START_DELAY_MS + SUBMIT_ALLOWANCE_MS * tasks
        offsets = sorted(rng.randint(0, int(options.spread_s * 1000)) for _ in range(tasks))
        planned = [PlannedTask(f"demo-{i:05d}", start + offset) for i, offset in enumerate(offsets)]
        submitting = bar.add_task("submitted", total=tasks)
        left_for_finder = 0
        for task in planned:
            submitted = submit_task(
                {
                    "id": task.task_id,
                    "due_at": clock.to_iso(task.due_ms),
                    "type": "webhook",
                    "target": {"url": f"{receiver.url}/demo"},
                    "payload": {"task": task.task_id, "due_at": clock.to_iso(task.due_ms)},
                },
                owner=OWNER,
            )
            left_for_finder += submitted.task["status"] == "PENDING"
            bar.advance(submitting)
        firing = bar.add_task("fired", total=tasks)
        deadline = time.monotonic() + (planned[-1].due_ms - clock.now_ms()) / 1000 + GRACE_S
        while time.monotonic() < deadline:
            fired = len({a.task_id for a in receiver.received()})
            bar.update(firing, completed=fired)
            if fired >= tasks:
                break
            time.sleep(0.2)
        runtime.wait_for_executions(timeout_s=5)
        summary = summarize(planned, receiver.received())
    summary["via_finder"] = left_for_finder
    summary["peak_memory_mb"] = runtime.footprint()["peak_memory_mb"]
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="Tocsin demo: lateness measured where the webhook arrived")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name in ("submitted", "fired", "duplicates", "early", "lost"):
        table.add_row(name, str(summary[name]))
    for name, value in summary["lateness_ms"].items():
        table.add_row(f"lateness {name}", f"{value} ms")
    table.add_row("started by the finder (due beyond look-ahead)", str(summary["via_finder"]))
    table.add_row("peak memory", f"{summary['peak_memory_mb']} MiB")
    Console().print(table)


def main(options: DemoOptions, as_json: bool) -> int:
    summary = run_demo(options)
    print_summary(summary)
    if as_json:
        print(json.dumps(summary))
    ok = summary["fired"] == summary["submitted"] and not (
        summary["duplicates"] or summary["early"]
    )
    if not ok:
        print("some tasks were lost, duplicated or early", file=sys.stderr)
    return 0 if ok else 1
