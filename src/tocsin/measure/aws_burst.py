"""`tocsin bench`'s aws-burst: can 50,000 tasks due in one second fire on time on AWS?

The real finder (query, pack, stagger, start) dispatches the tasks from the local
table, with StartExecution answered by a stand-in that keeps AWS's quota. No execution
runs: what the executions would then ask of AWS is computed from what the finder
started, second by second, against AWS's quotas in the largest regions:

* state transitions: Wait when an execution starts, Fire when it wakes, from a bucket of
  5,000 refilled at 5,000 a second;
* Lambda: a woken batch holds one executor environment from its wake to its last gate,
  within the account's 1,000 (and `ConcurrencyBudget`), and one function adds at most
  1,000 environments every 10 seconds;
* DynamoDB: at each wake the executor's claims, one write a task, against what a new
  on-demand table sustains, 4,000 writes a second, or the warm throughput it was given.

The laptop's own speed enters only through when the finder started each batch, which is
later here than on AWS.
"""

from collections import Counter
from dataclasses import dataclass
from typing import Any

START_QUOTA = (1300, 300)  # StartExecution: burst, then per second
TRANSITION_QUOTA = (5000, 5000)  # state transitions: burst, then per second
ACCOUNT_CONCURRENCY = 1000
SCALING_PER_10_S = 1000  # new environments one function may add every 10 seconds


@dataclass(frozen=True)
class StartedBatch:
    """What the finder started, in epoch seconds: when, its wake and its tasks' due times."""

    started_s: float
    wake_s: float
    first_due_s: float
    last_due_s: float
    tasks: int
    attempt_s: float = 0.0  # the longest a send of its type can take, after its last gate


def through_bucket(requests: list[float], burst: float, rate: float) -> list[float]:
    """When each request (epoch seconds, in order) is served by a token bucket that holds
    `burst` and refills at `rate` a second: at once while tokens last, then in turn."""
    served, tokens, at = [], burst, requests[0] if requests else 0.0
    for asked in requests:
        now = max(asked, at)
        tokens = min(burst, tokens + (now - at) * rate)
        if tokens < 1:
            now += (1 - tokens) / rate
            tokens = 1.0
        tokens -= 1
        at = now
        served.append(now)
    return served


def _peak_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = held = 0
    for _, change in edges:
        held += change
        peak = max(peak, held)
    return peak


def _most_new_in_10_s(starts: list[float]) -> int:
    ordered, most, first = sorted(starts), 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] >= 10:
            first += 1
        most = max(most, last - first + 1)
    return most


def _peak_per_second(times: list[float], weights: list[int]) -> int:
    per_second: Counter[int] = Counter()
    for at, weight in zip(times, weights, strict=True):
        per_second[int(at)] += weight
    return max(per_second.values(), default=0)


def judge(
    batches: list[StartedBatch], concurrency_budget: int, writes_per_second: int
) -> dict[str, Any]:
    """Whether every batch would be started, woken and claimed before its window on AWS."""
    ordered = sorted(batches, key=lambda b: (b.wake_s, b.first_due_s))
    # Transitions: each execution's Wait at its start and Fire at its wake, in time order.
    events = sorted(
        [(b.started_s, i, "wait") for i, b in enumerate(ordered)]
        + [(b.wake_s, i, "fire") for i, b in enumerate(ordered)]
    )
    served = through_bucket([at for at, _, _ in events], *TRANSITION_QUOTA)
    woken = {i: at for (_, i, kind), at in zip(events, served, strict=True) if kind == "fire"}
    # Environments: held from the wake until the last task's attempt can end.
    holds = [(woken[i], b.last_due_s + b.attempt_s) for i, b in enumerate(ordered)]
    peak_concurrency = _peak_overlap(holds)
    new_in_10_s = _most_new_in_10_s([start for start, _ in holds])
    within_concurrency = (
        peak_concurrency <= min(concurrency_budget, ACCOUNT_CONCURRENCY)
        and new_in_10_s <= SCALING_PER_10_S
    )
    # The claims on the Tasks table, first come first served, when each batch wakes.
    writes = sorted((woken[i], i) for i, b in enumerate(ordered) for _ in range(b.tasks))
    written = through_bucket([at for at, _ in writes], writes_per_second, writes_per_second)
    claimed_by: dict[int, float] = {}
    for (_, i), at in zip(writes, written, strict=True):
        claimed_by[i] = max(claimed_by.get(i, 0.0), at)
    claim_margins = [b.first_due_s - claimed_by[i] for i, b in enumerate(ordered)]
    woken_in_time = [
        b.started_s <= b.wake_s and woken[i] < b.first_due_s for i, b in enumerate(ordered)
    ]
    return {
        "tasks": sum(b.tasks for b in ordered),
        "batches": len(ordered),
        "all_started_before_wake": all(b.started_s <= b.wake_s for b in ordered),
        "all_woken_before_window": all(woken_in_time) and within_concurrency,
        "all_claimed_before_window": min(claim_margins, default=0) > 0,
        "least_claim_margin_ms": round(min(claim_margins, default=0) * 1000),
        "peak_concurrency": peak_concurrency,
        "concurrency_budget": concurrency_budget,
        "most_new_environments_in_10_s": new_in_10_s,
        "transitions": len(events),
        "peak_transitions_per_second": _peak_per_second(served, [1] * len(served)),
        # Claims are what must land before a window.
        "peak_writes_per_second": _peak_per_second(
            [woken[i] for i in range(len(ordered))], [b.tasks for b in ordered]
        ),
        "table_writes_per_second": writes_per_second,
        "wake_spread_s": round(max(woken.values()) - min(woken.values()), 3) if woken else 0,
    }
