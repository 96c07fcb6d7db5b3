"""A failing host held back: when one owner's sends to one host (a webhook's host and port;
the queue, topic, bus or function of the AWS types) keep failing, its other due tasks wait
instead of each burning its attempts on it, and one task at a time probes it.

* A hold item per owner and host on the Tasks table (`~hold:<digest>`) counts failures in
  a row across the owner's tasks (FRESH_MS apart at most). The HostHoldFailures-th begins
  a hold. Per owner: one owner's failing sends cannot hold back another's tasks.
* While a host is held, one task is its prober: it is tried on its own retry policy,
  counting its attempts, as it would be alone. Every other task due for the host waits
  RETRYING, counting none: parked, `held_on` the hold (a sparse index, HeldIndex), due
  again at its policy's longest backoff at the latest. A prober that runs out of attempts
  hands the probe on to a waiting task; one that does not come back by its next attempt
  and PROBER_GRACE_MS is replaced by the next task that comes.
* Any answer that is not a failure for now (a 2xx, or a 4xx: the host is up) ends the hold.
  Its waiting tasks go again at the host's recovery rate (HostRecoveryRate), their slots
  taken from a flow ledger of their own (`tocsin.flow.RateLedger`): the same ledger that
  limits any flow's sends a second, so one mechanism says how fast a host is sent to.

A host that never failed costs one read of its hold item per invocation (none of the
task's writes), and only when HostHoldFailures is not 0."""

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from tocsin import aws, clock
from tocsin.batch_read import BATCH_GET_MAX, batch_read
from tocsin.errors import Busy
from tocsin.flow import LEDGER_DAYS
from tocsin.observability import logger

HOLD_PREFIX = "~hold:"  # no task id holds a `~`
# A caller's held hosts in the owner index, under a partition of their own: GET /targets
# reads them there, and the owner's task listing never meets them.
HOLDS_OWNER = "~holds:"
HELD_INDEX = "HeldIndex"  # the tasks waiting on a hold, by `held_on`
FRESH_MS = 60_000  # failures further apart than this are not in a row
PROBER_GRACE_MS = 60_000  # past its next attempt, a prober not back is replaced
ERROR_CHARS = 300  # of the last failure, as GET /targets shows it


def hold_id(owner: str, host: str) -> str:
    """The hold item of one owner's sends to one host: a digest, for an owner's ARN and a
    queue's URL together can be long."""
    digest = hashlib.sha256(f"{owner}\n{host}".encode()).hexdigest()[:32]
    return f"{HOLD_PREFIX}{digest}"


@dataclass
class HoldState:
    """A hold item as read: failures in a row, and while held since when and its prober."""

    failures: int = 0
    last_failure_ms: int = 0
    held_since_ms: int | None = None
    prober: str | None = None
    prober_until_ms: int = 0
    writes: int = 0  # the item's count of writes: of two replies, the later one's state holds

    @classmethod
    def of(cls, item: dict[str, Any]) -> "HoldState":
        since = item.get("held_since_ms")
        return cls(
            failures=int(item.get("failures", 0)),
            last_failure_ms=int(item.get("last_failure_ms", 0)),
            held_since_ms=None if since is None else int(since),
            prober=item.get("prober"),
            prober_until_ms=int(item.get("prober_until_ms", 0)),
            writes=int(item.get("writes", 0)),
        )


@dataclass(frozen=True)
class Park:
    """Wait on `hold`, counting no attempt: the host is held and another task probes it."""

    hold: str
    since_ms: int


class HostHold:
    """One invocation's view of one owner's host: read before the gates, kept up to date by
    its own writes, shared by its sends to that host (threads: under a lock)."""

    def __init__(self, table: Any, owner: str, host: str, task_type: str, item: dict[str, Any]):
        self._table, self.owner, self.host, self.task_type = table, owner, host, task_type
        self.id = hold_id(owner, host)
        self._refused = table.meta.client.exceptions.ConditionalCheckFailedException
        self.state = HoldState.of(item)
        self.released = False  # this invocation ended the hold: its waiting tasks go
        self.handed = False  # its prober gave up here: one waiting task probes next
        self.began = False  # this invocation's failure began it
        self._lock = threading.Lock()

    def verdict(self, task_id: str, next_ms: int, now_ms: int) -> Park | None:
        """Whether `task_id` waits (Park) or sends now (None): the host is not held, the
        task is its prober, or it is made its prober (there was none, or the last one is
        long gone; `next_ms`: when this one would be tried again, so that the next task
        knows when it is gone)."""
        with self._lock:
            state = self.state
            if state.held_since_ms is None or state.prober == task_id:
                return None
            if state.prober_until_ms >= now_ms:
                return Park(self.id, state.held_since_ms)
        if self._become_prober(task_id, next_ms, now_ms):
            return None
        with self._lock:
            since = self.state.held_since_ms
        return None if since is None else Park(self.id, since)

    def refresh(self) -> None:
        """Read the item again (before a retry: another invocation may have begun the hold
        since this one read it); unread, what is known stands."""
        resource = aws.resource("dynamodb")
        try:
            found = batch_read(resource, self._table.name, [{"task_id": self.id}])
        except (BotoCoreError, ClientError, Busy) as fault:
            logger.warning("hold not read", fault=type(fault).__name__)
            return
        if found:
            self._seen(found[0])

    def _become_prober(self, task_id: str, next_ms: int, now_ms: int) -> bool:
        return self._write(
            "prober = :me, prober_until_ms = :until",
            "attribute_exists(held_since_ms) AND "
            "(attribute_not_exists(prober_until_ms) OR prober_until_ms < :now)",
            {":me": task_id, ":until": next_ms + PROBER_GRACE_MS, ":now": now_ms},
        )

    def failed(self, task_id: str, error: str, next_ms: int, now_ms: int, threshold: int) -> None:
        """An attempt of `task_id` failed for now (it is tried again at `next_ms`, if at all):
        counted, if the host is not held; the threshold-th in a row begins the hold, with
        this task its prober. A prober's failure only says when it comes back."""
        with self._lock:
            state = self.state
        if state.held_since_ms is not None:
            if state.prober == task_id:  # so that no other task takes the probe over before
                until = next_ms + PROBER_GRACE_MS
                self._write(
                    "prober_until_ms = :until", "prober = :me", {":me": task_id, ":until": until}
                )
            return
        self._count(error, now_ms)
        with self._lock:
            state = self.state
        if state.failures >= threshold and state.held_since_ms is None:
            self._begin(task_id, next_ms, now_ms)

    def _count(self, error: str, now_ms: int) -> None:
        """One more failure in a row (the first, if the last was not fresh)."""
        values = {":now": now_ms, ":fresh": now_ms - FRESH_MS, ":error": error[:ERROR_CHARS]}
        values |= {":host": self.host, ":type": self.task_type, ":expires": _expires()}
        sets = "last_failure_ms = :now, last_error = :error, host = :host, task_type = :type, "
        sets += "expires_at = :expires"
        fresh = "last_failure_ms >= :fresh"
        while not (  # two writers that both found it stale: one starts the count, one adds
            self._write(sets, fresh, values, adds="failures :one")
            or self._write(
                f"failures = :one, {sets}", f"attribute_not_exists(failures) OR NOT {fresh}", values
            )
        ):
            pass

    def _begin(self, task_id: str, next_ms: int, now_ms: int) -> None:
        began = self._write(
            "held_since_ms = :now, held_since = :at, #o = :owner, due_ms = :now, prober = :me, "
            "prober_until_ms = :until",
            "attribute_not_exists(held_since_ms)",  # else another invocation began it
            {
                ":now": now_ms,
                ":at": clock.to_iso(now_ms),
                ":owner": f"{HOLDS_OWNER}{self.owner}",
                ":me": task_id,
                ":until": next_ms + PROBER_GRACE_MS,
            },
        )
        if began:
            self.began = True
            logger.warning("host held", host=self.host, failures=self.state.failures)

    def answered(self, now_ms: int) -> None:
        """The host answered (a send went, or it refused for good): a hold ends here (the
        first invocation to see it ends it, and wakes its waiting tasks); failures in a
        row begin again from none."""
        with self._lock:
            state = self.state
        if state.held_since_ms is not None:
            gone = "held_since_ms, held_since, #o, due_ms, prober, prober_until_ms"
            values = {":zero": 0, ":at": clock.to_iso(now_ms)}
            ended = "failures = :zero, recovered_at = :at"
            if self._write(ended, "attribute_exists(held_since_ms)", values, removes=gone):
                self.released = True
                logger.info("host released", host=self.host)
        elif state.failures:  # unless a failure count began a hold meanwhile
            self._write("failures = :zero", "attribute_not_exists(held_since_ms)", {":zero": 0})

    def hand_probe_on(self, task_id: str) -> None:
        """The prober gave up (its attempts or its age ran out): the next task may probe."""
        if self._write("prober_until_ms = :over", "prober = :me", {":me": task_id, ":over": 0}):
            self.handed = True

    def _write(
        self, sets: str, condition: str, values: dict[str, Any], adds: str = "", removes: str = ""
    ) -> bool:
        """One conditional update of the hold item, counted in its `writes`; whether it was
        made. The item as it is after (or as it was, refused) is seen."""
        update = f"SET {sets} ADD writes :one" + (f", {adds}" if adds else "")
        update += f" REMOVE {removes}" if removes else ""
        names = {"#o": "owner"} if "#o" in update else {}
        try:
            reply = self._table.update_item(
                Key={"task_id": self.id},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues={":one": 1, **values},
                **({"ExpressionAttributeNames": names} if names else {}),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except self._refused as refused:
            self._seen(_item_of(refused))
            return False
        self._seen(reply["Attributes"])
        return True

    def _seen(self, item: dict[str, Any]) -> None:
        """The item as one write left it, unless a later write's is known already: sends to
        the host answer in threads of their own, and their writes' replies in any order."""
        seen = HoldState.of(item)
        with self._lock:
            if seen.writes >= self.state.writes:
                self.state = seen


def _expires() -> int:
    """An idle hold item's time to live, as a flow's ledger items'."""
    return clock.now_ms() // 1000 + LEDGER_DAYS * 86_400


def _item_of(refused: ClientError) -> dict[str, Any]:
    """The item a refused update returned (ReturnValuesOnConditionCheckFailure), typed."""
    from boto3.dynamodb.types import TypeDeserializer

    raw = refused.response.get("Item") or {}
    return {name: TypeDeserializer().deserialize(value) for name, value in raw.items()}


def read_holds(table_name: str, wanted: dict[str, tuple[str, str, str]]) -> dict[str, HostHold]:
    """The hold items of `wanted` (hold id -> owner, host, task type), read at once before
    the gates; none read (a busy table) holds nothing back: a hold protects a host, it is
    not needed for a task to go once."""
    resource = aws.resource("dynamodb")
    table = resource.Table(table_name)
    ids = list(wanted)
    found: dict[str, dict[str, Any]] = {}
    try:
        for start in range(0, len(ids), BATCH_GET_MAX):
            keys = [{"task_id": i} for i in ids[start : start + BATCH_GET_MAX]]
            found |= {item["task_id"]: item for item in batch_read(resource, table_name, keys)}
    except (BotoCoreError, ClientError, Busy) as fault:
        logger.warning("holds not read", fault=type(fault).__name__)
    return {
        i: HostHold(table, owner, host, task_type, found.get(i, {}))
        for i, (owner, host, task_type) in wanted.items()
    }
