"""Where a task sits in the dispatch index (`DispatchIndex`, sparse, sharded).

A task is put in a due shard (`"0"` … `"S-1"`) at its due time (or its placing, if
that is later) and stays there: its
claim and its final mark do not touch the entry (each move of an entry is two index
writes), and TTL deletes it with the task. Who starts it depends on when it was placed
there (`placed_ms`): a task due within the look-ahead of that moment is started by its
writer (`writers_own`); every other one by the finder, which reads only the entries past
its horizon (`tocsin.finder`). The reconciler reads each entry once more,
`LOOK_AFTER_MS` past its due time, and looks closer at a task not yet settled by then.

A check shard (`"check-0"` …) holds the few tasks that need another look at a given
time: one whose start failed, one the reconciler started or found still running, a
FAILED one until its dead letter is known sent. The reconciler reads the check shards
whole, up to now, and takes out each entry whose task has settled.
"""

import hashlib
from typing import Any

from tocsin.settings import Settings

# How long after its due time the reconciler looks at a task: one still PENDING then was
# missed (its writer died before the start, say), one still RUNNING may be stuck.
LOOK_AFTER_MS = 2 * 60 * 1000
# How long a put may take to appear in the index (a global secondary index is eventually
# consistent, usually within a second): a writer starts what the finder might not see.
INDEX_LAG_MS = 10 * 1000
# How long a task's failer has to send its dead letter, after the FAILED mark, before the
# reconciler sends it instead: the failer sends at once, so only a crash or an SQS
# outage leaves a letter owed this long.
LETTER_GRACE_MS = 5 * 60 * 1000


def shard_of(task_id: str, shards: int) -> int:
    """A stable shard per id, spreading a hot minute over the index's partitions."""
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big") % shards


def due_index_keys(task_id: str, due_ms: int, config: Settings, now_ms: int) -> dict[str, Any]:
    """The keys that put a task in the due shards, placed now: at its due time, or at now
    if that has passed (a redrive, a late submission, a catch-up), where the reconciler's
    horizon has not yet gone."""
    return {
        "gsi_pk": str(shard_of(task_id, config.shards)),
        "gsi_due_ms": max(due_ms, now_ms),
        "placed_ms": now_ms,
    }


def writers_own(due_ms: int, placed_ms: int, config: Settings) -> bool:
    """Whether the writer that placed a task at its due time starts it, not the finder: it
    is due before the finder's next run could see it (within the look-ahead, and the
    index's lag, of its placing)."""
    return due_ms <= placed_ms + config.lookahead_s * 1000 + INDEX_LAG_MS


CHECK_SHARD = "check-"


def check_shard(shard: int) -> str:
    return f"{CHECK_SHARD}{shard}"


def in_check_shard(item: dict[str, Any]) -> bool:
    """Whether a task waits in a check shard for a look (not at its due time)."""
    return str(item.get("gsi_pk", "")).startswith(CHECK_SHARD)


def check_keys(task_id: str, look_ms: int, config: Settings) -> dict[str, Any]:
    """The keys that put a task in the check shards, to be looked at by `look_ms`."""
    return {"gsi_pk": check_shard(shard_of(task_id, config.shards)), "gsi_due_ms": look_ms}


def owed_letter_keys(task_id: str, failed_ms: int, config: Settings) -> dict[str, Any]:
    """The keys that keep a FAILED task in the check shards until its dead letter is sent."""
    return check_keys(task_id, failed_ms + LETTER_GRACE_MS, config)
