"""Errors a caller can cause, each with the field it concerns, and executor failure kinds.

Each `TaskError` carries the HTTP status it stands for (4xx, or 503 for `Busy`); the state
machine retries `TransientTargetError` and sends `PermanentTargetError` straight to the
dead-letter queue.
"""


class TaskError(Exception):
    """A request Tocsin refuses; `status` is the HTTP status it maps to."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidTask(TaskError):
    code = "invalid_task"


class InvalidSchedule(TaskError):
    code = "invalid_schedule"


class Unauthenticated(TaskError):
    status = 401
    code = "unauthenticated"


class NotFound(TaskError):
    """No such task or schedule for this caller: another owner's is reported the same way."""

    status = 404
    code = "not_found"


class Conflict(TaskError):
    status = 409
    code = "conflict"


class Busy(TaskError):
    """DynamoDB throttled a read past its retries: the same request may succeed soon."""

    status = 503
    code = "busy"


class TransientTargetError(Exception):
    """The target failed in a way a later attempt may not (timeouts, 5xx, throttling).
    `after_s`: when the target asked to be tried again (Retry-After), if it did; `throttled`:
    it asked to be sent less (429, or 503 with Retry-After), which counts no attempt."""

    def __init__(self, message: str, after_s: float | None = None, throttled: bool = False):
        super().__init__(message)
        self.after_s, self.throttled = after_s, throttled


class PermanentTargetError(Exception):
    """The target refused the task; retrying cannot help (4xx, bad address, missing resource)."""
