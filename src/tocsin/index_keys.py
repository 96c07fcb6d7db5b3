"""Where a task sits in the dispatch index (`DispatchIndex`, sparse, sharded).

A PENDING task is in a due shard (`"0"` … `"S-1"`) at its due time: the finder starts it.
A task in flight (SCHEDULED or RUNNING) is in a check shard (`"check-0"` …) at the time
its execution must have settled it by: the reconciler looks at it then. A FAILED task
stays in a check shard until its dead letter is known sent (`LETTER_GRACE_MS` after it
failed, the reconciler sends the letter its failer did not). A task with an end
(SUCCEEDED, FAILED with its letter sent, CANCELLED) is in no shard.
"""

import hashlib
from typing import Any

from tocsin.settings import Settings

# The longest an execution may still be working on a task after its due time: Fire's four
# attempts of up to 150 s each with their backoff, or three waits for a delivery still in
# progress (30 + 60 + 120 s) after the first attempt (see statemachines/task.asl.json).
SETTLE_AFTER_MS = 15 * 60 * 1000
# How long a task's failer has to send its dead letter, after the FAILED mark, before the
# reconciler sends it instead: the failer sends at once, so only a crash or an SQS
# outage leaves a letter owed this long.
LETTER_GRACE_MS = 5 * 60 * 1000


def shard_of(task_id: str, shards: int) -> int:
    """A stable shard per id, spreading a hot minute over the index's partitions."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big") % shards


def due_index_keys(task_id: str, due_ms: int, config: Settings) -> dict[str, Any]:
    """The keys that put a PENDING task in the finder's due shards."""
    return {"gsi_pk": str(shard_of(task_id, config.shards)), "gsi_due_ms": due_ms}


def check_shard(shard: int) -> str:
    return f"check-{shard}"


def check_index_keys(task_id: str, due_ms: int, config: Settings) -> dict[str, Any]:
    """The keys that put a task in flight in the reconciler's check shards."""
    shard = check_shard(shard_of(task_id, config.shards))
    return {"gsi_pk": shard, "gsi_due_ms": due_ms + SETTLE_AFTER_MS}


def owed_letter_keys(task_id: str, failed_ms: int, config: Settings) -> dict[str, Any]:
    """The keys that keep a FAILED task in the check shards until its dead letter is sent."""
    shard = check_shard(shard_of(task_id, config.shards))
    return {"gsi_pk": shard, "gsi_due_ms": failed_ms + LETTER_GRACE_MS}
