"""The Tasks table: every read and conditional write the domain makes, in one place."""

from collections.abc import Iterator
from typing import Any

from boto3.dynamodb.conditions import Key

from tocsin import aws
from tocsin.model import TaskStatus

DUE_INDEX = "DueIndex"


class TaskStore:
    def __init__(self, table_name: str):
        self._table = aws.resource("dynamodb").Table(table_name)
        self._conditional_failed = (
            self._table.meta.client.exceptions.ConditionalCheckFailedException
        )

    def create(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """Write a new task; if the id is taken, return the task already there instead."""
        try:
            self._table.put_item(Item=item, ConditionExpression="attribute_not_exists(task_id)")
        except self._conditional_failed:
            return self.get(item["task_id"])
        return None

    def get(self, task_id: str) -> dict[str, Any] | None:
        reply = self._table.get_item(Key={"task_id": task_id}, ConsistentRead=True)
        return reply.get("Item")

    def mark_scheduled(self, task_id: str, version: int, execution_arn: str) -> bool:
        """Record that an execution exists and take the task out of the due index.

        Only a task still PENDING at the same version is marked: a claim, cancel or
        reschedule that got there first wins.
        """
        try:
            self._table.update_item(
                Key={"task_id": task_id},
                UpdateExpression="SET #s = :scheduled, execution_arn = :arn "
                "REMOVE gsi_pk, gsi_due_ms",
                ConditionExpression="#s = :pending AND #v = :v",
                ExpressionAttributeNames={"#s": "status", "#v": "version"},
                ExpressionAttributeValues={
                    ":scheduled": TaskStatus.SCHEDULED,
                    ":pending": TaskStatus.PENDING,
                    ":arn": execution_arn,
                    ":v": version,
                },
            )
        except self._conditional_failed:
            return False
        return True

    def due_in_shard(self, shard: int, until_ms: int) -> Iterator[dict[str, Any]]:
        """PENDING tasks of one shard due at or before `until_ms`, earliest first, all pages."""
        query: dict[str, Any] = {
            "IndexName": DUE_INDEX,
            "KeyConditionExpression": Key("gsi_pk").eq(str(shard))
            & Key("gsi_due_ms").lte(until_ms),
        }
        while True:
            page = self._table.query(**query)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
