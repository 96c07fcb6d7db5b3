"""`tocsin.Client`: typed calls to the API, SigV4-signed, or to `tocsin serve` locally.

    from tocsin import Client
    tocsin = Client("https://abc123.execute-api.eu-west-1.amazonaws.com")
    task = tocsin.submit(type="webhook", target={"url": "https://example.com/hook"}, delay=90)
    daily = tocsin.create_schedule(
        expression="cron(0 9 ? * MON-FRI *)", timezone="Europe/Berlin",
        type="webhook", target={"url": "https://example.com/report"},
    )

Credentials come from boto3's usual chain. With `principal=`, requests go unsigned and
name the caller in `X-Tocsin-Principal`, which only `tocsin serve` honours.
"""

import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from pydantic import BaseModel, ConfigDict

from tocsin.api_models import BulkView, HeldTargets, ScheduleView, TaskView
from tocsin.api_models import TaskSummary as ApiTaskSummary

_UNSET: Any = object()
Moments = list[datetime]  # (inside Client, `list` is its method)
RETRY = urllib3.Retry(
    total=3,
    backoff_factor=0.5,
    status_forcelist=(429, 502, 503, 504),
    # Every call is safe to repeat: a submit carries its id, so a repeat is recognised.
    allowed_methods=None,
    raise_on_status=False,
)


class TaskSummary(ApiTaskSummary):
    """A task as a listing shows it (tocsin.api_models.TaskSummary), its times as
    datetimes: all but its target and payload (`Client.get` has them)."""

    model_config = ConfigDict(extra="allow")

    status: str  # a status newer than this client still reads
    type: str
    due_at: datetime
    created_at: datetime
    updated_at: datetime | None = None
    fired_at: datetime | None = None
    planned_at: datetime | None = None


class Task(TaskSummary, TaskView):
    """A task as the API shows it (tocsin.api_models.TaskView), its times as datetimes."""


class TaskPage(BaseModel):
    tasks: list[TaskSummary]
    next: str | None = None


class Schedule(ScheduleView):
    """A schedule as the API shows it (tocsin.api_models.ScheduleView), times as datetimes."""

    model_config = ConfigDict(extra="allow")

    state: str  # a state newer than this client still reads
    type: str
    start_at: datetime | None
    end_at: datetime | None
    next_due_at: datetime | None
    created_at: datetime
    updated_at: datetime | None = None
    last_fired_at: datetime | None = None


class SchedulePage(BaseModel):
    schedules: list[Schedule]
    next: str | None = None


class ApiError(Exception):
    """The API refused a request; `field` names the input at fault, when there is one."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.field = status, code, message, field


class InvalidRequest(ApiError):
    """400: the body or query is not acceptable."""


class NotAuthorized(ApiError):
    """401 or 403: unsigned, wrongly signed, or not allowed by IAM."""


class NotFound(ApiError):
    """404: no such task for this caller."""


class Conflict(ApiError):
    """409: the id is taken by another body, or the task is past cancelling or rescheduling."""


class Throttled(ApiError):
    """429 after the client's own retries."""


class ServerError(ApiError):
    """5xx after the client's own retries."""


def _error_class(status: int) -> type[ApiError]:
    by_status = {400: InvalidRequest, 401: NotAuthorized, 403: NotAuthorized}
    by_status |= {404: NotFound, 409: Conflict, 429: Throttled}
    return by_status.get(status, ServerError if status >= 500 else ApiError)


def _when(value: datetime | str) -> str:
    return value.isoformat() if isinstance(value, datetime) else value


def _timing(due_at: datetime | str | None, delay: float | timedelta | None) -> dict[str, Any]:
    """The time fields of a body: `due_at` as ISO-8601, `delay` in seconds, when given."""
    timing: dict[str, Any] = {}
    if due_at is not None:
        timing["due_at"] = _when(due_at)
    if delay is not None:
        timing["delay"] = delay.total_seconds() if isinstance(delay, timedelta) else delay
    return timing


def _times(**times: datetime | str | None) -> dict[str, str]:
    return {name: _when(value) for name, value in times.items() if value is not None}


def _schedule_path(schedule_id: str) -> str:
    return f"/schedules/{quote(schedule_id, safe='')}"


def signer_for(url: str, region: str | None = None, session: Any = None) -> Any:
    """SigV4 for execute-api with boto3's usual credentials; the region from an
    execute-api URL when not given, else the session's."""
    import boto3
    from botocore.auth import SigV4Auth

    session = session or boto3.Session()
    parts = (urlsplit(url).hostname or "").split(".")
    if region is None and len(parts) > 3 and parts[1] == "execute-api":
        region = parts[2]
    credentials = session.get_credentials()
    if credentials is None:
        raise NotAuthorized(401, "no_credentials", "no AWS credentials found to sign with")
    return SigV4Auth(credentials, "execute-api", region or session.region_name)


def signed_headers(
    signer: Any, method: str, url: str, data: bytes | None, headers: dict[str, str]
) -> dict[str, str]:
    """`headers` and the signature of the request (Authorization, X-Amz-Date, ...)."""
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, data=data, headers=headers)
    signer.add_auth(request)
    return dict(request.headers.items())


class Client:
    def __init__(
        self,
        url: str,
        *,
        principal: str | None = None,
        region: str | None = None,
        session: Any = None,
        timeout_s: float = 10.0,
    ):
        self.url = url.rstrip("/")
        self.principal = principal
        self._http = urllib3.PoolManager(retries=RETRY, timeout=timeout_s)
        self._signer = None if principal else signer_for(self.url, region, session)

    # -- the endpoints ---------------------------------------------------------------------

    def submit(
        self,
        *,
        type: str,
        target: dict[str, Any],
        payload: Any = None,
        due_at: datetime | str | None = None,
        delay: float | timedelta | None = None,
        id: str | None = None,
        max_attempts: int | None = None,
        on_success: dict[str, Any] | None = None,
        on_failure: dict[str, Any] | None = None,
        flow: dict[str, Any] | None = None,
        retry: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> Task:
        """Schedule a task; without `id` one is made here, so a retried call cannot double it.
        `on_success` and `on_failure` ({"type", "target"}) are told the outcome once it ends
        so; `flow` ({"key", "rate", "parallelism"}) shares its limits with the key's tasks;
        `retry` ({"max_attempts", "max_age_s", "min_backoff_s", "max_backoff_s"}) says how
        a failing target is tried again; `tags` ({key: value}, ten at most) are for
        `list(tags=...)` to find it by."""
        body: dict[str, Any] = {"id": id or uuid.uuid4().hex, "type": type, "target": target}
        body |= {"payload": payload, **_timing(due_at, delay)}
        given = {
            "max_attempts": max_attempts,
            "on_success": on_success,
            "on_failure": on_failure,
            "flow": flow,
            "retry": retry,
            "tags": tags,
        }
        body |= {name: value for name, value in given.items() if value is not None}
        return Task.model_validate(self._call("POST", "/tasks", body))

    def get(self, task_id: str) -> Task:
        return Task.model_validate(self._call("GET", f"/tasks/{quote(task_id, safe='')}"))

    def list(
        self,
        *,
        status: str | None = None,
        schedule: str | None = None,
        due_before: datetime | str | None = None,
        due_after: datetime | str | None = None,
        limit: int | None = None,
        next: str | None = None,
        order: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> TaskPage:
        """One page of the caller's tasks (or one schedule's occurrences), earliest due
        first (`order="desc"`: latest first); with `tags`, those carrying each of them."""
        query = {"status": status, "schedule": schedule, "limit": limit, "next": next}
        query["order"] = order
        query |= {f"tag[{key}]": value for key, value in (tags or {}).items()}
        query |= {
            "due_before": _when(due_before) if due_before is not None else None,
            "due_after": _when(due_after) if due_after is not None else None,
        }
        present = {name: value for name, value in query.items() if value is not None}
        target = "/tasks" + (f"?{urlencode(present)}" if present else "")
        return TaskPage.model_validate(self._call("GET", target))

    def iter_tasks(self, **filters: Any) -> Iterator[TaskSummary]:
        """Every task matching `list`'s filters, page after page."""
        page = self.list(**filters)
        yield from page.tasks
        while page.next:
            page = self.list(**filters, next=page.next)
            yield from page.tasks

    def cancel(self, task_id: str) -> Task:
        return Task.model_validate(self._call("DELETE", f"/tasks/{quote(task_id, safe='')}"))

    def retry(self, task_id: str) -> Task:
        """Fire a FAILED task again, as its next version."""
        return Task.model_validate(self._call("POST", f"/tasks/{quote(task_id, safe='')}/retry"))

    def targets(self) -> HeldTargets:
        """Your hosts held back for failing, and how many tasks wait on each."""
        return HeldTargets.model_validate(self._call("GET", "/targets"))

    def reschedule(
        self,
        task_id: str,
        *,
        due_at: datetime | str | None = None,
        delay: float | timedelta | None = None,
        payload: Any = _UNSET,
    ) -> Task:
        """Move a task not yet fired to a new time and/or payload (its version goes up)."""
        body = _timing(due_at, delay)
        if payload is not _UNSET:
            body["payload"] = payload
        path = f"/tasks/{quote(task_id, safe='')}"
        return Task.model_validate(self._call("PATCH", path, body))

    def create_schedule(
        self,
        *,
        expression: str,
        type: str,
        target: dict[str, Any],
        payload: Any = None,
        timezone: str = "UTC",
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        catch_up: str = "skip",
        id: str | None = None,
        max_attempts: int | None = None,
        retry: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> Schedule:
        """A recurring schedule; without `id` one is made here, so a retry cannot double it.
        `retry` and `tags` are each occurrence's, as a task's."""
        body: dict[str, Any] = {"id": id or uuid.uuid4().hex, "expression": expression}
        body |= {"timezone": timezone, "type": type, "target": target, "payload": payload}
        body |= {"catch_up": catch_up, **_times(start_at=start_at, end_at=end_at)}
        given = {"max_attempts": max_attempts, "retry": retry, "tags": tags}
        body |= {name: value for name, value in given.items() if value is not None}
        return Schedule.model_validate(self._call("POST", "/schedules", body))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return Schedule.model_validate(self._call("GET", _schedule_path(schedule_id)))

    def list_schedules(self, *, limit: int | None = None, next: str | None = None) -> SchedulePage:
        """One page of the caller's schedules, by id."""
        present = {name: v for name, v in (("limit", limit), ("next", next)) if v is not None}
        target = "/schedules" + (f"?{urlencode(present)}" if present else "")
        return SchedulePage.model_validate(self._call("GET", target))

    def upcoming(self, schedule_id: str, count: int = 10) -> Moments:
        """The schedule's next `count` occurrences after now."""
        reply = self._call("GET", f"{_schedule_path(schedule_id)}/upcoming?count={count}")
        return [datetime.fromisoformat(moment) for moment in reply["occurrences"]]

    def update_schedule(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change any of create_schedule's fields (None clears start_at or end_at)."""
        for name in ("start_at", "end_at"):
            if isinstance(changes.get(name), datetime):
                changes[name] = _when(changes[name])
        return Schedule.model_validate(self._call("PATCH", _schedule_path(schedule_id), changes))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self.update_schedule(schedule_id, state="PAUSED")

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return self.update_schedule(schedule_id, state="ENABLED")

    def delete_schedule(self, schedule_id: str) -> Schedule:
        """Delete a schedule (its unclaimed occurrences are cancelled); it as it was."""
        return Schedule.model_validate(self._call("DELETE", _schedule_path(schedule_id)))

    def bulk(
        self,
        action: str,
        *,
        tags: dict[str, str] | None = None,
        status: Sequence[str] | None = None,
        due_before: datetime | str | None = None,
        due_after: datetime | str | None = None,
        dry_run: bool = False,
        client_token: str | None = None,
    ) -> BulkView:
        """Start cancelling (`cancel`) or retrying (`retry`) every task the filter matches, as
        a job that goes on after the call: `bulk_progress` shows it. A cancel also deletes
        every schedule carrying `tags`. The same `client_token` again answers the same job."""
        wanted = {"tags": tags, "status": status} | _times(
            due_before=due_before, due_after=due_after
        )
        body: dict[str, Any] = {
            "action": action,
            "filter": {name: value for name, value in wanted.items() if value is not None},
            "dry_run": dry_run,
        }
        if client_token is not None:
            body["client_token"] = client_token
        return BulkView.model_validate(self._call("POST", "/bulk", body))

    def bulk_progress(self, bulk_id: str) -> BulkView:
        return BulkView.model_validate(self._call("GET", f"/bulk/{quote(bulk_id, safe='')}"))

    # -- the wire --------------------------------------------------------------------------

    def _call(self, method: str, target: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.principal:
            headers["X-Tocsin-Principal"] = self.principal
        url = self.url + target
        if self._signer is not None:
            headers = signed_headers(self._signer, method, url, data, headers)
        reply = self._http.request(method, url, body=data, headers=headers)
        try:
            decoded = json.loads(reply.data or b"null")
        except ValueError:
            decoded = None
        if reply.status < 400:
            return decoded
        error = decoded.get("error") if isinstance(decoded, dict) else None
        if not isinstance(error, dict):  # API Gateway's own replies: {"message": "..."}
            message = decoded.get("message") if isinstance(decoded, dict) else None
            message = message or reply.data.decode(errors="replace")
            error = {"code": "http_error", "message": message}
        raise _error_class(reply.status)(
            reply.status, error.get("code", ""), error.get("message", ""), error.get("field")
        )
