"""The cost model of `tocsin bench --cost`: what one task used in a run, priced per million.

Usage is counted, not assumed: state transitions from each execution's history, Lambda
invocations and their billed milliseconds (the gate's sleep included, an executor's at a
deployed stack's lead: AWS_LEAD_MS) from the runtime, DynamoDB write units (per 1 KB of
each item written, and each global index's writes: `tocsin.local.write_units`) and read
requests from the DynamoDB process, API requests from the API function's invocations.
Prices are AWS list prices in us-east-1 (Lambda at each function's architecture,
DynamoDB on demand or provisioned, Step Functions Standard, HTTP API), checked 2026-11;
a read request is priced as one read unit, which holds for strongly consistent reads of
up to 4 KB (reads are a few cents of a task's cost).
"""

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tocsin import aws
from tocsin.settings import settings
from tocsin.store import HORIZONS_KEY

GB_SECOND_PRICE = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
PRICE_PER_UNIT = {
    "state_transitions": 0.025 / 1000,
    "lambda_invocations": 0.20 / 1e6,
    "dynamodb_write_units": 0.625 / 1e6,
    "dynamodb_index_write_units": 0.625 / 1e6,
    "dynamodb_reads": 0.125 / 1e6,
    "api_requests": 1.00 / 1e6,
}
# Provisioned capacity (BillingMode=PROVISIONED): per unit-hour, used or not.
WRITE_UNIT_HOUR = 0.00065
READ_UNIT_HOUR = 0.00013
SCHEDULER_PER_MILLION = 1.00
# A deployed stack's lead (template.yaml's LeadMilliseconds): an executor invocation waits
# through it before its first gate. The embedded runtime wakes earlier (its own lead, for
# a shared machine's slower starts): each executor invocation is priced as if it had
# woken at this one.
AWS_LEAD_MS = 2000  # EventBridge Scheduler: $1.00 per million invocations, 60 s precision
# A deployed stack's finder runs once a minute (template.yaml's FinderSchedule); the
# embedded runtime's ticker runs every few seconds. What a run costs with nothing to do
# (its queries, its horizons' writes, its time) is priced for a deployed stack's runs.
AWS_FINDER_INTERVAL_S = 60
FINDER = "FinderFunction"
READS = {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"}


@dataclass(frozen=True)
class IdleRun:
    """What one finder run with nothing to do used: DynamoDB's requests and write units, and
    its billed milliseconds; measured on the runtime (`idle_finder_run`)."""

    requests: Counter[str]
    write_units: Counter[str]
    ms: float


def idle_finder_run(runtime: Any) -> IdleRun:
    """Run the finder on a stack with nothing due yet, and measure what a run costs alone
    (a tick of the runtime's own finder may come in between: each is counted). Its
    horizons are taken out again: tasks the scenario then writes straight to the table,
    as if submitted long before, are due behind them."""
    before, runs, ms = (
        runtime.footprint(),
        runtime.usage[FINDER, "invocations"],
        runtime.usage[FINDER, "ms"],
    )
    runtime.run_finder()
    after = runtime.footprint()
    count = runtime.usage[FINDER, "invocations"] - runs
    aws.resource("dynamodb").Table(settings().tasks_table).delete_item(Key=HORIZONS_KEY)
    return IdleRun(
        _per(after["dynamodb_requests"] - before["dynamodb_requests"], count),
        _per(after["dynamodb_write_units"] - before["dynamodb_write_units"], count),
        (runtime.usage[FINDER, "ms"] - ms) / count,
    )


def _per(counts: Counter[str], runs: int) -> Counter[str]:
    return Counter({name: value / runs for name, value in counts.items()})


@dataclass(frozen=True)
class Pricing:
    """How the tables are billed: on demand, or provisioned capacity of which a steady load
    uses `utilization` (Application Auto Scaling's target): each unit used then costs its
    hour's price over the seconds of that hour it is used."""

    billing: str = "on-demand"  # or "provisioned"
    utilization: float = 0.70

    def unit_prices(self) -> dict[str, float]:
        if self.billing == "on-demand":
            return PRICE_PER_UNIT
        write = WRITE_UNIT_HOUR / 3600 / self.utilization
        read = READ_UNIT_HOUR / 3600 / self.utilization
        return PRICE_PER_UNIT | {
            "dynamodb_write_units": write,
            "dynamodb_index_write_units": write,
            "dynamodb_reads": read,
        }

    def label(self) -> str:
        if self.billing == "on-demand":
            return "on demand"
        return f"provisioned, {self.utilization:.0%} used"


def transitions(execution_arn: str) -> int:
    """What Step Functions Standard bills one execution: every state entered, and every
    retry of a Task state (a TaskScheduled beyond the one its entry makes)."""
    pages = aws.client("stepfunctions").get_paginator("get_execution_history")
    history = pages.paginate(executionArn=execution_arn)
    kinds = Counter(event["type"] for page in history for event in page["events"])
    entered = sum(n for kind, n in kinds.items() if kind.endswith("StateEntered"))
    return entered + kinds["TaskScheduled"] - kinds["TaskStateEntered"]


@dataclass
class Used:
    """What a scenario used on the runtime: each function's invocations and billed
    milliseconds (`(logical id, "invocations" | "ms")`), DynamoDB's requests by action
    and its write units, and how long it took."""

    usage: Counter[tuple[str, str]]
    requests: Counter[str]
    write_units: Counter[str]
    wall_s: float

    def at_finder_interval(self, idle: IdleRun) -> int:
        """Leave out the finder runs a deployed stack would not make (one a minute, not one
        every few seconds), each as much as a run with nothing to do; the runs left."""
        runs = self.usage[FINDER, "invocations"]
        priced = min(runs, math.ceil(self.wall_s / AWS_FINDER_INTERVAL_S))
        extra = runs - priced
        self.usage[FINDER, "invocations"] = priced
        self.usage[FINDER, "ms"] = max(0, self.usage[FINDER, "ms"] - extra * idle.ms)
        for counts, alone in ((self.requests, idle.requests), (self.write_units, idle.write_units)):
            for name, value in alone.items():
                counts[name] = max(0, counts[name] - extra * value)
        return priced


def billed_usage(
    runtime: Any,
    executions: list[Any],
    used: Used,
    tasks: int,
    pricing: Pricing,
    idle: IdleRun,
) -> dict[str, Any]:
    """Per task: each billed unit, and the dollars per million tasks it comes to, at a
    deployed stack's lead and finder interval."""
    finder_runs = used.usage[FINDER, "invocations"], used.at_finder_interval(idle)
    requests, write_units = used.requests, used.write_units
    invocations = gb_seconds = gb_second_usd = 0.0
    longer_lead_ms = int(runtime.parameters["LeadMilliseconds"]) - AWS_LEAD_MS
    for (logical_id, kind), value in used.usage.items():
        if kind == "invocations":
            invocations += value
        else:
            if logical_id.endswith("ExecutorFunction"):
                waited = used.usage[logical_id, "invocations"] * longer_lead_ms
                value = max(0, value - waited)
            function = runtime.functions[logical_id]
            gb = value / 1000 * function.memory_mb / 1024
            gb_seconds += gb
            gb_second_usd += gb * GB_SECOND_PRICE[function.architecture]
    totals = {
        "state_transitions": sum(transitions(e.execution_arn) for e in executions),
        "lambda_invocations": invocations,
        "lambda_gb_seconds": gb_seconds,
        "dynamodb_write_units": write_units["table"],
        "dynamodb_index_write_units": write_units["index"],
        "dynamodb_reads": sum(requests[action] for action in READS),
        "api_requests": used.usage["ApiFunction", "invocations"],
    }
    per_task = {unit: value / tasks for unit, value in totals.items()}
    prices = pricing.unit_prices() | {"lambda_gb_seconds": gb_second_usd / max(gb_seconds, 1e-9)}
    per_million = {unit: per_task[unit] * prices[unit] * 1e6 for unit in per_task}
    return {
        "billing": pricing.label(),
        "priced_at_lead_ms": AWS_LEAD_MS,
        "priced_at_finder_interval_s": AWS_FINDER_INTERVAL_S,
        "finder_runs": {"here": finder_runs[0], "priced": finder_runs[1]},
        "per_task": {unit: round(value, 3) for unit, value in per_task.items()},
        # the table's and each index's (`index:<name>`), as DynamoDB Local bills them; of
        # the table's, a flow's items' too (`flow:ledger`, `flow:leases`)
        "write_units_per_task": {
            name: round(units / tasks, 3) for name, units in sorted(write_units.items()) if units
        },
        "usd_per_million": {unit: round(value, 2) for unit, value in per_million.items()},
        "usd_per_million_total": round(sum(per_million.values()), 2),
        "scheduler_usd_per_million": SCHEDULER_PER_MILLION,
    }
