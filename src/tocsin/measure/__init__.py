"""What runs on the embedded runtime to judge Tocsin: the demo, the benchmark, the chaos
suite, the cold start, the costs, and the receiver that times each webhook's arrival."""

from typing import Any


def placed_long_ago(item: dict[str, Any]) -> dict[str, Any]:
    """A task's item as a submission made long before its due time leaves it, written
    straight to the table: the finder's to start, not its writer's
    (`tocsin.index_keys.writers_own`), however soon it is due now, and in the index at its
    due time, not at now (where a task placed past its due time goes)."""
    return {**item, "placed_ms": 0, "gsi_due_ms": item["due_ms"]}


def most_within(moments_ms: list[int], span_ms: int) -> int:
    """The most of `moments_ms` within any `span_ms` (a window from each on): what a flow's
    rate is judged by where its sends arrive."""
    ordered, most, start = sorted(moments_ms), 0, 0
    for end, moment in enumerate(ordered):
        while moment - ordered[start] >= span_ms:
            start += 1
        most = max(most, end - start + 1)
    return most
