"""Bulk actions: cancel or retry every one of an owner's tasks that a filter matches (and,
for a cancel, delete every schedule carrying its tags), as a job that goes on after the
request: a filter may match 100,000 tasks, and the API has 29 s.

`POST /bulk` writes the job (`~bulk:<id>` on the Tasks table) and queues it (BulkQueue);
the bulk function works it a page at a time (a cancel by tags: the owner's schedules
first, then the owner's tasks, as `GET /tasks` reads them), each page's counts and the
place it reached written in one conditional write, so a message delivered twice counts
nothing twice; short of time, it queues the job again. A
client token makes the request idempotent: the same token and body answer the same job.

A bulk retry's tasks go through a flow of the job's own at HostRecoveryRate
(`tocsin.flow.recovery_flow`), so retrying a recovered host's failures cannot flood it."""

import hashlib
import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tocsin import aws, clock
from tocsin.errors import Conflict, InvalidTask, NotFound, TaskError
from tocsin.lifecycle import cancel_task, retry_task
from tocsin.model import TaskStatus
from tocsin.schedule_store import SCHEDULE_PAGE_KEY, ScheduleStore
from tocsin.schedules import delete_schedule
from tocsin.settings import Settings
from tocsin.store import TaskStore
from tocsin.submit import IsoTime
from tocsin.tags import Tags, has_tags

BULK_PREFIX = "~bulk:"
ACTS_ON = {"cancel": {TaskStatus.PENDING, TaskStatus.RETRYING}, "retry": {TaskStatus.FAILED}}
PAGE = 100  # tasks a step reads and acts on, its counts written once
SCHEDULES_PAGE = 25  # schedules a step reads (each delete cancels its occurrences)
# A cancel by tags first deletes the schedules carrying them, so that none makes another
# occurrence while the tasks are cancelled; each phase keeps its place in its attribute.
SCHEDULES, TASKS = "schedules", "tasks"
SCHEDULE_PLACE, TASK_PLACE = "schedule_key", "page_key"
ACTION_WORKERS = 16
JOB_DAYS = 7  # a finished job's record is kept this long
STEP_MARGIN_MS = 20_000  # kept back from the bulk function's time: one step and its write


class BulkFilter(BaseModel):
    """Which tasks: those carrying every tag, in one of the statuses, due in the bounds."""

    model_config = ConfigDict(extra="forbid")

    tags: Tags | None = None
    status: list[TaskStatus] | None = Field(default=None, min_length=1)
    due_before: IsoTime | None = None
    due_after: IsoTime | None = None

    @model_validator(mode="after")
    def _filters_something(self) -> "BulkFilter":
        if not self.model_fields_set - {"status"} and self.status is None:
            raise ValueError("give at least one of tags, status, due_before and due_after")
        return self


class BulkRequest(BaseModel):
    """The body of `POST /bulk`."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["cancel", "retry"]
    filter: BulkFilter
    dry_run: bool = Field(default=False, strict=True)
    client_token: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")

    def check(self) -> None:
        """InvalidTask naming `filter.status` if it names a status the action cannot act on."""
        acted = ACTS_ON[self.action]
        if self.filter.status and not set(self.filter.status) <= acted:
            names = " and ".join(sorted(acted))
            message = f"filter.status: {self.action} acts on {names} tasks only"
            raise InvalidTask(message, "filter.status")

    def statuses(self) -> set[TaskStatus]:
        return set(self.filter.status or ACTS_ON[self.action])


def _deletes_schedules(request: BulkRequest) -> bool:
    return request.action == "cancel" and bool(request.filter.tags) and not request.dry_run


def bulk_key(bulk_id: str) -> dict[str, str]:
    return {"task_id": f"{BULK_PREFIX}{bulk_id}"}


def start_bulk(
    request: BulkRequest, owner: str, config: Settings, queue: Callable[[str], None]
) -> tuple[dict[str, Any], bool]:
    """The job for `request`, written and queued (`queue`), and whether it is new: a client
    token already used for the same request answers its job; for another, 409."""
    request.check()
    asked = request.model_dump_json(exclude={"client_token"}, exclude_none=True)
    if request.client_token is None:
        bulk_id = uuid.uuid4().hex
    else:
        bulk_id = hashlib.sha256(f"{owner}\n{request.client_token}".encode()).hexdigest()[:32]
    table, now = aws.resource("dynamodb").Table(config.tasks_table), clock.now_ms()
    item = {
        **bulk_key(bulk_id),
        "bulk_id": bulk_id,
        "bulk_owner": owner,
        "request": asked,
        "state": "RUNNING",
        "phase": SCHEDULES if _deletes_schedules(request) else TASKS,
        "matched": 0,
        "done": 0,
        "failed": 0,
        "schedules_deleted": 0,
        "created_at": clock.to_iso(now),
        "updated_at": clock.to_iso(now),
        "expires_at": now // 1000 + JOB_DAYS * 86_400,
    }
    refused = table.meta.client.exceptions.ConditionalCheckFailedException
    try:
        table.put_item(Item=item, ConditionExpression="attribute_not_exists(task_id)")
    except refused:
        stored = table.get_item(Key=bulk_key(bulk_id), ConsistentRead=True)["Item"]
        if stored["bulk_owner"] != owner or stored["request"] != asked:
            raise Conflict("client_token: used for another bulk action", "client_token") from None
        return bulk_view(stored), False
    try:
        queue(bulk_id)
    except Exception:  # not queued, nothing would work it: the job goes, the caller retries
        table.delete_item(Key=bulk_key(bulk_id))
        raise
    return bulk_view(item), True


def get_bulk(bulk_id: str, owner: str, config: Settings) -> dict[str, Any]:
    table = aws.resource("dynamodb").Table(config.tasks_table)
    item = table.get_item(Key=bulk_key(bulk_id)).get("Item")
    if item is None or item.get("bulk_owner") != owner:
        raise NotFound(f"bulk_id: no bulk action {bulk_id!r}", "bulk_id")
    return bulk_view(item)


def bulk_view(item: dict[str, Any]) -> dict[str, Any]:
    request = json.loads(item["request"])
    return {
        "bulk_id": item["bulk_id"],
        "action": request["action"],
        "filter": request["filter"],
        "dry_run": request["dry_run"],
        "state": item["state"],
        "matched": int(item["matched"]),
        "done": int(item["done"]),
        "failed": int(item["failed"]),
        "schedules_deleted": int(item["schedules_deleted"]),
        "created_at": item["created_at"],
        "updated_at": item["updated_at"],
    }


# the job's request, a task's id and owner: act on the task, or raise TaskError
Act = Callable[["BulkRequest", str, str], None]
# a schedule's id and owner: delete it (and cancel its occurrences), or raise TaskError
Delete = Callable[[str, str], None]


@dataclass(frozen=True)
class Step:
    """What one step did, and where the next goes on: `place` is the job's attribute that
    keeps it (SCHEDULE_PLACE, then TASK_PLACE); `last` ends the step's phase."""

    place: str
    reached: dict[str, Any] | None
    last: bool
    matched: int = 0
    done: int = 0
    deleted: int = 0


def work(
    bulk_id: str, config: Settings, remaining_ms: Callable[[], int], act: Act, delete: Delete
) -> bool:
    """Work the job a step at a time while the time lasts: whether it is done (else it is
    to be queued again). A step another worker wrote first ends this one's work."""
    table = aws.resource("dynamodb").Table(config.tasks_table)
    while remaining_ms() > STEP_MARGIN_MS:
        job = table.get_item(Key=bulk_key(bulk_id), ConsistentRead=True).get("Item")
        if job is None or job["state"] != "RUNNING":
            return True
        request = BulkRequest.model_validate_json(job["request"])
        if job.get("phase") == SCHEDULES:
            step = _schedules_step(job, request, config, remaining_ms, delete)
        else:
            step = _tasks_step(job, request, config, act)
        if not _step_written(table, job, step):
            return True
    return False


def _tasks_step(job: dict[str, Any], request: BulkRequest, config: Settings, act: Act) -> Step:
    """A page of the owner's tasks the filter matches, acted on."""
    wanted, found = request.filter, request.statuses()
    cursor = json.loads(job[TASK_PLACE]) if TASK_PLACE in job else None
    items, last = TaskStore(config.tasks_table).owned(
        job["bulk_owner"],
        clock.to_ms(wanted.due_after) if wanted.due_after else None,
        clock.to_ms(wanted.due_before) if wanted.due_before else None,
        None,
        PAGE,
        cursor,
        tags=wanted.tags,
    )
    matched = [item["task_id"] for item in items if item["status"] in found]
    done = 0 if request.dry_run else _acted(request, matched, job["bulk_owner"], act)
    reached = {k: int(v) if k == "due_ms" else v for k, v in last.items()} if last else None
    return Step(TASK_PLACE, reached, last is None, len(matched), done)


def _schedules_step(
    job: dict[str, Any],
    request: BulkRequest,
    config: Settings,
    remaining_ms: Callable[[], int],
    delete: Delete,
) -> Step:
    """A page of the owner's schedules, those carrying the cancel's tags deleted one at a
    time while the time lasts: each delete cancels its schedule's occurrences, which may
    take a while (LEFTOVERS_BUDGET_S), so a step may end within its page, after the last
    schedule it handled."""
    store, owner = ScheduleStore(config.schedules_table, config.tasks_table), job["bulk_owner"]
    cursor = json.loads(job[SCHEDULE_PLACE]) if SCHEDULE_PLACE in job else None
    entries, last = store.owned(owner, SCHEDULES_PAGE, cursor)
    deleted, reached = 0, cursor
    for item in store.whole(entries):
        if remaining_ms() <= STEP_MARGIN_MS:
            return Step(SCHEDULE_PLACE, reached, False, deleted=deleted)
        if has_tags(item, request.filter.tags or {}):
            try:
                delete(item["schedule_id"], owner)
                deleted += 1
            except TaskError:  # deleted meanwhile
                pass
        reached = {name: item[name] for name in SCHEDULE_PAGE_KEY}
    return Step(SCHEDULE_PLACE, last, last is None, deleted=deleted)


def _acted(request: BulkRequest, task_ids: list[str], owner: str, act: Act) -> int:
    """How many of the tasks were acted on (one changed meanwhile is refused: not counted)."""

    def one(task_id: str) -> bool:
        try:
            act(request, task_id, owner)
        except TaskError:
            return False
        return True

    if not task_ids:
        return 0
    with ThreadPoolExecutor(max_workers=min(ACTION_WORKERS, len(task_ids))) as pool:
        return sum(pool.map(one, task_ids))


def _step_written(table: Any, job: dict[str, Any], step: Step) -> bool:
    """One step's counts and the place it reached, written if no other worker moved the
    job on meanwhile (its phase and place as read); whether they were. The schedules'
    last step begins the tasks' phase, the tasks' last ends the job."""
    values: dict[str, Any] = {
        ":m": step.matched,
        ":d": step.done,
        ":f": step.matched - step.done,
        ":s": step.deleted,
        ":now": clock.to_iso(clock.now_ms()),
        ":running": "RUNNING",
    }
    names = {"#state": "state", "#phase": "phase", "#place": step.place}
    sets = ["updated_at = :now"]
    if not step.last:
        sets.append("#place = :next")
        values[":next"] = json.dumps(step.reached)
    elif step.place == SCHEDULE_PLACE:
        sets.append("#phase = :tasks")
        values[":tasks"] = TASKS
    else:
        sets.append("#state = :done")
        values[":done"] = "DONE"
    update = f"SET {', '.join(sets)} ADD matched :m, done :d, failed :f, schedules_deleted :s"
    if step.last:
        update += " REMOVE #place"
    condition = ["#state = :running"]
    for name, attribute in (("#phase", "phase"), ("#place", step.place)):
        if attribute in job:
            condition.append(f"{name} = :was_{attribute}")
            values[f":was_{attribute}"] = job[attribute]
        else:
            condition.append(f"attribute_not_exists({name})")
    refused = table.meta.client.exceptions.ConditionalCheckFailedException
    try:
        table.update_item(
            Key={"task_id": job["task_id"]},
            UpdateExpression=update,
            ConditionExpression=" AND ".join(condition),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
    except refused:
        return False
    return True


def queue_job(bulk_id: str, config: Settings) -> None:
    """The job on the bulk queue, for the bulk function to work (again)."""
    aws.client("sqs").send_message(
        QueueUrl=config.bulk_queue_url, MessageBody=json.dumps({"bulk_id": bulk_id})
    )


def run_job(bulk_id: str, config: Settings, remaining_ms: Callable[[], int]) -> None:
    """Work one job while the bulk function's time lasts, queued again if not done."""

    def act(request: BulkRequest, task_id: str, owner: str) -> None:
        if request.action == "cancel":
            cancel_task(task_id, owner, config)
        else:  # through a flow of the job's own: at the recovery rate
            retry_task(task_id, owner, config, recovering=f"{BULK_PREFIX}{bulk_id}")

    def delete(schedule_id: str, owner: str) -> None:
        delete_schedule(schedule_id, owner, config)

    if not work(bulk_id, config, remaining_ms, act, delete):
        queue_job(bulk_id, config)
