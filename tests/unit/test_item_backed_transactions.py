"""The embedded runtime's DynamoDB backs a transaction up item by item, not table by table:
a transaction that fails still leaves every item as it was, and one that succeeds writes."""

import boto3
import pytest
from moto import mock_aws

from tocsin.local.moto_history import item_backed_transactions


@pytest.fixture
def table():
    with mock_aws(), item_backed_transactions():
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
