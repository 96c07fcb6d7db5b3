"""What the task API answers, as models: they validate each reply and describe it in the
OpenAPI document (docs/openapi.json). Requests are the domain's own models (Submission,
Change); a refusal is always an ErrorReply."""

from typing import Any

from pydantic import BaseModel, JsonValue

from tocsin.model import TaskStatus, TaskType


class Failure(BaseModel):
    type: str
    message: str


class TaskView(BaseModel):
    """A task as its owner sees it (tocsin.model.task_view)."""

    id: str
    status: TaskStatus
    version: int
    due_at: str
    type: TaskType
    target: dict[str, Any]
    payload: JsonValue
    max_attempts: int
    attempts: int
    created_at: str
    updated_at: str | None = None
    fired_at: str | None = None
    lateness_ms: int | None = None
    result: JsonValue = None
    error: Failure | None = None


class TaskPage(BaseModel):
    tasks: list[TaskView]
    next: str | None


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None


class ErrorReply(BaseModel):
    error: ErrorDetail
