"""Every path of the task machine, as the embedded runtime resolves it (`tocsin asl`), on
aws-local-stepfunctions: a JavaScript ASL interpreter that shares no code with moto, so a
state, retrier or catch that moto's interpreter reads differently from AWS's shows here.

`make test` installs it from the npm registry (tools/aws-local-stepfunctions, locked) and
runs it on Node; elsewhere these tests say they are skipped (and fail CI). Task states
answer what each case gives (the cases of statemachines/test/MockConfigFile.json among
them); Waits and retries take no time but where a test lets a Wait wait.
"""

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import runtime_with
from tocsin import clock
from tocsin.dispatch import EXECUTORS
from tocsin.model import TaskType

ROOT = Path(__file__).parents[2]
INTERPRETER = ROOT / "tools" / "aws-local-stepfunctions"
INSTALLED = INTERPRETER / "node_modules" / ".installed"
MOCKS = ROOT / "statemachines" / "test" / "MockConfigFile.json"
EXECUTION_ID = "arn:aws:states:us-east-1:123456789012:execution:TaskMachine:batch-1"

pytestmark = [
    pytest.mark.any_python,  # Node runs the machine, whichever Python asks
    pytest.mark.skipif(
        not (INSTALLED.exists() and shutil.which("node")),
        reason="no aws-local-stepfunctions (make asl-interpreter: needs Node and npm)",
    ),
]

BATCH = {
    "task_type": "webhook",
    "executor": 0,
    "wake_at": "2026-01-01T00:00:00Z",
    "tasks": [{"task_id": "paths-1", "version": 1, "due_ms": 1767225602000}],
}
FIRED = {"return": {"StatusCode": 200, "Payload": {"tasks": 1, "claimed": 1, "fired": 1}}}
SENT = {"return": {"MessageId": "m-1"}}
FUNCTIONS = {  # each type's executor in template.yaml
    TaskType.WEBHOOK: "WebhookExecutorFunction",
    TaskType.LAMBDA: "LambdaExecutorFunction",
    TaskType.EVENTBRIDGE: "EventBridgeExecutorFunction",
    TaskType.SQS: "SqsExecutorFunction",
    TaskType.SNS: "SnsExecutorFunction",
    TaskType.EMAIL: "EmailExecutorFunction",
}
TRANSIENT = [
    "TableUnavailable", "NoTimeToSend", "Lambda.ServiceException", "Lambda.AWSLambdaException",
    "Lambda.SdkClientException", "Lambda.ClientExecutionTimeoutException", "Lambda.Unknown",
    "Sandbox.Timedout", "States.Timeout",
]  # fmt: skip
# What Fire retries and how often in all (its first call and the retries): Lambda's
# throttling for about a minute, a failed or timed-out invocation three times more, and an
# invocation that finds another still sending three times, 30 s apart and more.
RETRIED = {
    "Lambda.TooManyRequestsException": 9,
    **dict.fromkeys(TRANSIENT, 4),
    "DeliveryInProgress": 4,
}


@pytest.fixture(scope="module")
def machine() -> Iterator[dict[str, Any]]:
    """The definition and the executors' ARNs, as the embedded runtime created them, and
    the interpreter, one Node process for the module's executions."""
    with runtime_with() as runtime:
        arns = {kind: runtime.functions[name].arn for kind, name in FUNCTIONS.items()}
        definition = json.loads(runtime.definition)
    with subprocess.Popen(
        ["node", str(INTERPRETER / "run_case.mjs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as node:
        yield {"definition": definition, "arns": arns, "node": node}
        assert node.stdin is not None
        node.stdin.close()


def run(machine: dict[str, Any], responses: dict[str, list], **options: Any) -> dict[str, Any]:
    """One execution of `options.get("input", BATCH)` with these Task answers; its report
    (see tools/aws-local-stepfunctions/run_case.mjs)."""
    document = {
        "definition": machine["definition"],
        "input": BATCH,
        "execution_id": EXECUTION_ID,
        "responses": responses,
        **options,
    }
    node = machine["node"]
    node.stdin.write(json.dumps(document) + "\n")
    node.stdin.flush()
    line = node.stdout.readline()
    assert line, f"the interpreter ended (exit {node.wait()})"
    return json.loads(line)


def throw(name: str, message: str = "") -> dict[str, Any]:
    return {"throw": {"name": name, "message": message}}


def mock_case(name: str) -> dict[str, list[dict[str, Any]]]:
    """A test case of MockConfigFile.json (Step Functions Local's format) as answers."""
    mocks = json.loads(MOCKS.read_text())
    answers: dict[str, list[dict[str, Any]]] = {}
    for state, mocked in mocks["StateMachines"]["TaskMachine"]["TestCases"][name].items():
        answers[state] = []
        for calls, answer in mocks["MockedResponses"][mocked].items():
            first, _, last = calls.partition("-")
            if "Return" in answer:
                given = {"return": answer["Return"]}
            else:
                given = throw(answer["Throw"]["Error"], answer["Throw"]["Cause"])
            answers[state] += [given] * (int(last or first) - int(first) + 1)
    return answers


def test_the_machine_is_valid_asl(machine):
    """asl-validator, the interpreter's own check of states, paths and ARNs."""
    report = run(machine, mock_case("Fired"), validate=True)
    assert report["status"] == "SUCCEEDED", report


def test_a_batch_fires_in_two_states_with_ids_only(machine):
    report = run(machine, mock_case("Fired"))
    assert report["status"] == "SUCCEEDED"
    assert report["entered"] == ["WaitUntilWake", "Fire"]  # two transitions: what Standard bills
    assert report["output"] == BATCH  # Fire's answer is dropped: the state stays small
    (call,) = report["calls"]["Fire"]
    assert call["input"] == {
        "FunctionName": machine["arns"][TaskType.WEBHOOK],
        "Payload": {"execution": EXECUTION_ID, "task_type": "webhook", "tasks": BATCH["tasks"]},
    }


def test_the_wait_lets_go_at_wake_at_and_not_before(machine):
    wake_ms = clock.now_ms() + 1_500
    report = run(machine, mock_case("Fired"), input=BATCH | {"wake_at": clock.to_iso(wake_ms)},
                 real_waits=True)  # fmt: skip
    assert report["status"] == "SUCCEEDED"
    (call,) = report["calls"]["Fire"]
    assert call["at_ms"] >= wake_ms


@pytest.mark.parametrize("task_type", list(TaskType))
def test_the_input_chooses_the_executor_of_its_type(machine, task_type):
    batch = BATCH | {"task_type": task_type.value, "executor": EXECUTORS.index(task_type)}
    report = run(machine, {"Fire": [FIRED]}, input=batch)
    (call,) = report["calls"]["Fire"]
    assert call["input"]["FunctionName"] == machine["arns"][task_type]


def test_a_busy_lambda_is_retried_then_the_batch_fires(machine):
    report = run(machine, mock_case("RetryThenFired"))
    assert report["status"] == "SUCCEEDED"
    assert len(report["calls"]["Fire"]) == 2
    assert report["retries"] == [
        {"state": "Fire", "retrier": 0, "error": "Lambda.TooManyRequestsException"}
    ]


@pytest.mark.parametrize("error", sorted(RETRIED))
def test_each_retried_error_is_retried_its_count_then_dead_lettered(machine, error):
    report = run(machine, {"Fire": [throw(error)], "SendBatchToDeadLetterQueue": [SENT]})
    assert len(report["calls"]["Fire"]) == RETRIED[error]
    assert {retry["error"] for retry in report["retries"]} == {error}
    assert report["caught"] == [{"state": "Fire", "catcher": 0, "error": error}]
    assert report["entered"][-2:] == ["SendBatchToDeadLetterQueue", "Failed"]
    assert (report["status"], report["error"]) == ("FAILED", "BatchFailed")


def test_a_timed_out_invocation_sends_the_batch_and_its_error_to_the_dead_letter_queue(machine):
    report = run(machine, mock_case("InvocationFailedToDeadLetterQueue"))
    assert (report["status"], report["error"]) == ("FAILED", "BatchFailed")
    assert report["entered"] == ["WaitUntilWake", "Fire", "SendBatchToDeadLetterQueue", "Failed"]
    (letter,) = report["calls"]["SendBatchToDeadLetterQueue"]
    assert letter["input"]["MessageBody"] == {
        "execution": EXECUTION_ID,
        "batch": BATCH | {"error": {"Error": "Sandbox.Timedout",
                                    "Cause": "Task timed out after 120.00 seconds"}},
    }  # fmt: skip


@pytest.mark.parametrize(
    "error", ["Lambda.ResourceNotFoundException", "KeyError", "States.TaskFailed"]
)
def test_an_error_no_retrier_names_goes_to_the_dead_letter_queue_at_once(machine, error):
    report = run(machine, {"Fire": [throw(error)], "SendBatchToDeadLetterQueue": [SENT]})
    assert len(report["calls"]["Fire"]) == 1
    assert report["retries"] == []
    assert report["caught"] == [{"state": "Fire", "catcher": 0, "error": error}]
    assert (report["status"], report["error"]) == ("FAILED", "BatchFailed")


def test_a_dead_letter_queue_that_refuses_is_tried_seven_times_and_the_execution_fails(machine):
    refused = throw("SQS.AmazonSQSException", "Access to the resource is denied")
    report = run(
        machine,
        {"Fire": [throw("Lambda.Unknown")], "SendBatchToDeadLetterQueue": [refused]},
    )
    assert len(report["calls"]["SendBatchToDeadLetterQueue"]) == 7
    assert "Failed" not in report["entered"]
    assert (report["status"], report["error"]) == ("FAILED", "SQS.AmazonSQSException")
