"""What the API answers, as models: they validate each reply and describe it in the
OpenAPI document (docs/openapi.json). Requests are the domain's own models (Submission,
Change); a refusal is always an ErrorReply."""

from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue

from tocsin.callbacks import Callback
from tocsin.flow import Flow
from tocsin.model import TaskStatus, TaskType
from tocsin.retry import ExhaustedBy, RetryPolicy


class Failure(BaseModel):
    type: str
    message: str


class TaskSummary(BaseModel):
    """A task in a listing: all but its target and payload (tocsin.model.task_summary)."""

    id: str
    status: TaskStatus
    version: int
    due_at: str
    type: TaskType
    max_attempts: int  # retry's
    retry: RetryPolicy
    attempts: int
    created_at: str
    updated_at: str | None = None
    next_attempt_at: str | None = None  # RETRYING: when it is tried again
    exhausted_by: ExhaustedBy | None = None  # FAILED after attempts: the limit it met
    fired_at: str | None = None
    lateness_ms: int | None = None
    result: JsonValue = None
    error: Failure | None = None
    flow: Flow | None = None  # the limits it shares with its key's tasks (tocsin.flow)
    planned_at: str | None = None  # when flow control lets it go, once held past due_at
    held_ms: int | None = None  # how long flow control held it past due_at
    tags: dict[str, str] | None = None  # its own, or its schedule's (tocsin.tags)


class FailedTry(BaseModel):
    """An attempt that failed: when it began (its gate, for the first) and why."""

    at: str
    error: str


class TaskView(TaskSummary):
    """A task as its owner sees it, target and payload too (tocsin.model.task_view)."""

    target: dict[str, Any]
    payload: JsonValue
    execution: str | None = None  # the name of the Step Functions execution that claimed it
    tries: list[FailedTry] | None = None  # the attempts that failed, earliest first
    on_success: Callback | None = None  # told the outcome once the task SUCCEEDED
    on_failure: Callback | None = None  # once it FAILED (tocsin.callbacks)
    callback_of: str | None = None  # a callback task's: the task whose outcome it tells


class TaskPage(BaseModel):
    """A page of a listing: summaries, up to `limit` and MAX_PAGE_BYTES of them."""

    tasks: list[TaskSummary]
    next: str | None


class ScheduleView(BaseModel):
    """A recurring schedule as its owner sees it (tocsin.schedules.schedule_view)."""

    id: str
    expression: str
    timezone: str
    start_at: str | None
    end_at: str | None
    type: TaskType
    target: dict[str, Any]
    payload: JsonValue
    max_attempts: int  # retry's
    retry: RetryPolicy  # each occurrence's
    catch_up: Literal["skip", "latest"]
    state: Literal["ENABLED", "PAUSED", "COMPLETED"]
    revision: int
    next_due_at: str | None
    occurrences: int
    missed: int
    created_at: str
    updated_at: str | None = None
    last_fired_at: str | None = None
    on_success: Callback | None = None  # each occurrence's (tocsin.callbacks)
    on_failure: Callback | None = None
    flow: Flow | None = None  # each occurrence's (tocsin.flow)
    tags: dict[str, str] | None = None  # each occurrence's


class SchedulePage(BaseModel):
    schedules: list[ScheduleView]
    next: str | None


class Upcoming(BaseModel):
    id: str
    occurrences: list[str]


class HeldHost(BaseModel):
    """A host held back for failing: its other tasks wait while one task probes it."""

    host: str = Field(description="a webhook's host and port; a queue, topic, bus or function")
    task_type: str
    held_since: str
    failures: int = Field(description="failed sends in a row when it was last written")
    last_error: str | None
    waiting: int = Field(description="your tasks waiting on it (counted up to 10 index pages)")


class HeldTargets(BaseModel):
    held: list[HeldHost]


class BulkView(BaseModel):
    """A bulk action's job: what it matched, did and could not do so far."""

    bulk_id: str
    action: str
    filter: dict[str, JsonValue]
    dry_run: bool
    state: str = Field(description="RUNNING, then DONE")
    matched: int = Field(description="tasks the filter matched, in the statuses acted on")
    done: int = Field(description="tasks cancelled or retried (none in a dry run)")
    failed: int = Field(description="matched tasks that changed before they were acted on")
    schedules_deleted: int = Field(description="a cancel's schedules carrying its tags")
    created_at: str
    updated_at: str


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None


class ErrorReply(BaseModel):
    error: ErrorDetail
