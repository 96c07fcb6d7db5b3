"""The embedded runtime's DynamoDB, as its child process patches moto: a transaction is
backed up item by item, not table by table (one that fails still leaves every item as it
was, and one that succeeds writes), and an update expression is parsed once for every
request that sends it (each request still gets its own names and values)."""

import boto3
import pytest
from moto import mock_aws

from tocsin.local.moto_patches import dynamodb_patches


@pytest.fixture
def table():
    with mock_aws(), dynamodb_patches():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for n in range(50):
            client.put_item(TableName="t", Item={"id": {"S": f"i{n}"}, "n": {"N": "1"}})
        yield client


def update(key: str, condition: str | None = None) -> dict:
    action = {
        "TableName": "t",
        "Key": {"id": {"S": key}},
        "UpdateExpression": "SET n = n + :one",
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }
    if condition:
        action["ConditionExpression"] = condition
    return {"Update": action}


def values(client) -> dict[str, str]:
    items = client.scan(TableName="t")["Items"]
    return {item["id"]["S"]: item["n"]["N"] for item in items}


def test_a_failed_transaction_leaves_every_item_as_it_was(table):
    before = values(table)
    with pytest.raises(table.exceptions.TransactionCanceledException):
        table.transact_write_items(
            TransactItems=[update("i1"), update("i2"), update("i3", "n > :one")]
        )
    assert values(table) == before


def test_a_transaction_that_holds_writes_every_item(table):
    table.transact_write_items(TransactItems=[update("i1"), update("i2")])
    table.transact_write_items(
        TransactItems=[{"Put": {"TableName": "t", "Item": {"id": {"S": "new"}, "n": {"N": "7"}}}}]
    )
    after = values(table)
    assert (after["i1"], after["i2"], after["i3"], after["new"]) == ("2", "2", "1", "7")


def test_one_update_expression_sent_with_other_names_and_values_updates_what_each_names(table):
    """The second and third requests reuse the first's parsed expression: had moto resolved
    names or values into that parse, they would write the first request's attribute."""
    for key, attribute, value in (("i1", "a", "1"), ("i2", "b", "2"), ("i1", "b", "3")):
        table.update_item(
            TableName="t",
            Key={"id": {"S": key}},
            UpdateExpression="SET #x = :v, n = n + :v",
            ExpressionAttributeNames={"#x": attribute},
            ExpressionAttributeValues={":v": {"N": value}},
        )
    items = {item["id"]["S"]: item for item in table.scan(TableName="t")["Items"]}
    assert {k: v["N"] for k, v in items["i1"].items() if k != "id"} == {
        "a": "1",
        "b": "3",
        "n": "5",
    }
    assert {k: v["N"] for k, v in items["i2"].items() if k != "id"} == {"b": "2", "n": "3"}
