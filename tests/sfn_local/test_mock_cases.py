"""The task machine on Step Functions Local with mocked integrations (docker-compose.yml).

Run with `docker compose up -d` and `SFN_LOCAL_ENDPOINT=http://localhost:8083`; not
collected otherwise (tests/sfn_local/conftest.py). The same cases, and every other path of
the machine, run on aws-local-stepfunctions in tests/integration/test_task_machine_paths.py.
"""

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

ROOT = Path(__file__).parents[2]
ENDPOINT = os.environ["SFN_LOCAL_ENDPOINT"]
MACHINE = "TaskMachine"  # the name the mock file's test cases are keyed by
EXECUTION_INPUT = {
    "task_type": "webhook",
    "executor": 0,
    "wake_at": "2026-01-01T00:00:00Z",  # past: the Wait lets go at once
    "tasks": [{"task_id": "sfn-local-1", "version": 1, "due_ms": 1767225600000}],
}


def definition() -> str:
    """The real ASL, its placeholders filled with names Step Functions Local never calls."""
    text = (ROOT / "statemachines" / "task.asl.json").read_text()

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name.endswith("ExecutorArn"):
            return f"arn:aws:lambda:us-east-1:123456789012:function:{name[: -len('Arn')]}"
        if name == "DeadLetterQueueUrl":
            return "https://sqs.us-east-1.amazonaws.com/123456789012/tocsin-dlq"
        return {"Partition": "aws"}[name]

    return re.sub(r"\$\{(\w+)\}", value, text)


def local_sfn() -> Any:
    return boto3.client(
        "stepfunctions",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


@pytest.fixture(scope="module")
def machine_arn() -> str:
    sfn = local_sfn()
    arn = sfn.create_state_machine(
        name=MACHINE,
        definition=definition(),
        roleArn="arn:aws:iam::123456789012:role/tocsin-local",
    )["stateMachineArn"]
    yield arn
    sfn.delete_state_machine(stateMachineArn=arn)


def run(machine_arn: str, test_case: str) -> tuple[str, list[dict]]:
    sfn = local_sfn()
    execution = sfn.start_execution(
        stateMachineArn=f"{machine_arn}#{test_case}",
        name=f"{test_case}-{uuid.uuid4().hex[:8]}",
        input=json.dumps(EXECUTION_INPUT),
    )["executionArn"]
    deadline = time.monotonic() + 60
    while (status := sfn.describe_execution(executionArn=execution)["status"]) == "RUNNING":
        assert time.monotonic() < deadline, f"{test_case} still running"
        time.sleep(0.2)
    return status, sfn.get_execution_history(executionArn=execution)["events"]


def entered(events: list[dict]) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
    ]


def test_a_batch_fires_in_two_states(machine_arn):
    status, events = run(machine_arn, "Fired")
    assert status == "SUCCEEDED"
    assert entered(events) == ["WaitUntilWake", "Fire"]  # two transitions: what Standard bills


def test_a_busy_lambda_is_retried_then_the_batch_fires(machine_arn):
    status, events = run(machine_arn, "RetryThenFired")
    assert status == "SUCCEEDED"
    invocations = [e for e in events if e["type"] == "TaskScheduled"]
    assert sum("lambda" in e["taskScheduledEventDetails"]["resourceType"] for e in invocations) == 2


def test_an_invocation_that_keeps_timing_out_sends_the_batch_to_the_dead_letter_queue(
    machine_arn,
):
    status, events = run(machine_arn, "InvocationFailedToDeadLetterQueue")
    assert status == "FAILED"
    assert entered(events) == ["WaitUntilWake", "Fire", "SendBatchToDeadLetterQueue", "Failed"]
