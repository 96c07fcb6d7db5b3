"""Where the tasks of a crowded window go, read so that the finder packs their calls as the
executor will make them.

An executor sends the tasks of a batched type due in one millisecond at one queue, topic
or bus ten to a call (`tocsin.fire.sends`), and a call costs it after the gate what two
webhook sends do. The due index holds no target, so tasks whose keys are not read count ten
to a call (`tocsin.dispatch.calls`): 40 SQS tasks at 40 queues would count as 4 calls and
make 40, on one executor's share of a core. For the windows where that can matter
(`tocsin.dispatch.crowded`) the finder reads each task's target, from its item or its body
apart: half a read unit a task, where a second holds more than one executor's burst. A read
that fails, or that the run's time cuts off, leaves those keys unread: the tasks are packed
as before, and still started.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin.batch_read import BATCH_GET_MAX
from tocsin.dispatch import DueTask, crowded
from tocsin.errors import Busy
from tocsin.model import TaskType
from tocsin.observability import logger
from tocsin.settings import Settings
from tocsin.store import TaskStore


def with_call_keys(tasks: list[DueTask], settings: Settings, deadline: float) -> list[DueTask]:
    """`tasks`, those of crowded windows with their batch keys, read by `deadline` (a
    time.monotonic() value)."""
    wanted = list(
        dict.fromkeys(
            t.task_id for t in crowded(tasks, settings.batch_window_ms, settings.burst_sends)
        )
    )
    if not wanted:
        return tasks
    store = TaskStore(settings.tasks_table)
    chunks = [wanted[i : i + BATCH_GET_MAX] for i in range(0, len(wanted), BATCH_GET_MAX)]

    def read(chunk: list[str]) -> list[dict[str, Any]]:
        return store.targets(chunk) if time.monotonic() < deadline else []

    try:
        with ThreadPoolExecutor(max_workers=min(settings.dispatch_workers, len(chunks))) as pool:
            keys = {i["task_id"]: call_key(i) for part in pool.map(read, chunks) for i in part}
    except (BotoCoreError, ClientError, Busy) as fault:
        logger.warning("call keys not read: packed ten a call", fault=type(fault).__name__)
        return tasks
    return [replace(task, batch_key=keys.get(task.task_id, "")) for task in tasks]


def call_key(item: dict[str, Any]) -> str:
    """The call a stored task goes out in: its own, if a flow sends it alone; else its
    target's batch key ("" if it cannot be read)."""
    if "flow" in item or "recovering" in item:
        return f"alone:{item['task_id']}"
    if "target" not in item:
        return ""
    try:
        return _batch_key(TaskType(item["task_type"]), item["target"])
    except ValueError:  # not a target its executor could send: it fails alone, there
        return f"alone:{item['task_id']}"


@cache
def _batch_key(task_type: TaskType, target: str) -> str:
    """A stored target's batch key ("" for a type that sends a task a call); the tasks of a
    burst mostly share a target, so each is parsed once."""
    # Imported here, for crowded windows only: the finder's cold start stays without them.
    from tocsin.targets import parse_target
    from tocsin.targets.base import BatchedTarget

    parsed = parse_target(task_type, json.loads(target))
    return parsed.batch_key() if isinstance(parsed, BatchedTarget) else ""
