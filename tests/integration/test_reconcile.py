"""Nothing stuck, ever: a task nobody started is started late, tasks whose execution ended
without settling them are requeued at their version (what was sent is not sent again), or
failed to the DLQ after a few tries."""

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from botocore.exceptions import ClientError

from tests.conftest import (
    ENDED,
    TEST_ATTEMPT,
    batch_event,
    call_api,
    claim_as,
    dead_letters,
    hooked,
    stop_executions,
    stop_until_ended,
    store_pending,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import aws, clock, dispatch
from tocsin.dispatch import execution_arn
from tocsin.finder import HORIZON
from tocsin.index_keys import LETTER_GRACE_MS, LOOK_AFTER_MS, check_keys
from tocsin.model import TaskStatus
from tocsin.reconcile import CHECK_AGAIN_MS, MAX_REQUEUES, reconcile
from tocsin.settings import settings
from tocsin.store import TaskStore
from tocsin.submit import new_item

GONE = "gone"  # an execution that has ended (its name, as a task records it)


def arn_of(name: str) -> str:
    return execution_arn(settings().state_machine_arn, name)


def past_check_time(task_id: str) -> int:
    """A moment at which the reconciler must look at the task."""
    return int(stored(task_id)["due_ms"]) + LOOK_AFTER_MS + 1


@pytest.mark.slow
def test_a_task_whose_execution_ended_before_its_claim_is_started_again_and_fires_once(
    runtime, receiver
):
    [task_id] = store_pending(receiver.url, 1, 12_000, "aborted")
    assert runtime.run_finder()["started"] == 1
    stop_until_ended(arn_of(f"{task_id}-v1"))  # gone before its wake
    assert stored(task_id)["status"] == "PENDING"

    report = reconcile(settings(), past_check_time(task_id))
    assert [(t, str(o)) for t, o in report.tasks] == [(task_id, "started_late")]
    item = stored(task_id)  # a new name: the old one is taken
    assert (item["status"], int(item["version"]), int(item["requeues"])) == ("PENDING", 1, 1)
    assert item["gsi_pk"].startswith("check-")  # looked at again once it should be done

    item = wait_for_status(task_id, {"SUCCEEDED"})
    assert item["execution"] == f"{task_id}-v1r1"
    assert Counter(a.task_id for a in receiver.received()) == {task_id: 1}


def test_a_task_sent_by_an_execution_that_died_before_its_mark_is_not_sent_again(runtime, receiver):
    """The execution sent, then died: requeued at the same version and started again, the
    next execution finds the send in the sent log, and the first fire time is kept."""
    [task_id] = store_pending(receiver.url, 1, -500, "died")
    client = aws.resource("dynamodb").meta.client

    def table_gone(params: dict, **_: object) -> None:
        if ":status" in params.get("ExpressionAttributeValues", {}):  # the final mark
            raise ClientError({"Error": {"Code": "AccessDeniedException"}}, "UpdateItem")

    gone = ("before-parameter-build.dynamodb.UpdateItem", table_gone)
    with hooked(client, gone), pytest.raises(ClientError):
        runtime.invoke("WebhookExecutorFunction", batch_event(task_id, arn_of(GONE)))
    [first] = receiver.received()
    assert stored(task_id)["status"] == "RUNNING"
    died_ms = clock.now_ms()

    assert [str(o) for _, o in reconcile(settings(), past_check_time(task_id)).tasks] == [
        "requeued"
    ]
    item = wait_for_status(task_id, {"SUCCEEDED"})
    assert receiver.received() == [first]  # one send in all
    fired_ms = clock.to_ms(datetime.fromisoformat(item["fired_at"]))
    assert fired_ms <= first.arrival_ms and fired_ms < died_ms  # the first fire, recorded
    assert item["execution"] == f"{task_id}-v1r1"


def test_a_task_whose_executions_keep_ending_fails_to_the_dead_letter_queue(runtime, receiver):
    [task_id] = store_pending(receiver.url, 1, 60_000, "doomed")
    for requeues in range(MAX_REQUEUES + 1):
        assert claim_as(f"{GONE}-{requeues}", task_id, ENDED).before
        report = reconcile(settings(), past_check_time(task_id))
        [(_, outcome)] = report.tasks
        assert str(outcome) == ("requeued" if requeues < MAX_REQUEUES else "failed_stuck")
    item = stored(task_id)
    assert item["status"] == "FAILED" and "gsi_pk" not in item
    stop_executions()  # those the requeues started, waiting for its due time
    [letter] = dead_letters(runtime)
    assert (letter["task_id"], letter["version"], letter["error"]["Error"]) == (
        task_id,
        1,
        "TaskStuck",
    )
    assert reconcile(settings(), past_check_time(task_id)).tasks == []  # settled for good


def test_a_task_whose_execution_still_runs_is_looked_at_again_later(runtime, receiver):
    [task_id] = store_pending(receiver.url, 1, 15_000, "patient")
    assert runtime.run_finder()["started"] == 1  # its execution waits for its wake
    assert claim_as(f"{task_id}-v1", task_id).before  # held as a long retry would hold it
    check = past_check_time(task_id)
    assert [str(o) for _, o in reconcile(settings(), check).tasks] == ["still_running"]
    item = stored(task_id)
    assert item["status"] == "RUNNING" and item["gsi_pk"].startswith("check-")
    assert int(item["gsi_due_ms"]) > clock.now_ms() + CHECK_AGAIN_MS - 60_000
    assert reconcile(settings(), clock.now_ms() + 60_000).tasks == []  # not before then


def test_a_task_that_succeeds_after_a_look_leaves_the_check_shards_at_the_next(runtime, receiver):
    """A task looked at while its execution still ran keeps its check entry when it succeeds
    (the executor's final mark leaves the index alone); the next run takes it out, so no run
    after reads it again."""
    [task_id] = store_pending(receiver.url, 1, 15_000, "finished-later")
    assert runtime.run_finder()["started"] == 1
    assert claim_as(f"{task_id}-v1", task_id).before
    assert [str(o) for _, o in reconcile(settings(), past_check_time(task_id)).tasks] == [
        "still_running"
    ]
    stop_executions()  # its wake would find the claim held; the mark stands for its send
    store = TaskStore(settings().tasks_table)
    fired = {"fired_at": clock.to_iso(clock.now_ms())}
    assert store.finish(task_id, 1, TEST_ATTEMPT, TaskStatus.SUCCEEDED, fired)
    look = int(stored(task_id)["gsi_due_ms"])
    assert stored(task_id)["gsi_pk"].startswith("check-")
    assert reconcile(settings(), look + 1).tasks == []
    item = stored(task_id)
    assert item["status"] == "SUCCEEDED" and "gsi_pk" not in item and "gsi_due_ms" not in item


@contextmanager
def sqs_outage() -> Iterator[list[str]]:
    """SQS refuses every message sent from this process's clients meanwhile; the bodies of
    the messages it refused."""
    refused: list[str] = []

    def refuse(params: dict, **_: object) -> None:
        refused.append(params["MessageBody"])
        raise ClientError({"Error": {"Code": "ServiceUnavailable"}}, "SendMessage")

    with hooked(aws.client("sqs"), ("before-parameter-build.sqs.SendMessage", refuse)):
        yield refused


def test_dead_letters_sqs_refused_are_owed_and_sent_once_by_the_reconciler(runtime, receiver):
    """The tasks are FAILED and SQS refuses their letters: the batch still succeeds, and the
    tasks wait in a check shard until, past the grace, reconciler runs send their letters.
    While SQS refuses, a run tries one letter, not every one, and that one waits a while."""
    receiver.status_for["/gone"] = 410
    ids = store_pending(f"{receiver.url}/gone", 2, -500, "unlettered")
    batch = batch_event(ids[0], arn_of(GONE))
    batch["tasks"] += batch_event(ids[1], arn_of(GONE))["tasks"]
    with sqs_outage():
        report = runtime.invoke("WebhookExecutorFunction", batch)
    assert report == {"tasks": 2, "claimed": 2, "failed": 2}
    items = {task_id: stored(task_id) for task_id in ids}
    assert all(i["status"] == "FAILED" and i["gsi_pk"].startswith("check-") for i in items.values())
    assert dead_letters(runtime) == []

    assert reconcile(settings(), clock.now_ms() + 60_000).tasks == []  # their failer's grace
    after_grace = clock.now_ms() + LETTER_GRACE_MS + 1
    refused_at = clock.now_ms()
    with sqs_outage() as refused:
        outcomes = reconcile(settings(), after_grace).as_dict()
    assert (outcomes["letters_owed"], outcomes["letters_sent"], len(refused)) == (2, 0, 1)
    tried = json.loads(refused[0])["task_id"]
    [left] = [task_id for task_id in ids if task_id != tried]
    assert int(stored(tried)["gsi_due_ms"]) >= refused_at + CHECK_AGAIN_MS  # tried later
    assert stored(left)["gsi_due_ms"] == items[left]["gsi_due_ms"]  # not tried: as it was
    later = clock.now_ms() + CHECK_AGAIN_MS + 1
    assert sorted((t, str(o)) for t, o in reconcile(settings(), later).tasks) == [
        (task_id, "letter_sent") for task_id in sorted(ids)
    ]
    letters = {letter["task_id"]: letter for letter in dead_letters(runtime)}
    assert sorted(letters) == sorted(ids)
    for task_id, letter in letters.items():
        assert (letter["version"], letter["execution"]) == (1, arn_of(GONE))
        assert letter["error"] == json.loads(items[task_id]["error"])
        assert "gsi_pk" not in stored(task_id)
    assert reconcile(settings(), later).tasks == []  # each sent once


@contextmanager
def described(refuse: str | None = None) -> Iterator[list[str]]:
    """The executions DescribeExecution is asked about meanwhile; `refuse`'s is throttled."""
    asked: list[str] = []

    def describe(params: dict, **_: object) -> None:
        asked.append(params["executionArn"])
        if params["executionArn"] == refuse:
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "DescribeExecution")

    hook = ("before-parameter-build.sfn.DescribeExecution", describe)
    with hooked(aws.client("stepfunctions"), hook):
        yield asked


def test_a_task_whose_execution_ended_under_a_live_invocation_is_not_requeued(runtime, receiver):
    """An operator's StopExecution (or a Fire state that timed out) ends the execution while
    its invocation still runs, maybe sending: while the claim's lease is live the task is
    neither requeued nor failed, and its look comes again; once it is over, it is requeued.
    The write itself is conditional on the lease, for a look read before a claim."""
    [task_id] = store_pending(receiver.url, 1, 60_000, "stopped-under")
    assert claim_as(GONE, task_id).before  # its invocation has a minute left
    store = TaskStore(settings().tasks_table)
    keys = check_keys(task_id, clock.now_ms(), settings())
    assert store.requeue(task_id, 1, 0, keys, clock.now_ms()) is None
    assert not store.fail_in_flight(task_id, 1, clock.now_ms(), {"error": "{}"})
    check = past_check_time(task_id)
    assert [str(o) for _, o in reconcile(settings(), check).tasks] == ["still_running"]
    item = stored(task_id)
    assert item["status"] == "RUNNING" and item["attempt"] == TEST_ATTEMPT
    store.let_go(task_id, 1, TEST_ATTEMPT)  # the invocation ended
    later = clock.now_ms() + CHECK_AGAIN_MS + 1
    assert [str(o) for _, o in reconcile(settings(), later).tasks] == ["requeued"]
    stop_executions()  # the requeue's, waiting for its due time


def test_a_dead_batch_is_described_once_and_a_refused_look_leaves_only_its_tasks(runtime, receiver):
    """Five tasks of one dead execution and two of another, whose DescribeExecution is
    throttled: one look per execution (the refusal is not asked again for the second
    task), the five requeued, the two counted as faults and left where they were, the
    reconciler's horizon held before them, for the next run."""
    ids = store_pending(receiver.url, 7, 60_000, "dead-batch")
    throttled = f"{GONE}-throttled"
    for task_id in ids:
        execution = throttled if task_id in ids[-2:] else GONE
        assert claim_as(execution, task_id, ENDED).before
    with described(refuse=arn_of(throttled)) as asked:
        report = reconcile(settings(), past_check_time(ids[-1]))
    assert sorted(asked) == [arn_of(GONE), arn_of(throttled)]
    assert {t: str(o) for t, o in report.tasks} == {
        **{task_id: "requeued" for task_id in ids[:-2]},
        **{task_id: "reconcile_faults" for task_id in ids[-2:]},
    }
    assert all(stored(t)["status"] == "RUNNING" and stored(t)["gsi_pk"].isdigit() for t in ids[-2:])
    with described():
        again = reconcile(settings(), past_check_time(ids[-1])).tasks
    assert {t: str(o) for t, o in again if t in ids[-2:]} == {t: "requeued" for t in ids[-2:]}


def test_a_reconciler_out_of_time_or_refused_its_reads_leaves_the_run_to_dispatch(
    runtime, receiver
):
    """A flood of stuck tasks or a refused read of the shards holds back no dispatch:
    the reconciler stops at its deadline (the rest waits for the next run), and a finder
    run whose reconciler cannot read still starts what is due."""
    [stuck] = store_pending(receiver.url, 1, 60_000, "stuck")
    assert claim_as(GONE, stuck, ENDED).before
    report = reconcile(settings(), clock.now_ms(), deadline=0.0)
    assert (report.tasks, report.as_dict()["reconcile_cut_short"]) == ([], 1)
    assert stored(stuck)["status"] == "RUNNING"

    [due] = store_pending(receiver.url, 1, 15_000, "due-anyway")

    def refuse_check_shards(params: dict, **_: object) -> None:
        if str(params.get("ExpressionAttributeValues", {}).get(":shard", "")).startswith("check-"):
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException"}}, "Query"
            )

    client = aws.resource("dynamodb").meta.client
    with hooked(client, ("before-parameter-build.dynamodb.Query", refuse_check_shards)):
        report = runtime.run_finder()
    assert (report["started"], report["reconcile_cut_short"], report["stuck"]) == (1, 1, 0)
    assert [e.name for e in runtime.executions()] == [f"{due}-v1"]
    assert stored(stuck)["status"] == "RUNNING"


def test_tasks_failed_as_stuck_during_an_sqs_outage_try_one_letter_and_owe_the_rest(
    runtime, receiver
):
    ids = store_pending(receiver.url, 2, 60_000, "stuck-unlettered")
    for requeues in range(MAX_REQUEUES + 1):
        for task_id in ids:
            assert claim_as(f"{GONE}-{requeues}", task_id, ENDED).before
        if requeues < MAX_REQUEUES:
            reconcile(settings(), past_check_time(ids[-1]))
    with sqs_outage() as refused:
        report = reconcile(settings(), past_check_time(ids[-1]))
    assert sorted(str(o) for _, o in report.tasks) == ["failed_stuck", "failed_stuck"]
    assert len(refused) == 1  # the first refusal stops the run's letters
    assert all(stored(t)["gsi_pk"].startswith("check-") for t in ids)  # both letters owed


def test_a_task_placed_past_its_due_time_whose_writer_died_is_started_late(runtime, receiver):
    """A late submission (or a redrive, or a catch-up) sits in the index at its placing, not
    at its due time, which the reconciler's horizon has already passed: a writer that died
    between its put and its start leaves it for the reconciler's look all the same."""
    reconcile(settings(), clock.now_ms())  # the reconciler has read up to 2 minutes ago
    due = clock.now_ms() - LOOK_AFTER_MS - 60_000  # refused only past MaxOverdueSeconds
    body = webhook_task(receiver.url, due, "placed-late")
    TaskStore(settings().tasks_table).create(new_item(body, "alice", clock.now_ms(), settings()))
    assert reconcile(settings(), clock.now_ms()).tasks == []  # placed now: not yet
    report = reconcile(settings(), clock.now_ms() + LOOK_AFTER_MS + 1)
    assert [(t, str(o)) for t, o in report.tasks] == [("placed-late", "started_late")]
    wait_for_status("placed-late", {"SUCCEEDED"})
    assert [a.task_id for a in receiver.received()] == ["placed-late"]


def test_a_retry_whose_execution_was_never_started_is_started_by_the_reconciler(runtime, receiver):
    """The executor gives a task back RETRYING and starts its next attempt's execution
    itself; a refused StartExecution leaves the task in a check shard, not lost: the
    reconciler's next look starts it, it is sent at its next attempt (never before) and
    only then, with the key of the first."""
    receiver.script_for["/down"] = [503]  # then 200
    body = webhook_task(f"{receiver.url}/down", clock.now_ms() + 2000, "unstarted")
    body["retry"] = {"min_backoff_s": 6, "max_backoff_s": 6}  # past the invocation's pauses
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201  # its first execution starts
    refused: list[int] = []

    def refuse(**_: object) -> None:
        refused.append(clock.now_ms())
        error = {"Error": {"Code": "ExecutionLimitExceeded", "Message": "too many"}}
        raise ClientError(error, "StartExecution")

    with hooked(dispatch._sfn(), ("before-call.sfn.StartExecution", refuse)):
        wait_for_status("unstarted", {"RETRYING"})
        deadline = time.monotonic() + 10
        while not stored("unstarted")["gsi_pk"].startswith("check-"):
            assert time.monotonic() < deadline, "the refused start left no look"
            time.sleep(0.1)
    assert refused and stored("unstarted")["status"] == "RETRYING"
    assert len(receiver.received()) == 1  # the first attempt only: no execution tries it

    report = reconcile(settings(), clock.now_ms())
    assert [(t, str(o)) for t, o in report.tasks] == [("unstarted", "started_late")]
    done = wait_for_status("unstarted", {"SUCCEEDED"}, timeout_s=60)
    first, second = receiver.received()
    assert second.arrival_ms >= first.arrival_ms + 6000  # at its next attempt, not before
    assert first.idempotency_key == second.idempotency_key and int(done["attempts"]) == 2


def test_a_finder_whose_horizon_is_past_its_look_ahead_reads_nothing(runtime, receiver):
    """A look-ahead lowered since the last run (or a run that began before another one
    moved the horizon): the range is empty (DynamoDB refuses a BETWEEN the wrong way
    round), and the horizon stays where it is."""
    store = TaskStore(settings().tasks_table)
    ahead = clock.now_ms() + settings().lookahead_s * 1000 + 60_000
    store.advance_horizon(HORIZON, ahead)
    assert runtime.run_finder()["found"] == 0
    assert store.horizon(HORIZON) == ahead
