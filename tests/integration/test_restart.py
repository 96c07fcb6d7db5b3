"""The embedded runtime stopped mid-run and started again on its saved state."""

import json
import threading
import time

import boto3
import pytest

from tests.conftest import (
    runtime_with,
    serve,
    stop,
    store_pending,
    stored,
    wait_for_status,
    webhook_task,
)
from tocsin import Client, clock
from tocsin.cli import main
from tocsin.index_keys import INDEX_LAG_MS
from tocsin.local.runtime import LOCAL_PARAMETERS
from tocsin.settings import settings
from tocsin.submit import submit_task

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

LEAD_MS = int(LOCAL_PARAMETERS["LeadMilliseconds"])
LOOK_AHEAD_S = 5
LOOK_AHEAD = {"LookAheadSeconds": str(LOOK_AHEAD_S)}


def secret() -> str:
    client = boto3.client("secretsmanager")
    return client.get_secret_value(SecretId=settings().webhook_secret_arn)["SecretString"]


@pytest.mark.slow
def test_a_restart_fires_every_task_once_whatever_state_it_was_in(tmp_path, receiver):
    state_file = tmp_path / "state.json"
    # at the stop, 4.6 s in: fired; in its gate; started at submit, waking later (moto's
    # Wait can end up to 2 s before due - lead); beyond the look-ahead and the index's lag
    # at submit: the finder's
    beyond = (LOOK_AHEAD_S + 1) * 1000 + INDEX_LAG_MS
    due = {"done": 2500, "running": 6000, "waiting": LEAD_MS + 9000, "later": beyond}
    with runtime_with(LOOK_AHEAD, state_file=state_file):
        start = clock.now_ms()
        for task_id, offset in due.items():
            submit_task(webhook_task(receiver.url, start + offset, task_id), owner="alice")
        wait_for_status("done", {"SUCCEEDED"})
        time.sleep(max(0, start + 4600 - clock.now_ms()) / 1000)
        signing_secret = secret()
    saved = json.loads(state_file.read_text())["tables"]["TasksTable"]
    at_stop = {item["task_id"]["S"]: item["status"]["S"] for item in saved}
    assert at_stop == {
        "done": "SUCCEEDED",
        "running": "SUCCEEDED",  # in its gate: the invocation ends, as Lambda's would, marks too
        "waiting": "PENDING",
        "later": "PENDING",
    }

    with runtime_with(LOOK_AHEAD, state_file=state_file) as again:
        assert again.requeued == ["waiting"]  # its execution died with the runtime
        assert secret() == signing_secret
        reach = start + beyond + 1000  # its second whole within the look-ahead
        time.sleep(max(0, reach - LOOK_AHEAD_S * 1000 - clock.now_ms()) / 1000)
        assert again.run_finder()["started"] == 1  # "later", now within the look-ahead
        for task_id in due:
            wait_for_status(task_id, {"SUCCEEDED"})
        assert int(stored("running")["attempts"]) == 1

    arrivals = receiver.received()
    assert sorted(a.task_id for a in arrivals) == sorted(due)
    assert all(a.arrival_ms >= start + due[a.task_id] for a in arrivals)


def test_without_a_state_file_nothing_is_kept(tmp_path, receiver):
    """Each runtime names its tables afresh, so its own tables are empty whatever was kept:
    what is looked at is every table its DynamoDB holds (the process's child, handed from
    one runtime to the next), which must be its own and empty."""
    with runtime_with(LOOK_AHEAD) as first:
        submit_task(webhook_task(receiver.url, clock.now_ms() + 60_000, "gone"), owner="alice")
        before = set(boto3.client("dynamodb").list_tables()["TableNames"])
        assert first.tasks_table in before
    with runtime_with(LOOK_AHEAD, state_file=tmp_path / "s.json") as again:
        dynamodb = boto3.resource("dynamodb")
        held = {table.name: table.scan()["Items"] for table in dynamodb.tables.all()}
        assert again.tasks_table in held
        assert sorted(before & set(held)) == []  # the first runtime's tables went with it
        assert all(items == [] for items in held.values()), held


@pytest.mark.slow
@pytest.mark.tool
def test_serve_keeps_tasks_across_a_restart(tmp_path):
    state_file = tmp_path / "tocsin.json"
    server, url = serve("--state", str(state_file))
    try:
        task = Client(url, principal="alice").submit(
            type="sns", target={"topic_arn": "arn:aws:sns:us-east-1:123456789012:t"}, delay=3600
        )
    finally:
        stop(server)
    server, url = serve("--state", str(state_file))
    try:
        assert Client(url, principal="alice").get(task.id) == task
    finally:
        stop(server)


@pytest.mark.parametrize("content", ["{not json", '{"tables": {}}', "[]"])
def test_serve_refuses_a_state_file_it_cannot_read_and_leaves_it_alone(tmp_path, capsys, content):
    state_file = tmp_path / "tocsin.json"
    state_file.write_text(content)
    assert main(["serve", "--port", "0", "--state", str(state_file)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --state:") and str(state_file) in error
    assert state_file.read_text() == content


def test_a_stop_ends_the_invocations_asleep_at_their_gates_and_sends_nothing(receiver):
    """Without a state file a stop ends its invocations before its services go: the one
    asleep at its gate ends there, so no thread of a stopped runtime goes on into the next
    runtime's services, and the task it held is never sent."""
    with runtime_with() as runtime:
        [task_id] = store_pending(receiver.url, 1, LEAD_MS + 1_500, "asleep")
        runtime.run_finder()
        wait_for_status(task_id, {"RUNNING"}, timeout_s=60)  # claimed: its gate sleeps
        due_ms = int(stored(task_id)["due_ms"])
    invocations = [t for t in threading.enumerate() if t.name.startswith("invoke-")]
    assert invocations == []
    time.sleep(max(due_ms + 500 - clock.now_ms(), 0) / 1000)
    assert receiver.received() == []
