"""Flow control: a task that names a `flow` shares its key's limits with every other task
of that key, across every executor invocation at once.

* `rate`: at most that many sends a second. Each send of a key gets a slot at least
  1/rate after the key's previous one, in a ledger item per key on the Tasks table (the
  next free slot, moved by a conditional write). An executor plans the slots of all its
  batch's tasks of one key in one such write, once it has claimed them: a task's slot is
  its due time, or the first free one after it. A task held past its due time has its
  slot written on it (`planned_ms`), so the API shows when it will fire, and a retry of
  its invocation keeps the slot rather than taking another. A slot the invocation cannot
  reach in its time goes to an execution of its own that wakes for it
  (`tocsin.executor`). A slot planned and never used (its invocation failed before
  writing it) is a gap, never a burst.
* `parallelism`: at most that many sends in flight at once. Each key has that many lease
  items; an invocation takes as many as it has tasks of the key to send, sends through
  them, and gives each back once it has fewer tasks left than leases. A lease ends with
  its invocation, so one that dies holds none past its time.

A task that names no flow reads and writes none of this.
"""

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tocsin import aws, clock
from tocsin.batch_read import BATCH_GET_MAX, batch_read

KEY_PATTERN = r"^[A-Za-z0-9_.:/@-]{1,64}$"  # a host, a tenant, a customer id
MAX_RATE = 10_000  # sends a second: a slot is a whole number of microseconds apart
MAX_PARALLELISM = BATCH_GET_MAX  # a key's leases are read in one BatchGetItem
LEDGER_DAYS = 2  # an idle key's ledger items are deleted by TTL this long after use
LEASE_POLL_MS = 50  # between looks for a free lease, while none is


class Flow(BaseModel):
    """A task's share of a key's limits: sends a second and sends in flight at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(pattern=KEY_PATTERN)
    rate: int | None = Field(default=None, ge=1, le=MAX_RATE)
    parallelism: int | None = Field(default=None, ge=1, le=MAX_PARALLELISM)

    @model_validator(mode="after")
    def _limits_something(self) -> "Flow":
        if self.rate is None and self.parallelism is None:
            raise ValueError("give rate, parallelism or both")
        return self

    def stored(self) -> str:
        return self.model_dump_json(exclude_none=True)


def flow_of(item: dict[str, Any]) -> Flow | None:
    """The flow a stored task names, if any."""
    return Flow.model_validate_json(item["flow"]) if "flow" in item else None


def slots(dues_ms: list[int], free_us: int, rate: int) -> tuple[list[int], int]:
    """The millisecond each send may go at (each task's due time, in order, or the first
    free slot after it), and the key's next free slot after them (microseconds)."""
    interval_us = math.ceil(1_000_000 / rate)
    planned = []
    for due_ms in dues_ms:
        slot_us = max(due_ms * 1000, free_us)
        planned.append(-(-slot_us // 1000))  # never before the slot
        free_us = slot_us + interval_us
    return planned, free_us


def _ledger_key(key: str, part: str) -> dict[str, str]:
    """Not a task (no task id holds a `~`): one of a flow key's ledger items."""
    return {"task_id": f"~flow:{part}:{key}"}


class RateLedger:
    """Each flow key's next free slot, on the Tasks table."""

    def __init__(self, table_name: str):
        self._table = aws.resource("dynamodb").Table(table_name)
        self._refused = self._table.meta.client.exceptions.ConditionalCheckFailedException

    def plan(self, flow: Flow, dues_ms: list[int]) -> list[int]:
        """Slots for sends due at `dues_ms` (in order), taken from the key's ledger at
        once: first as if the ledger were free by the first due time, which one write
        settles when it is; else again from the slot it holds, until no other writer
        moved it in between."""
        assert flow.rate is not None
        held_us = None  # what the ledger holds, once known
        while True:
            planned, free_us = slots(dues_ms, held_us or 0, flow.rate)
            if held_us is None:
                condition = "attribute_not_exists(free_us) OR free_us <= :first"
                values: dict[str, Any] = {":first": dues_ms[0] * 1000}
            else:
                condition, values = "free_us = :held", {":held": held_us}
            try:
                self._table.update_item(
                    Key=_ledger_key(flow.key, "rate"),
                    UpdateExpression="SET free_us = :free, expires_at = :expires",
                    ConditionExpression=condition,
                    ExpressionAttributeValues={
                        ":free": free_us,
                        ":expires": free_us // 1_000_000 + LEDGER_DAYS * 86_400,
                        **values,
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return planned
            except self._refused as refused:
                held_us = int(refused.response.get("Item", {}).get("free_us", {}).get("N", 0))


class Leases:
    """One invocation's leases of a key's `parallelism` lease items: sends through them."""

    def __init__(self, table_name: str, flow: Flow, holder: str, until_ms: int, tasks: int):
        assert flow.parallelism is not None
        self._dynamodb = aws.resource("dynamodb")
        self._table = self._dynamodb.Table(table_name)
        self._refused = self._table.meta.client.exceptions.ConditionalCheckFailedException
        self._flow, self._holder, self._until_ms = flow, holder, until_ms
        self._items = [_ledger_key(flow.key, f"lease{i}") for i in range(flow.parallelism)]
        self._held: list[dict[str, str]] = []  # lease items this invocation holds
        self._free = 0  # of those, not in use by a send
        self._left = tasks  # sends still to make
        self._looked_ms = 0  # when the lease items were last read
        self._changed = threading.Condition()

    @contextmanager
    def sending(self, by_ms: int) -> Iterator[int]:
        """Hold a lease for one send: the millisecond one was free, waited for until
        `by_ms` at most (then TimeoutError)."""
        with self._changed:
            while not self._free:
                if clock.now_ms() >= by_ms:
                    raise TimeoutError(f"no lease of flow {self._flow.key!r} came free")
                if not self._take():
                    self._changed.wait(LEASE_POLL_MS / 1000)
            self._free -= 1
        try:
            yield clock.now_ms()
        finally:
            with self._changed:
                self._free += 1
                self._changed.notify()

    def done(self) -> None:
        """One send of the key made for good: a lease more than the sends left goes back."""
        with self._changed:
            self._left -= 1
            while self._free and len(self._held) > self._left:
                self._give_back(self._held.pop())
                self._free -= 1

    def release(self) -> None:
        """Give back every lease (the invocation ends)."""
        with self._changed:
            while self._held:
                self._give_back(self._held.pop())
            self._free = 0

    def _take(self) -> bool:
        """Take the leases that are free (or whose holder's time is over), up to the
        sends left; whether any was taken."""
        now = clock.now_ms()
        if len(self._held) >= self._left or now - self._looked_ms < LEASE_POLL_MS:
            return False
        self._looked_ms = now
        held = {item["task_id"] for item in self._held}
        leases = {
            lease["task_id"]: lease
            for lease in batch_read(self._dynamodb, self._table.name, self._items)
        }
        taken = 0
        for key in self._items:
            if len(self._held) >= self._left:
                break
            lease = leases.get(key["task_id"], {})
            if key["task_id"] in held or int(lease.get("until_ms", 0)) >= now:
                continue
            try:
                self._table.update_item(
                    Key=key,
                    UpdateExpression="SET holder = :me, until_ms = :until, expires_at = :expires",
                    ConditionExpression="attribute_not_exists(until_ms) OR until_ms < :now",
                    ExpressionAttributeValues={
                        ":me": self._holder,
                        ":until": self._until_ms,
                        ":now": now,
                        ":expires": self._until_ms // 1000 + LEDGER_DAYS * 86_400,
                    },
                )
            except self._refused:
                continue
            self._held.append(key)
            self._free += 1
            taken += 1
        return bool(taken)

    def _give_back(self, key: dict[str, str]) -> None:
        """End this invocation's lease at once (unchecked: it ends with the invocation)."""
        with suppress(self._refused):
            self._table.update_item(
                Key=key,
                UpdateExpression="SET until_ms = :over",
                ConditionExpression="holder = :me",
                ExpressionAttributeValues={":over": 0, ":me": self._holder},
            )


def flow_view(item: dict[str, Any]) -> dict[str, Any]:
    """What a task's view shows of its flow: the flow, and when it is planned to fire and
    how long flow control held it, once known."""
    view: dict[str, Any] = {}
    if "flow" in item:
        view["flow"] = json.loads(item["flow"])
    if "planned_at" in item:
        view["planned_at"] = item["planned_at"]
    if "held_ms" in item:
        view["held_ms"] = int(item["held_ms"])
    return view
