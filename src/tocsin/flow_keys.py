"""The keys of a flow's items on the Tasks table (`tocsin.flow`): its ledger's and its
leases'. Apart from flow control, so that what only reads keys (the embedded runtime's
write meter in the DynamoDB process, its gates' order) does not import pydantic, botocore
and the logger with it: a quarter of a second at each start."""

from typing import Any

LEDGER_PREFIX = "~flow:"  # no task id holds a `~`
LEASE_PART = "lease"  # a lease item's part: `lease<i>`


def ledger_key(key: str, part: str) -> dict[str, str]:
    """Not a task: one of a flow key's ledger items."""
    return {"task_id": f"{LEDGER_PREFIX}{part}:{key}"}


def part_of(key: dict[str, Any]) -> str | None:
    """Which of a flow's items a DynamoDB key (as botocore sends it) names (`rate`,
    `lease0`, ...), or None for a task's."""
    task_id = key.get("task_id", {}).get("S", "")
    if not task_id.startswith(LEDGER_PREFIX):
        return None
    return task_id.removeprefix(LEDGER_PREFIX).partition(":")[0]
