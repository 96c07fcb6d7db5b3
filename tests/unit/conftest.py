"""Fixtures of the unit tests."""

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from tocsin import aws


@pytest.fixture
def table(monkeypatch) -> Iterator[str]:
    """A bare Tasks table on moto, keyed by task_id: where flows' and holds' items live."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    aws.forget_clients()
    with mock_aws():
        boto3.client("dynamodb").create_table(
            TableName="tasks",
            KeySchema=[{"AttributeName": "task_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "task_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield "tasks"
    aws.forget_clients()
