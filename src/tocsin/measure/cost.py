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

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tocsin import aws

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
# moto's early Waits): each executor invocation is priced as if it had woken at this one.
AWS_LEAD_MS = 2000  # EventBridge Scheduler: $1.00 per million invocations, 60 s precision
READS = {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"}


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


def billed_usage(
    runtime: Any,
    executions: list[Any],
    requests: Counter[str],
    write_units: Counter[str],
    tasks: int,
    pricing: Pricing,
) -> dict[str, Any]:
    """Per task: each billed unit, and the dollars per million tasks it comes to."""
    invocations = gb_seconds = gb_second_usd = 0.0
    longer_lead_ms = int(runtime.parameters["LeadMilliseconds"]) - AWS_LEAD_MS
    for (logical_id, kind), value in runtime.usage.items():
        if kind == "invocations":
            invocations += value
        else:
            if logical_id.endswith("ExecutorFunction"):
                waited = runtime.usage[logical_id, "invocations"] * longer_lead_ms
                value = max(0, value - waited)
            function = runtime.functions[logical_id]
            used = value / 1000 * function.memory_mb / 1024
            gb_seconds += used
            gb_second_usd += used * GB_SECOND_PRICE[function.architecture]
    totals = {
        "state_transitions": sum(transitions(e.execution_arn) for e in executions),
        "lambda_invocations": invocations,
        "lambda_gb_seconds": gb_seconds,
        "dynamodb_write_units": write_units["table"],
        "dynamodb_index_write_units": write_units["index"],
        "dynamodb_reads": sum(requests[action] for action in READS),
        "api_requests": runtime.usage["ApiFunction", "invocations"],
    }
    per_task = {unit: value / tasks for unit, value in totals.items()}
    prices = pricing.unit_prices() | {"lambda_gb_seconds": gb_second_usd / max(gb_seconds, 1e-9)}
    per_million = {unit: per_task[unit] * prices[unit] * 1e6 for unit in per_task}
    return {
        "billing": pricing.label(),
        "priced_at_lead_ms": AWS_LEAD_MS,
        "per_task": {unit: round(value, 3) for unit, value in per_task.items()},
        # the table's and each index's (`index:<name>`), as DynamoDB Local bills them
        "write_units_per_task": {
            name: round(units / tasks, 3) for name, units in sorted(write_units.items()) if units
        },
        "usd_per_million": {unit: round(value, 2) for unit, value in per_million.items()},
        "usd_per_million_total": round(sum(per_million.values()), 2),
        "scheduler_usd_per_million": SCHEDULER_PER_MILLION,
    }
