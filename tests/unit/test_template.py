"""The template, the state machine and the code agree on task types and wiring."""

import json
import re
from pathlib import Path

from samtranslator.yaml_helper import yaml_parse

from tocsin.model import MAX_ATTEMPTS_LIMIT, TaskType
from tocsin.targets import TARGETS

ROOT = Path(__file__).parents[2]
TEMPLATE = yaml_parse((ROOT / "template.yaml").read_text())
ASL = json.loads((ROOT / "statemachines" / "task.asl.json").read_text())


def test_every_task_type_has_a_route_an_executor_and_a_target():
    routes = {c["StringEquals"]: c["Next"] for c in ASL["States"]["Route"]["Choices"]}
    assert set(routes) == {t.value for t in TaskType} == set(TARGETS)
    substitutions = TEMPLATE["Resources"]["TaskStateMachine"]["Properties"][
        "DefinitionSubstitutions"
    ]
    for state in routes.values():
        placeholder = ASL["States"][state]["Parameters"]["FunctionName"]
        key = re.fullmatch(r"\$\{(\w+)\}", placeholder).group(1)
        function = substitutions[key]["Fn::GetAtt"][0]
        code = TEMPLATE["Resources"][function]["Properties"]["CodeUri"]
        assert (ROOT / code / "app.py").is_file()


def test_every_placeholder_has_a_substitution():
    text = (ROOT / "statemachines" / "task.asl.json").read_text()
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    substitutions = TEMPLATE["Resources"]["TaskStateMachine"]["Properties"][
        "DefinitionSubstitutions"
    ]
    assert placeholders == set(substitutions)


def test_claim_accepts_pending_and_scheduled_of_the_same_version_only():
    claim = ASL["States"]["Claim"]["Parameters"]
    assert (
        claim["ConditionExpression"] == "#status IN (:pending, :scheduled) AND #version = :version"
    )
    catches = ASL["States"]["Claim"]["Catch"]
    assert catches[0]["ErrorEquals"] == ["DynamoDB.ConditionalCheckFailedException"]
    assert ASL["States"][catches[0]["Next"]]["Type"] == "Succeed"


def test_the_executor_retries_allow_the_largest_max_attempts():
    for state in ASL["States"].values():
        if state.get("Resource") == "arn:aws:states:::lambda:invoke":
            [retry] = state["Retry"]
            assert retry["MaxAttempts"] + 1 == MAX_ATTEMPTS_LIMIT
            assert "TransientTargetError" in retry["ErrorEquals"]


def test_the_step_functions_local_mocks_name_real_task_states():
    mocks = json.loads((ROOT / "statemachines" / "test" / "MockConfigFile.json").read_text())
    [machine] = mocks["StateMachines"].values()
    assert set(machine["TestCases"]) == {
        "ClaimWon",
        "ClaimLost",
        "RetryThenSuccess",
        "FailureToDeadLetterQueue",
    }
    for case in machine["TestCases"].values():
        for state, response in case.items():
            assert ASL["States"][state]["Type"] == "Task", state
            assert response in mocks["MockedResponses"], response
    claimed = mocks["MockedResponses"]["ClaimedWebhook"]["0"]["Return"]["Attributes"]
    assert claimed["task_type"]["S"] in {
        c["StringEquals"] for c in ASL["States"]["Route"]["Choices"]
    }
