"""Write units as DynamoDB bills them: per 1 KB of the larger image, doubled in a
transaction, and each global index's own writes (one to put or remove an entry or change
its projected attributes, two when its key changes, none when it is left as it was)."""

import boto3
import pytest
from moto import mock_aws
from moto.dynamodb.models import dynamodb_backends

from tocsin.local.write_units import Metering

# the embedded runtime's own machinery: it runs on the developer's Python, never on Lambda's
pytestmark = pytest.mark.any_python

INDEXES = [
    ("ByPart", "part", "due", {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["v"]}),
    ("ByOwner", "owner", "due", {"ProjectionType": "ALL"}),
    ("ByOwnerKeys", "owner", "due", {"ProjectionType": "KEYS_ONLY"}),
]


@pytest.fixture
def metered():
    """A table with three global indexes; `write(action, **request)` sends one request
    and returns the units it was billed."""
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        attributes = {"id": "S", "part": "S", "owner": "S", "due": "N"}
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[
                {"AttributeName": name, "AttributeType": kind} for name, kind in attributes.items()
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": name,
                    "KeySchema": [
                        {"AttributeName": hash_key, "KeyType": "HASH"},
                        {"AttributeName": range_key, "KeyType": "RANGE"},
                    ],
                    "Projection": projection,
                }
                for name, hash_key, range_key, projection in INDEXES
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        meter = Metering(dynamodb_backends["123456789012"]["us-east-1"])

        def write(action: str, **request) -> dict[str, int]:
            if action != "TransactWriteItems":
                request.setdefault("TableName", "t")
            billed = dict(meter.billed)
            taken = meter.before(action, request)
            status, answer = 200, ""
            try:
                getattr(client, _snake(action))(**request)
            except client.exceptions.ClientError as refused:
                status, answer = 400, refused.response["Error"]["Code"]
            meter.after(taken, status, answer)
            return {  # the table's and the indexes' in all (each index's: test_write_units_local)
                k: v - billed.get(k, 0)
                for k, v in meter.billed.items()
                if v - billed.get(k, 0) and k in ("table", "index")
            }

        yield write


def _snake(action: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in action).lstrip("_")


TASK = {
    "id": {"S": "a"},
    "part": {"S": "0"},
    "owner": {"S": "alice"},
    "due": {"N": "1000"},
    "v": {"N": "1"},
    "status": {"S": "PENDING"},
}


def update(expression: str, values: dict, **extra) -> dict:
    return {
        "Key": {"id": {"S": "a"}},
        "UpdateExpression": expression,
        "ExpressionAttributeValues": values,
        **extra,
    }


def test_a_new_item_is_one_unit_and_one_in_each_index_it_enters(metered):
    assert metered("PutItem", Item=TASK) == {"table": 1, "index": 3}
    no_part = {k: v for k, v in TASK.items() if k != "part"} | {"id": {"S": "b"}}
    assert metered("PutItem", Item=no_part) == {"table": 1, "index": 2}  # sparse: not in ByPart


def test_an_update_pays_for_each_index_by_what_it_changes_there(metered):
    metered("PutItem", Item=TASK)
    # status is projected only into ByOwner (ALL)
    assert metered(
        "UpdateItem",
        **update(
            "SET #s = :s", {":s": {"S": "RUNNING"}}, ExpressionAttributeNames={"#s": "status"}
        ),
    ) == {"table": 1, "index": 1}
    # a new part moves the ByPart entry (delete and put) and changes ByOwner's copy
    assert metered("UpdateItem", **update("SET part = :x", {":x": {"S": "check-0"}})) == {
        "table": 1,
        "index": 3,
    }
    # the same value again changes nothing any index holds
    assert metered("UpdateItem", **update("SET part = :x", {":x": {"S": "check-0"}})) == {
        "table": 1
    }
    # leaving an index is one write there; ByOwner's copy changes too
    removed = {"Key": {"id": {"S": "a"}}, "UpdateExpression": "REMOVE part"}
    assert metered("UpdateItem", **removed) == {"table": 1, "index": 2}


def test_a_refused_write_is_billed_for_the_table_only(metered):
    metered("PutItem", Item=TASK)
    refused = update(
        "SET v = :two",
        {":two": {"N": "2"}, ":no": {"S": "DONE"}},
        ConditionExpression="#s = :no",
        ExpressionAttributeNames={"#s": "status"},
    )
    assert metered("UpdateItem", **refused) == {"table": 1}


def test_a_request_refused_as_invalid_is_not_billed(metered):
    metered("PutItem", Item=TASK)
    assert metered("UpdateItem", **update("SET id = :x", {":x": {"S": "b"}})) == {}  # a key


def test_size_rounds_up_per_kilobyte_and_a_transaction_doubles_the_table_and_indexes(metered):
    big = TASK | {"payload": {"S": "x" * 1500}}  # over 1 KB: two units, in ByOwner too
    assert metered("PutItem", Item=big) == {"table": 2, "index": 4}
    assert metered(
        "TransactWriteItems",
        TransactItems=[{"Delete": {"TableName": "t", "Key": {"id": {"S": "a"}}}}],
    ) == {"table": 4, "index": 8}  # as DynamoDB Local bills it (test_write_units_local)


def test_a_flow_s_items_are_billed_to_the_table_and_shown_apart(table):
    """What flow control writes (`flow:ledger`, `flow:leases`) is counted apart too, a
    share of the table's units: the bench's writes a send; a task's own are not."""
    client = boto3.client("dynamodb", region_name="us-east-1")
    meter = Metering(dynamodb_backends["123456789012"]["us-east-1"])
    for task_id in ("~flow:rate:one-host", "~flow:lease0:one-host", "a", "b"):
        request = {
            "TableName": table,
            "Key": {"task_id": {"S": task_id}},
            "UpdateExpression": "SET n = :n",
            "ExpressionAttributeValues": {":n": {"N": "1"}},
        }
        taken = meter.before("UpdateItem", request)
        client.update_item(**request)
        meter.after(taken, 200, "")
    assert meter.billed == {"table": 4, "flow:ledger": 1, "flow:leases": 1}
