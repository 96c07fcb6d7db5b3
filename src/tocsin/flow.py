"""Flow control: a task that names a `flow` shares its key's limits with every other task
of that key, across every executor invocation at once.

* `rate`: at most that many sends in any second. A key has one ledger item on the Tasks
  table, its next free slot, slots `spacing_us` apart, and every slot is handed out by it
  once:
  - the plan: an executor plans all its batch's tasks of one key in one write once it has
    claimed them, each at its due time (or as soon as the invocation can send, if later:
    `tocsin.fire.plans.PLAN_LEAD_MS`) or the first free slot after it, and each first
    attempt goes in its slot, writing nothing more. A task so held past its due time has
    its slot written on it (`planned_ms`): the API shows when it will fire, a retry of its
    invocation keeps it, and a slot later than the invocation can wait for goes to an
    execution of its own that wakes for it (`tocsin.fire`). A ledger write a send had made
    one item the key's hot spot: a partition takes 1,000 writes a second;
  - a retry, or a send that its lease or its gate lets go later than SLOT_SLACK_MS past
    its slot (the CPU was busy), takes the next free slot (`RateLedger.ticket`: one
    atomic add) when it is ready, not long before, so an executor that falls behind takes
    none that others could use: late sends do not bunch up, and what reaches a receiver
    in any second stays within the rate, whichever invocations send. No send goes later
    than its slot allows: one late again takes a wide slot (`wide_slot`). A slot taken
    and not used is a gap, never a burst.
* `parallelism`: at most that many sends in flight at once. Each key has that many lease
  items; a send takes one (its invocation's, if one is idle there) as it is to go, and
  its invocation keeps it for a send of its own due within LEASE_KEEP_MS, else gives it
  back, as it gives back every one it kept once it is done (`Leases`). A lease ends with
  its invocation, so one that dies holds none past its time.

A task that names no flow reads and writes none of this.
"""

import bisect
import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tocsin import aws, clock
from tocsin.batch_read import batch_read
from tocsin.errors import Busy
from tocsin.flow_keys import LEASE_PART, ledger_key
from tocsin.observability import logger
from tocsin.settings import MAX_FLOW_PARALLELISM, MAX_FLOW_RATE, settings

KEY_PATTERN = r"^[A-Za-z0-9_.:/@-]{1,64}$"  # a host, a tenant, a customer id
LEDGER_DAYS = 2  # an idle key's ledger items are deleted by TTL this long after use
LEASE_POLL_MS = 50  # between looks for a free lease, while none is: doubling up to
LEASE_POLL_MAX_MS = 400
# A send done keeps its lease for a send of its invocation whose place is this near: it is
# written once when taken and once when given back, not for each send. Kept for sends
# further off, it would keep the flow's sends in other invocations waiting.
LEASE_KEEP_MS = 25
GRANT_AHEAD_MS = 2  # how long before its place in line a send is given an idle lease
# How long before its place a send with no idle lease reads the items for a free one (a read
# and a write). Sends join the line earlier; a look for the whole line had taken leases that
# then waited unused, each one more write to take and one to give back.
LOOK_AHEAD_MS = 30
# How late past its slot a gate may let a send go (a busy CPU), and how much later the
# network may bring one than another: slots are spaced wider than 1/rate by the two, so
# that what reaches a receiver in any second stays within the rate.
SLOT_SLACK_MS = 20
JITTER_MS = 20
# How long before its send is ready a send on time takes its slot: the write is done by then.
TICKET_AHEAD_MS = 100
# How late past its slot a send's last try may go (its CPU late for a slot twice): it takes
# that long's slots at once (`wide_slot`), so that it goes late beside no other send; twice
# as long as its gate was late before, if that is longer, up to LAST_SLACK_MAX_MS.
LAST_SLACK_MS = 50
LAST_SLACK_MAX_MS = 1000
TICKET_WRITE_MS = 10  # a slot's write, as first guessed: then as the last ones took


class Flow(BaseModel):
    """A task's share of a key's limits: sends a second and sends in flight at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(pattern=KEY_PATTERN)
    rate: int | None = Field(default=None, ge=1, le=MAX_FLOW_RATE)
    parallelism: int | None = Field(default=None, ge=1, le=MAX_FLOW_PARALLELISM)

    @model_validator(mode="after")
    def _limits_something(self) -> "Flow":
        if self.rate is None and self.parallelism is None:
            raise ValueError("give rate, parallelism or both")
        return self

    def stored(self) -> str:
        return self.model_dump_json(exclude_none=True)


def flow_of(item: dict[str, Any]) -> Flow | None:
    """The flow a stored task names, else its host's recovery (`recovery_flow`: it waited
    on the host's hold, and was woken), else its host's (`host_flow`), if any."""
    if "flow" in item:
        return Flow.model_validate_json(item["flow"])
    if "recovering" in item:
        return recovery_flow(item["recovering"])
    if item.get("task_type") == "webhook" and "target" in item:
        return host_flow(item["target"])
    return None


def host_flow(target: str) -> Flow | None:
    """The stack's flow for a webhook task that names none, its stored `target` (JSON)
    read only when the stack sets one (HostFlowRate, HostFlowParallelism; none when both
    are 0): keyed `host:<its URL's host>`, or that host's digest if the key would not fit
    KEY_PATTERN. Read as the task is sent, so a change holds for every task not yet sent."""
    config = settings()
    if not (config.host_flow_rate or config.host_flow_parallelism):
        return None
    host = urlsplit(json.loads(target)["url"]).hostname or ""
    key = f"host:{host}"
    if not re.fullmatch(KEY_PATTERN, key):  # a long name, or not ASCII
        key = f"host:{hashlib.sha256(host.encode()).hexdigest()[:32]}"
    return Flow(
        key=key,
        rate=config.host_flow_rate or None,
        parallelism=config.host_flow_parallelism or None,
    )


def recovery_flow(hold: str) -> Flow:
    """The flow the tasks that waited on a host's hold (`tocsin.holds`) go through once it
    ends: a ledger of the hold's own, at HostRecoveryRate, or at HostFlowRate if that is
    lower."""
    config = settings()
    rate = min(config.host_recovery_rate, config.host_flow_rate or config.host_recovery_rate)
    return Flow(key=f"recover:{hold.rsplit(':', 1)[-1]}", rate=rate)


def spacing_us(rate: int) -> int:
    """How far apart a flow's slots are: 1/rate, widened by SLOT_SLACK_MS and JITTER_MS a
    second."""
    return math.ceil(1000 * (1000 + SLOT_SLACK_MS + JITTER_MS) / rate)


def slots(dues_ms: list[int], free_us: int, rate: int) -> tuple[list[int], int]:
    """The millisecond each send may go at (each task's due time, in order, or the first
    free slot after it), and the key's next free slot after them (microseconds)."""
    interval_us = spacing_us(rate)
    planned = []
    for due_ms in dues_ms:
        slot_us = max(due_ms * 1000, free_us)
        planned.append(-(-slot_us // 1000))  # never before the slot
        free_us = slot_us + interval_us
    return planned, free_us


def wide_slot(rate: int, late_ms: int) -> tuple[int, int]:
    """How many slots in a row a send's last try takes, its gate `late_ms` late for its
    slot before, and how late past the first it may go: twice that (a CPU that late is
    likely as late again), within LAST_SLACK_MS and LAST_SLACK_MAX_MS. No slot of another
    send is nearer to it than to one of the last of them, so what reaches a receiver in
    any second stays within the rate however late it goes within that."""
    spacing = spacing_us(rate)
    slack_ms = min(max(LAST_SLACK_MS, 2 * late_ms), LAST_SLACK_MAX_MS)
    count = 1 + math.ceil((slack_ms - SLOT_SLACK_MS) * 1000 / spacing)
    return count, SLOT_SLACK_MS + (count - 1) * spacing // 1000


class RateLedger:
    """Each flow key's next free slot, on the Tasks table."""

    def __init__(self, table_name: str):
        self.table_name = table_name
        self._table = aws.resource("dynamodb").Table(table_name)
        self._refused = self._table.meta.client.exceptions.ConditionalCheckFailedException
        self._write_ms = float(TICKET_WRITE_MS)  # a moving average of `ticket`'s writes

    def lead_ms(self) -> int:
        """How far past now a send already due asks for its slot: twice what a slot's write
        takes, so that the slot is still ahead when the write returns. A send that asked
        for now was late for its slot by the write's time, and (over SLOT_SLACK_MS) took
        another, TICKET_AHEAD_MS ahead, holding its lease all along: 10 leases then carried
        about 50 sends a second (`tocsin bench --scenarios flow`, 5,000 tasks)."""
        return math.ceil(2 * self._write_ms)

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
                    Key=ledger_key(flow.key, "rate"),
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

    def ticket(self, flow: Flow, ready_ms: int, count: int = 1) -> int:
        """`count` slots in a row for one send ready at `ready_ms` that has none (a retry,
        or late for its planned one): the key's next free ones (one atomic add, which no
        other writer makes fail), or from `ready_ms` itself when the key's slots are
        behind it (those taken then are left unused, and the key's next slot moved on,
        conditionally). The millisecond the first starts."""
        began = time.monotonic()
        try:
            return self._ticket(flow, ready_ms, count)
        finally:  # a race between two sends' updates is harmless: an average either way
            took_ms = (time.monotonic() - began) * 1000
            self._write_ms = 0.8 * self._write_ms + 0.2 * took_ms

    def _ticket(self, flow: Flow, ready_ms: int, count: int) -> int:
        assert flow.rate is not None
        spacing, ready_us = count * spacing_us(flow.rate), ready_ms * 1000
        key = ledger_key(flow.key, "rate")  # the plan's: one slot, one sender
        while True:
            added = self._table.update_item(
                Key=key,
                UpdateExpression="ADD free_us :spacing SET expires_at = :expires",
                ExpressionAttributeValues={
                    ":spacing": spacing,
                    ":expires": ready_us // 1_000_000 + LEDGER_DAYS * 86_400,
                },
                ReturnValues="UPDATED_NEW",
            )
            slot_us = int(added["Attributes"]["free_us"]) - spacing
            if slot_us >= ready_us:
                return -(-slot_us // 1000)
            try:
                self._table.update_item(
                    Key=key,
                    UpdateExpression="SET free_us = :next",
                    ConditionExpression="free_us <= :ready",
                    ExpressionAttributeValues={":next": ready_us + spacing, ":ready": ready_us},
                )
                return ready_ms
            except self._refused:  # another send took slots meanwhile: the next of them
                continue


class NoLeaseInTime(Exception):
    """No lease of the flow came free by the time a send had to have one."""


@dataclass(eq=False)
class _Waiter:
    """A send waiting for a lease, at its place in line: woken when a lease comes back or
    the one before it was served, and, first in line, when its place comes or it must look
    for a lease again."""

    place_ms: int
    woken: threading.Event = field(default_factory=threading.Event)
    lease: dict[str, str] | None = None  # the lease item it sends through, once it has one


class Leases:
    """One invocation's leases of a key's `parallelism` lease items: sends through them.

    Sends wait in line for a lease, in the order of their places: the millisecond each is
    to go, or its coming (a retry; a first attempt's thread the CPU woke late still goes
    ahead of a send due after it). The first in line takes one of the invocation's idle
    leases once its place comes (GRANT_AHEAD_MS before it), not when it joins: a lease had
    ahead is held through the wait, and 10 leases each held a look-ahead long had carried
    about 50 sends a second (`tocsin bench --scenarios flow`). With none idle as its place
    nears (LOOK_AHEAD_MS), the first in line reads the items for a free one; between looks
    that found none it alone waits on a timer, the others sleep until served or out of
    time (thousands of sends woken every second to check had taken a core).

    A send done keeps its lease for a send in line whose place is near (LEASE_KEEP_MS), so
    that a lease is written once when taken and once when given back, not for each send
    (a partition takes 1,000 writes a second); else it gives it back at once. Leases kept
    for the whole line, or idle for longer, had kept the flow's sends in other invocations
    from theirs: a run of 5,000 tasks handed sends on 8,314 times for want of one. One kept
    and not taken within LEASE_KEEP_MS goes back, as does every idle one when the
    invocation is done (`close`). The items are read and written outside the lock the line
    is kept under."""

    def __init__(self, table_name: str, flow: Flow, holder: str, until_ms: int):
        assert flow.parallelism is not None
        self._dynamodb = aws.resource("dynamodb")
        self._table = self._dynamodb.Table(table_name)
        self._refused = self._table.meta.client.exceptions.ConditionalCheckFailedException
        self._flow, self._holder, self._until_ms = flow, holder, until_ms
        self._items = [ledger_key(flow.key, f"{LEASE_PART}{i}") for i in range(flow.parallelism)]
        self._held: list[dict[str, str]] = []  # lease items this invocation holds
        self._idle: list[tuple[dict[str, str], int]] = []  # held, unused since (ms): oldest first
        self._line: deque[_Waiter] = deque()  # sends waiting for a lease, by their places
        self._looking = False  # the first in line reads the items now
        self._next_look_ms = 0  # when they may be read again
        self._pause_ms = LEASE_POLL_MS  # between looks that found none, doubling to a cap
        self._keeper: threading.Timer | None = None  # gives back what stayed idle too long
        self._lock = threading.Lock()

    @contextmanager
    def sending(self, place_ms: int, by_ms: int) -> Iterator[int]:
        """Hold a lease for one send, in line at `place_ms`: the millisecond one was had,
        waited for until `by_ms` at most (then NoLeaseInTime)."""
        me = _Waiter(place_ms)
        with self._lock:
            bisect.insort_right(self._line, me, key=lambda waiter: waiter.place_ms)
        try:
            while not self._turn(me, by_ms):
                pass
        except BaseException:
            with self._lock:  # the next in line looks or is served in its place
                self._leave_line(me)
            raise
        try:
            yield clock.now_ms()
        finally:
            self._idle_again(me.lease)  # type: ignore[arg-type]

    def close(self) -> None:
        """Give back every idle lease: the invocation sends no more."""
        with self._lock:
            if self._keeper is not None:
                self._keeper.cancel()
                self._keeper = None
            idle, self._idle = [key for key, _ in self._idle], []
            self._held = [key for key in self._held if key not in idle]
        for key in idle:
            self._give_back(key)

    def _turn(self, me: _Waiter, by_ms: int) -> bool:
        """True once `me` holds a lease; else one look for free ones made (first in line,
        none idle, no look under way, its pause over) or one wait: first in line, for its
        place or the next look; else until woken or `by_ms`."""
        with self._lock:
            now = clock.now_ms()
            if now >= by_ms:
                raise NoLeaseInTime(self._flow.key)
            first = self._line[0] is me
            if first and self._idle and now >= me.place_ms - GRANT_AHEAD_MS:
                me.lease = self._idle.pop(0)[0]  # the longest idle: each one kept is used
                self._line.popleft()
                self._wake_first()
                return True
            look_ms = self._look_ms(me) if first and not self._looking else None
            looks = not self._idle and look_ms is not None and now >= look_ms
            if looks:
                self._looking = True
                held = {item["task_id"] for item in self._held}
            else:
                until_ms = by_ms
                if first and self._idle:
                    until_ms = min(me.place_ms - GRANT_AHEAD_MS, by_ms)
                elif look_ms is not None:
                    until_ms = min(look_ms, by_ms)
                me.woken.clear()
        if looks:
            self._look(held)
        else:
            me.woken.wait(max(until_ms - now, 1) / 1000)
        return False

    def _look_ms(self, me: _Waiter) -> int | None:
        """When the items may be read for `me`: once its place is within LOOK_AHEAD_MS
        (before, one of the invocation's own leases may come back for it) and a pause since
        a look that found none is over; never while every lease is this invocation's
        already (under the lock)."""
        if len(self._held) == len(self._items):
            return None
        return max(self._next_look_ms, me.place_ms - LOOK_AHEAD_MS)

    def _look(self, held: set[str]) -> None:
        """Read the items and take a free one, for the first in line: the others may have
        the leases in use when their places come. Idle until a send is served from it."""
        taken: list[dict[str, str]] = []
        try:
            taken = self._take_one(held)
        except (BotoCoreError, ClientError, Busy) as fault:  # looked at again after a pause
            logger.warning("flow leases not read", key=self._flow.key, fault=type(fault).__name__)
        finally:
            with self._lock:
                self._looking = False
                now = clock.now_ms()
                self._held += taken
                self._idle += [(key, now) for key in taken]
                self._pause_ms = (
                    LEASE_POLL_MS if taken else min(2 * self._pause_ms, LEASE_POLL_MAX_MS)
                )
                self._next_look_ms = now + (0 if taken else self._pause_ms)
                self._keep_for_a_while()
                self._wake_first()

    def _idle_again(self, key: dict[str, str]) -> None:
        """A send's lease kept for a send in line whose place is within LEASE_KEEP_MS, if
        no idle lease is kept for it already (the first in line woken to be served); else
        given back at once, for the sends of other invocations."""
        with self._lock:
            now = clock.now_ms()
            soon = bisect.bisect_right(  # the line is kept in order of places
                self._line, now + LEASE_KEEP_MS, key=lambda waiter: waiter.place_ms
            )
            if soon > len(self._idle):
                self._idle.append((key, now))
                self._keep_for_a_while()
                self._wake_first()
                return
            self._held.remove(key)
            self._wake_first()  # to look for a lease, if it waited for one of these
        self._give_back(key)

    def _keep_for_a_while(self) -> None:
        """Have the oldest idle lease given back once it has been idle LEASE_KEEP_MS, if no
        send takes it first (under the lock)."""
        if self._keeper is None and self._idle:
            left_ms = self._idle[0][1] + LEASE_KEEP_MS - clock.now_ms()
            self._keeper = threading.Timer(max(left_ms, 1) / 1000, self._give_back_unused)
            self._keeper.daemon = True
            self._keeper.start()

    def _give_back_unused(self) -> None:
        """Give back the leases idle LEASE_KEEP_MS or longer; watch the rest."""
        with self._lock:
            self._keeper = None
            kept_since = clock.now_ms() - LEASE_KEEP_MS
            unused = [key for key, since in self._idle if since <= kept_since]
            self._idle = [(key, since) for key, since in self._idle if since > kept_since]
            self._held = [key for key in self._held if key not in unused]
            self._keep_for_a_while()
            self._wake_first()
        for key in unused:
            self._give_back(key)

    def _wake_first(self) -> None:
        """Wake the first in line, to be served, look for a lease or wait for its turn
        (under the lock)."""
        if self._line:
            self._line[0].woken.set()

    def _leave_line(self, me: _Waiter) -> None:
        """`me` out of the line, the next first in line woken (under the lock)."""
        was_first = bool(self._line) and self._line[0] is me
        self._line.remove(me)
        if was_first:
            self._wake_first()

    def _take_one(self, held: set[str]) -> list[dict[str, str]]:
        """One of the lease items that is free (or whose holder's time is over), taken for
        this invocation, if one is."""
        now = clock.now_ms()
        leases = {
            lease["task_id"]: lease
            for lease in batch_read(self._dynamodb, self._table.name, self._items)
        }
        for key in self._items:
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
            return [key]
        return []

    def _give_back(self, key: dict[str, str]) -> None:
        """End this invocation's lease at once (unchecked: it ends with the invocation)."""
        with suppress(self._refused, BotoCoreError, ClientError):
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
    if flow := flow_of(item):
        view["flow"] = flow.model_dump()
    if "planned_at" in item:
        view["planned_at"] = item["planned_at"]
    if "held_ms" in item:
        view["held_ms"] = int(item["held_ms"])
    return view
