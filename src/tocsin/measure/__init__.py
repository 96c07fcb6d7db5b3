"""What runs on the embedded runtime to judge Tocsin: the demo, the benchmark, the chaos
suite, the cold start, the costs, and the receiver that times each webhook's arrival."""

from typing import Any


def placed_long_ago(item: dict[str, Any]) -> dict[str, Any]:
    """A task's item as a submission made long before its due time leaves it, written
    straight to the table: the finder's to start, not its writer's
    (`tocsin.index_keys.writers_own`), however soon it is due now, and in the index at its
    due time, not at now (where a task placed past its due time goes)."""
    return {**item, "placed_ms": 0, "gsi_due_ms": item["due_ms"]}
