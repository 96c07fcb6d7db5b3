"""What an executor's batch holds: the tasks the state machine hands it (ids, versions, due
milliseconds), each task once claimed (its target, its payload's bytes, its flow), and what
became of a task that could not be fired."""

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, Field

from tocsin.callbacks import callback_key
from tocsin.flow import Flow, Leases, RateLedger
from tocsin.holds import HostHold
from tocsin.model import TASK_ID_PATTERN, TaskType, idempotency_key
from tocsin.retry import ExhaustedBy, RetryPolicy
from tocsin.sent import Fired, Try
from tocsin.targets import Delivery, Target


class BatchTask(BaseModel):
    task_id: str = Field(pattern=TASK_ID_PATTERN)
    version: int = Field(ge=1)
    due_ms: int
    planned_ms: int = 0  # its flow's slot, when it was handed on to wake for it


class BatchEvent(BaseModel):
    """What the state machine passes: the execution, the type and the batch's ids."""

    execution: str
    task_type: TaskType
    tasks: list[BatchTask] = Field(min_length=1)


@dataclass(frozen=True)
class ClaimedTask:
    task_id: str
    version: int
    due_ms: int
    target: Target
    payload_json: bytes  # UTF-8, as a webhook sends it: no copy of a 200 KB body per send
    policy: RetryPolicy
    first_due_ms: int  # its own due time, from which its age counts (due_ms: this attempt's)
    requeues: int = 0
    # what earlier invocations tried of it (it was RETRYING): the attempts made, those a
    # throttling answer left uncounted, and the failed ones its item keeps
    attempts_before: int = 0
    throttled_before: int = 0
    tries_before: tuple[Try, ...] = ()
    flow: Flow | None = None  # the limits it shares with its key's tasks (tocsin.flow)
    planned_ms: int = 0  # its flow's slot, when later than its due time
    # Its flow held it in an earlier invocation (handed on, or a claim retried): the hold
    # counts from its due time, not from this invocation's coming.
    flow_held: bool = False
    leases: Leases | None = None  # its flow's leases in this invocation, if it limits those
    ledger: RateLedger | None = None  # where its flow's sends take their slots, if a rate
    hold: HostHold | None = None  # its owner's host, as held back if failing (tocsin.holds)

    @property
    def fires_ms(self) -> int:
        """When its gate lets it go: its due time, or its flow's slot."""
        return max(self.due_ms, self.planned_ms)

    def delivery(self, attempt: int = 1) -> Delivery:
        """The action of its `attempt`-th attempt (1 for the first)."""
        return Delivery(
            task_id=self.task_id,
            version=self.version,
            idempotency_key=(
                callback_key(self.task_id) or idempotency_key(self.task_id, self.version)
            ),
            payload_json=self.payload_json,
            attempt=attempt,
        )

    @cached_property
    def entry(self) -> dict[str, Any]:
        """Its entry of a batched target's call for its first attempt here, built once:
        `sends` sizes it, `_call` sends it (its envelope re-encodes a payload of up to
        200 KB)."""
        return self.target.entry(self.delivery(self.attempts_before + 1))  # type: ignore[attr-defined]

    def entry_for(self, attempt: int) -> dict[str, Any]:
        """Its entry for its `attempt`-th attempt (a retry's is built anew)."""
        if attempt == self.attempts_before + 1:
            return self.entry
        return self.target.entry(self.delivery(attempt))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Failed:
    error: str  # the failure's kind, as the stored error's "Error"
    cause: str
    attempts: int
    tries: tuple[Try, ...] = ()  # the attempts that failed, the last one among them
    exhausted_by: ExhaustedBy | None = None  # the limit it met, once a target was tried


@dataclass(frozen=True)
class Later:
    """A task whose target failed for now, to be tried again at `next_ms`, by an execution
    that wakes for it (RETRYING in the dispatch index): the pause was too long to spend in
    this invocation, or its time was up."""

    next_ms: int
    cause: str
    attempts: int
    throttled: int
    tries: tuple[Try, ...]
    held_on: str | None = None  # its host is held: it waits on the hold, counting no attempt


Recorded = tuple[Fired | Failed | Later, bool]  # a task's outcome, and whether its mark was written


@dataclass(frozen=True)
class Held:
    """A task this invocation claimed: what to fire (or why it cannot be), and whether an
    earlier invocation held it (taken over, or requeued by the reconciler), which may have
    sent it: the sent log is read before sending it again."""

    asked: BatchTask
    task: ClaimedTask | Failed
    held_before: bool
    ending: dict[str, Any] | None = None  # what its callbacks need of it, if it names any
