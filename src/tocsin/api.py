"""The API behind API Gateway's HTTP API (IAM auth): tasks and recurring schedules, routed
to the domain, errors as JSON.

The caller is the IAM principal API Gateway authenticated; its tasks and schedules are the
only ones it can see or change. Powertools validates each request against the domain's
models and each reply against tocsin.api_models, and describes both in the OpenAPI document
(`tocsin openapi`, docs/openapi.json). Every refusal is `{"error": {"code", "message",
"field"}}` with a 4xx.
"""

import base64
import json
import re
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from botocore.exceptions import ClientError

from tocsin import aws
from tocsin.api_models import (
    BulkView,
    ErrorReply,
    HeldTargets,
    SchedulePage,
    ScheduleView,
    TaskPage,
    TaskView,
    Upcoming,
)
from tocsin.bulk import BulkRequest, get_bulk, queue_job, start_bulk
from tocsin.errors import Busy, TaskError, Unauthenticated
from tocsin.lifecycle import (
    MAX_PAGE,
    Change,
    cancel_task,
    get_task,
    held_targets,
    list_tasks,
    reschedule_task,
    retry_task,
)
from tocsin.model import SCHEDULE_ID_PATTERN, TASK_ID_PATTERN, TaskStatus, owner_id
from tocsin.observability import logger
from tocsin.recurrence import MAX_UPCOMING
from tocsin.schedules import (
    ScheduleChange,
    ScheduleSpec,
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    upcoming,
    update_schedule,
)
from tocsin.settings import settings
from tocsin.store import BUSY
from tocsin.submit import Submission, submit_task
from tocsin.tags import MAX_TAGS, TAG_PATTERN
from tocsin.targets import TARGETS

app = APIGatewayHttpResolver(enable_validation=True)
# The path's task id, named `id` as in the template's routes (and in refusals).
TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN)]
ScheduleId = Annotated[str, Path(pattern=SCHEDULE_ID_PATTERN)]

REFUSALS = {
    HTTPStatus.BAD_REQUEST: "invalid input, the field named",
    HTTPStatus.UNAUTHORIZED: "no IAM identity",
    HTTPStatus.NOT_FOUND: "no such task or schedule for this caller, or no such route",
    HTTPStatus.CONFLICT: "the id is taken by another body, the task is claimed already (or, "
    "to retry, not FAILED), or the schedule changed meanwhile",
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: "a body that is not JSON (Content-Type: application/json)",
    HTTPStatus.SERVICE_UNAVAILABLE: "DynamoDB throttled the request past its retries: send "
    "the same request again",
}


def _replies(success: dict[int, tuple[str, type]], *refused: int) -> dict[int, Any]:
    """The `responses` of a route: its successes and its refusals, each with its model;
    every route reads or writes DynamoDB, so each may be refused as busy (503)."""
    refusals = (*refused, HTTPStatus.SERVICE_UNAVAILABLE)
    replies = {**success, **{status: (REFUSALS[status], ErrorReply) for status in refusals}}
    return {
        int(status): {"description": text, "content": {"application/json": {"model": model}}}
        for status, (text, model) in replies.items()
    }


# What a POST that creates may be refused with: bad, unsigned, another body, not JSON.
REFUSED_POSTS = (400, 401, 409, 415)


def _reply(status: int, body: dict[str, Any]) -> Response[Any]:
    return Response(status, content_types.APPLICATION_JSON, body)


def _error(status: int, code: str, message: str, field: str | None = None) -> Response[Any]:
    return _reply(status, {"error": {"code": code, "message": message, "field": field}})


def _caller() -> str:
    principal = app.current_event.request_context.authorizer.iam.user_id
    if not principal:
        raise Unauthenticated("the request carries no IAM identity")
    return owner_id(principal)


@app.post(
    "/tasks",
    summary="Schedule a task (the same id and body again: the task as stored)",
    responses=_replies(
        {201: ("scheduled", TaskView), 200: ("already scheduled", TaskView)}, *REFUSED_POSTS
    ),
)
def submit(submission: Annotated[Submission, Body()]) -> Response[TaskView]:
    submitted = submit_task(submission, _caller(), settings())
    status = HTTPStatus.CREATED if submitted.created else HTTPStatus.OK
    logger.info("submitted", task_id=submitted.task["id"], new=submitted.created)
    return _reply(status, submitted.task)


@app.get(
    "/tasks",
    summary="Your tasks, earliest (or latest) due first, a page at a time",
    responses=_replies({200: ("one page", TaskPage)}, 400, 401),
)
def list_(
    status: Annotated[TaskStatus | None, Query()] = None,
    schedule: Annotated[
        str | None, Query(pattern=SCHEDULE_ID_PATTERN, description="one schedule's occurrences")
    ] = None,
    due_before: Annotated[str | None, Query(description="ISO-8601, with a zone")] = None,
    due_after: Annotated[str | None, Query(description="ISO-8601, with a zone")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    next: Annotated[
        str | None,
        Query(
            description="from the previous page (with `status`, a page may hold fewer than"
            " `limit` tasks, or none, and still have a next)"
        ),
    ] = None,
    order: Annotated[
        Literal["asc", "desc"], Query(description="asc: earliest due first; desc: latest first")
    ] = "asc",
) -> Response[TaskPage]:
    query = app.current_event.query_string_parameters or {}  # all of it: unknown names refused
    return _reply(HTTPStatus.OK, list_tasks(query, _caller(), settings()))


@app.get(
    "/tasks/<id>",
    summary="A task: its status, lateness, result or error",
    responses=_replies({200: ("the task", TaskView)}, 400, 401, 404),
)
def get(id: TaskId) -> Response[TaskView]:
    return _reply(HTTPStatus.OK, get_task(id, _caller(), settings()))


@app.delete(
    "/tasks/<id>",
    summary="Cancel a task not yet claimed",
    responses=_replies({200: ("cancelled", TaskView)}, 400, 401, 404, 409),
)
def cancel(id: TaskId) -> Response[TaskView]:
    task = cancel_task(id, _caller(), settings())
    logger.info("cancelled", task_id=id)
    return _reply(HTTPStatus.OK, task)


@app.patch(
    "/tasks/<id>",
    summary="Move a task not yet claimed and/or replace its payload (its next version)",
    responses=_replies({200: ("rescheduled", TaskView)}, 400, 401, 404, 409, 415),
)
def reschedule(id: TaskId, change: Annotated[Change, Body()]) -> Response[TaskView]:
    task = reschedule_task(id, change, _caller(), settings())
    logger.info("rescheduled", task_id=id, version=task["version"])
    return _reply(HTTPStatus.OK, task)


@app.post(
    "/tasks/<id>/retry",
    summary="Fire a FAILED task again, as its next version (its attempts start over)",
    responses=_replies({200: ("retried", TaskView)}, 400, 401, 404, 409),
)
def retry(id: TaskId) -> Response[TaskView]:
    task = retry_task(id, _caller(), settings())
    logger.info("retried", task_id=id, version=task["version"])
    return _reply(HTTPStatus.OK, task)


@app.post(
    "/schedules",
    summary="Create a recurring schedule (the same id and body again: the schedule as stored)",
    responses=_replies(
        {201: ("created", ScheduleView), 200: ("already created", ScheduleView)}, *REFUSED_POSTS
    ),
)
def create(spec: Annotated[ScheduleSpec, Body()]) -> Response[ScheduleView]:
    schedule, created = create_schedule(spec, _caller(), settings())
    logger.info("schedule created", schedule_id=schedule["id"], new=created)
    return _reply(HTTPStatus.CREATED if created else HTTPStatus.OK, schedule)


@app.get(
    "/schedules",
    summary="Your schedules by id, a page at a time",
    responses=_replies({200: ("one page", SchedulePage)}, 400, 401),
)
def list_all(
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    next: Annotated[str | None, Query(description="from the previous page")] = None,
) -> Response[SchedulePage]:
    query = app.current_event.query_string_parameters or {}
    return _reply(HTTPStatus.OK, list_schedules(query, _caller(), settings()))


@app.get(
    "/schedules/<id>",
    summary="A schedule: its state, next occurrence, last fire and counts",
    responses=_replies({200: ("the schedule", ScheduleView)}, 400, 401, 404),
)
def read(id: ScheduleId) -> Response[ScheduleView]:
    return _reply(HTTPStatus.OK, get_schedule(id, _caller(), settings()))


@app.get(
    "/schedules/<id>/upcoming",
    summary="The schedule's next occurrences after now (ISO-8601 UTC, milliseconds)",
    responses=_replies({200: ("the next occurrences", Upcoming)}, 400, 401, 404),
)
def preview(
    id: ScheduleId, count: Annotated[int, Query(ge=1, le=MAX_UPCOMING)] = 10
) -> Response[Upcoming]:
    return _reply(HTTPStatus.OK, upcoming(id, count, _caller(), settings()))


@app.patch(
    "/schedules/<id>",
    summary="Edit a schedule, or pause and resume it (state); its next revision",
    responses=_replies({200: ("changed", ScheduleView)}, 400, 401, 404, 409, 415),
)
def change(id: ScheduleId, change: Annotated[ScheduleChange, Body()]) -> Response[ScheduleView]:
    schedule = update_schedule(id, change, _caller(), settings())
    logger.info("schedule changed", schedule_id=id, revision=schedule["revision"])
    return _reply(HTTPStatus.OK, schedule)


@app.delete(
    "/schedules/<id>",
    summary="Delete a schedule; its occurrences not yet claimed are cancelled",
    responses=_replies({200: ("deleted (as it was)", ScheduleView)}, 400, 401, 404),
)
def remove(id: ScheduleId) -> Response[ScheduleView]:
    schedule = delete_schedule(id, _caller(), settings())
    logger.info("schedule deleted", schedule_id=id)
    return _reply(HTTPStatus.OK, schedule)


@app.get(
    "/targets",
    summary="Your hosts held back for failing: since when, and how many tasks wait on each",
    responses=_replies({200: ("the held hosts", HeldTargets)}, 401),
)
def targets() -> Response[HeldTargets]:
    return _reply(HTTPStatus.OK, held_targets(_caller(), settings()))


BulkId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


@app.post(
    "/bulk",
    summary="Cancel or retry every task a filter matches, as a job that goes on after this",
    responses=_replies(
        {202: ("started", BulkView), 200: ("started already, under this client_token", BulkView)},
        *REFUSED_POSTS,
    ),
)
def bulk(request: Annotated[BulkRequest, Body()]) -> Response[BulkView]:
    config = settings()
    job, new = start_bulk(request, _caller(), config, lambda bulk_id: queue_job(bulk_id, config))
    logger.info("bulk action", bulk_id=job["bulk_id"], action=request.action, new=new)
    return _reply(HTTPStatus.ACCEPTED if new else HTTPStatus.OK, job)


@app.get(
    "/bulk/<id>",
    summary="A bulk action's progress: matched, done, failed",
    responses=_replies({200: ("the job", BulkView)}, 400, 401, 404),
)
def bulk_progress(id: BulkId) -> Response[BulkView]:
    return _reply(HTTPStatus.OK, get_bulk(id, _caller(), settings()))


@app.exception_handler(TaskError)
def refused(error: TaskError) -> Response[Any]:
    logger.info("refused", code=error.code, field=error.field)
    return _error(error.status, error.code, error.message, error.field)


@app.exception_handler(ClientError)
def throttled(error: ClientError) -> Response[Any]:
    """DynamoDB throttled a write (or a read) past botocore's retries: 503, which a client
    retries, where the request may well pass a moment later; a throttled write wrote
    nothing. Any other refusal is raised as it is (500)."""
    if not aws.is_throttling(error):
        raise error
    return refused(Busy(BUSY))


@app.exception_handler(RequestValidationError)
def invalid_request(error: RequestValidationError) -> Response[Any]:
    """Powertools' validation, told as the domain tells its own: the first error's field
    (where it sits in the body or query) and pydantic's message."""
    first = error.errors()[0]
    code = "invalid_schedule" if app.current_event.path.startswith("/schedules") else "invalid_task"
    if first["type"] == "json_invalid":
        field, message = "body", "body: not valid JSON"
    else:
        field = ".".join(str(part) for part in first["loc"][1:]) or "body"
        message = f"{field}: {first['msg']}"
    logger.info("refused", code=code, field=field)
    return _error(HTTPStatus.BAD_REQUEST, code, message, field)


JSON_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}

# The methods of each path, for a 405 (API Gateway answers 404 before the function on AWS).
METHODS = {
    re.compile(r"/tasks"): "GET, POST",
    re.compile(r"/tasks/[^/]+"): "DELETE, GET, PATCH",
    re.compile(r"/tasks/[^/]+/retry"): "POST",
    re.compile(r"/schedules"): "GET, POST",
    re.compile(r"/schedules/[^/]+"): "DELETE, GET, PATCH",
    re.compile(r"/schedules/[^/]+/upcoming"): "GET",
    re.compile(r"/targets"): "GET",
    re.compile(r"/bulk"): "POST",
    re.compile(r"/bulk/[^/]+"): "GET",
}


@app.not_found
def no_route(_: NotFoundError) -> Response[Any]:
    method, path = app.current_event.http_method, app.current_event.path
    for pattern, allowed in METHODS.items():
        if pattern.fullmatch(path):
            reply = _error(
                HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{path} allows {allowed}"
            )
            reply.headers["Allow"] = allowed
            return reply
    return _error(HTTPStatus.NOT_FOUND, "no_route", f"no route {method} {path}")


def resolve(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Answer one request. A body is read as one JSON object only, refused here otherwise:
    Powertools would parse another media type as a form or as multipart, and validates a
    JSON array against a route's model by its first element (two tasks in one POST made
    the first and dropped the second: powertools-lambda-python issue 8057)."""
    refusal = _refused_body(event)
    if refusal is None:
        return app.resolve(event, context)
    return {
        "statusCode": refusal.status_code,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json.dumps(refusal.body),
    }


def _refused_body(event: dict[str, Any]) -> Response[Any] | None:
    """The refusal of a body that is not JSON, or JSON but not an object; None if it may
    pass (no body, an object, or JSON Powertools refuses as such)."""
    body = event.get("body")
    if not body:
        return None
    media_type = (event.get("headers") or {}).get("content-type", "").split(";")[0].strip()
    if media_type not in ("", content_types.APPLICATION_JSON):
        message = f"body: send JSON (Content-Type: application/json), not {media_type}"
        return _error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message, "body")
    try:
        raw = base64.b64decode(body) if event.get("isBase64Encoded") else body
        value = json.loads(raw)
    except ValueError:
        return None  # Powertools says it is not valid JSON
    if isinstance(value, dict):
        return None
    path = event.get("rawPath") or event.get("requestContext", {}).get("http", {}).get("path", "")
    code = "invalid_schedule" if path.startswith("/schedules") else "invalid_task"
    message = f"body: send one JSON object, not {JSON_KINDS[type(value)]}"
    return _error(HTTPStatus.BAD_REQUEST, code, message, "body")


# `tag[<key>]=<value>`, which Powertools' parameters cannot say: OpenAPI's deepObject.
TAG_PARAMETER = {
    "name": "tag",
    "in": "query",
    "required": False,
    "style": "deepObject",
    "explode": True,
    "description": "tasks carrying each of these tags: tag[key]=value, up to ten",
    "schema": {
        "type": "object",
        "maxProperties": MAX_TAGS,
        "propertyNames": {"pattern": TAG_PATTERN},
        "additionalProperties": {"type": "string", "pattern": TAG_PATTERN},
    },
}


# The schemas whose `target` is the one of their `type` (a PATCH of a schedule may change
# its target alone, so ScheduleChange's stays an object: its type is the schedule's).
TYPED_TARGETS = ("Submission", "ScheduleSpec", "Callback", "TaskView", "ScheduleView")


def _type_targets(schemas: dict[str, Any]) -> None:
    """Each of TYPED_TARGETS chooses its target's schema by its `type`: one of a schema
    per type (`WebhookTask`: `type` "webhook" and a WebhookTarget), with a discriminator,
    so that generated clients and Swagger UI show each type's fields. Powertools knows
    the target only as an object: the models validate it by type (tocsin.targets)."""
    choices = {}
    for task_type, model in TARGETS.items():
        target = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(target.pop("$defs", {}))
        schemas[model.__name__] = target
        name = f"{model.__name__.removesuffix('Target')}Task"
        schemas[name] = {
            "type": "object",
            "description": f"A {task_type.value} task's type and target.",
            "properties": {
                "type": {"const": task_type.value},
                "target": {"$ref": f"#/components/schemas/{model.__name__}"},
            },
            "required": ["type", "target"],
        }
        choices[task_type.value] = f"#/components/schemas/{name}"
    for name in TYPED_TARGETS:
        schemas[name]["oneOf"] = [{"$ref": ref} for ref in choices.values()]
        schemas[name]["discriminator"] = {"propertyName": "type", "mapping": choices}
        schemas[name]["properties"]["target"]["description"] = "the one of its type"


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, as docs/openapi.json keeps it. Powertools lists a 422
    for its validation errors on every route; this API answers those with a 400 (above),
    so the 422s are left out."""
    document = app.get_openapi_schema(
        title="Tocsin API",
        version="1",
        description="Tasks fired at their millisecond, exactly once, and recurring schedules "
        "whose every occurrence is such a task. Requests are signed with SigV4 for "
        "execute-api (IAM auth); each caller sees only its own tasks and schedules.",
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    for operations in document["paths"].values():
        for operation in operations.values():
            operation["responses"].pop("422", None)
    document["paths"]["/tasks"]["get"]["parameters"].append(TAG_PARAMETER)
    schemas = document["components"]["schemas"]
    _type_targets(schemas)
    while unused := [n for n in schemas if f'/schemas/{n}"' not in json.dumps(document)]:
        for name in unused:
            del schemas[name]
    return document
