"""The task API behind API Gateway's HTTP API (IAM auth): routes to the domain, errors as JSON.

The caller is the IAM principal API Gateway authenticated; its tasks are the only ones it
can see or change. Every refusal is `{"error": {"code", "message", "field"}}` with a 4xx.
"""

import json
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from tocsin.errors import InvalidTask, TaskError, Unauthenticated
from tocsin.lifecycle import cancel_task, get_task, list_tasks, reschedule_task
from tocsin.model import owner_id
from tocsin.observability import logger
from tocsin.settings import settings
from tocsin.submit import submit_task

app = APIGatewayHttpResolver()


def _reply(status: int, body: Any) -> Response[Any]:
    return Response(status, content_types.APPLICATION_JSON, json.dumps(body))


def _error(status: int, code: str, message: str, field: str | None = None) -> Response[Any]:
    return _reply(status, {"error": {"code": code, "message": message, "field": field}})


def _caller() -> str:
    principal = app.current_event.request_context.authorizer.iam.user_id
    if not principal:
        raise Unauthenticated("the request carries no IAM identity")
    return owner_id(principal)


def _body() -> Any:
    try:
        return json.loads(app.current_event.decoded_body or "")
    except (ValueError, UnicodeDecodeError):
        raise InvalidTask("body: not valid JSON", field="body") from None


@app.post("/tasks")
def submit() -> Response[Any]:
    submitted = submit_task(_body(), _caller(), settings())
    status = HTTPStatus.CREATED if submitted.created else HTTPStatus.OK
    logger.info("submitted", task_id=submitted.task["id"], new=submitted.created)
    return _reply(status, submitted.task)


@app.get("/tasks")
def list_() -> Response[Any]:
    query = app.current_event.query_string_parameters or {}
    return _reply(HTTPStatus.OK, list_tasks(query, _caller(), settings()))


@app.get("/tasks/<task_id>")
def get(task_id: str) -> Response[Any]:
    return _reply(HTTPStatus.OK, get_task(task_id, _caller(), settings()))


@app.delete("/tasks/<task_id>")
def cancel(task_id: str) -> Response[Any]:
    task = cancel_task(task_id, _caller(), settings())
    logger.info("cancelled", task_id=task_id)
    return _reply(HTTPStatus.OK, task)


@app.patch("/tasks/<task_id>")
def reschedule(task_id: str) -> Response[Any]:
    task = reschedule_task(task_id, _body(), _caller(), settings())
    logger.info("rescheduled", task_id=task_id, version=task["version"])
    return _reply(HTTPStatus.OK, task)


@app.exception_handler(TaskError)
def refused(error: TaskError) -> Response[Any]:
    logger.info("refused", code=error.code, field=error.field)
    return _error(error.status, error.code, error.message, error.field)


@app.not_found
def no_route(_: NotFoundError) -> Response[Any]:
    request = f"{app.current_event.http_method} {app.current_event.path}"
    return _error(HTTPStatus.NOT_FOUND, "no_route", f"no route {request}")
