"""BillingMode=PROVISIONED deployed from the real template: the tables and their indexes
start at the minimum capacity, the Sent table stays on demand, and a task fires. (Which
table and index Application Auto Scaling scales is checked in tests/unit/test_template.py:
moto's CloudFormation creates no scalable targets.)"""

import boto3

from tests.conftest import runtime_with, wait_for_status, webhook_task
from tocsin import clock
from tocsin.finder import at_the_tables_rate
from tocsin.local.stack import STACK_NAME
from tocsin.settings import settings
from tocsin.store import DUE_INDEX
from tocsin.submit import submit_task

PROVISIONED = {"BillingMode": "PROVISIONED", "CapacityMinimumUnits": "3"}


def test_provisioned_tables_and_indexes_start_at_the_minimum_and_a_task_fires(receiver):
    with runtime_with(PROVISIONED):
        listed = boto3.client("cloudformation").list_stack_resources(StackName=STACK_NAME)
        physical = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in listed["StackResourceSummaries"]
        }
        dynamodb = boto3.client("dynamodb")
        for table_id in ("TasksTable", "SchedulesTable", "BodiesTable"):
            table = dynamodb.describe_table(TableName=physical[table_id])["Table"]
            assert table["BillingModeSummary"]["BillingMode"] == "PROVISIONED", table_id
            for part in [table, *table.get("GlobalSecondaryIndexes", [])]:
                throughput = part["ProvisionedThroughput"]
                assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (3, 3)
        sent = dynamodb.describe_table(TableName=physical["SentTable"])["Table"]
        assert sent["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        due = clock.now_ms() + 2500
        submit_task(webhook_task(receiver.url, due, "provisioned"), owner="alice")
        wait_for_status("provisioned", {"SUCCEEDED"})
        [arrival] = receiver.received()
        assert arrival.task_id == "provisioned" and arrival.arrival_ms >= due


def test_the_finder_plans_claims_within_the_write_units_the_table_has_now():
    """Auto scaling moves a provisioned table's write units: each finder run reads them, the
    lesser of the Tasks table's and its due index's (a claim writes both), and spreads a
    crowded second's claims within them. On demand the plan keeps a new table's 4,000."""
    with runtime_with():
        assert at_the_tables_rate(settings()).claims_per_second == 4000
    with runtime_with(PROVISIONED) as provisioned:
        assert at_the_tables_rate(settings()).claims_per_second == 3
        boto3.client("dynamodb").update_table(
            TableName=provisioned.tasks_table,
            ProvisionedThroughput={"ReadCapacityUnits": 3, "WriteCapacityUnits": 60},
            GlobalSecondaryIndexUpdates=[
                {
                    "Update": {
                        "IndexName": DUE_INDEX,
                        "ProvisionedThroughput": {"ReadCapacityUnits": 3, "WriteCapacityUnits": 40},
                    }
                }
            ],
        )
        assert at_the_tables_rate(settings()).claims_per_second == 40
