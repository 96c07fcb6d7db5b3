"""Deploy smoke test without AWS: `sam build`'s template, translated by the SAM translator,
created as a stack in moto's CloudFormation, and every resource checked for its settings.

`make test` runs `sam build` before pytest; run `make sam-build` first when calling pytest
alone. moto cannot create a few resource types; those are checked in the translated
template instead, and listed here with the reason.
"""

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws

from tocsin.api import openapi_document
from tocsin.local.runtime import PROCESS_ENVIRONMENT
from tocsin.local.stack import STACK_NAME, create_stack, translate

pytestmark = pytest.mark.built

BUILT = Path(__file__).parents[2] / ".aws-sam" / "build" / "template.yaml"
TARGET_KEYS = [
    "arn:aws:kms:us-east-1:123456789012:key/1111aaaa-1111-4111-8111-111111111111",
    "arn:aws:kms:us-east-1:123456789012:key/2222bbbb-2222-4222-8222-222222222222",
]
PARAMETERS = {"AlarmEmail": "oncall@example.com", "TargetKmsKeyArns": ",".join(TARGET_KEYS)}
NOT_IN_MOTO = {
    "AWS::ApiGatewayV2::Api": "moto has no CloudFormation support for API Gateway v2",
    "AWS::ApiGatewayV2::Stage": "moto has no CloudFormation support for API Gateway v2",
    "AWS::SQS::QueuePolicy": "moto has no CloudFormation support for queue policies",
    "AWS::CloudWatch::Alarm": "moto has no CloudFormation support for alarms",
    "AWS::SNS::Subscription": "moto has no CloudFormation support for SNS subscriptions",
}
IGNORED_BY_MOTO = {  # properties moto's CloudFormation drops: checked in the template instead
    "PointInTimeRecoverySpecification": "moto leaves PITR off",
    "TimeToLiveSpecification": "moto leaves TTL off",
    "TracingConfig": "moto's functions report PassThrough",
    "Layers": "moto's functions list no layers",
}
FUNCTIONS = {
    "FinderFunction",
    "ApiFunction",
    "SubmitFunction",
    "WebhookExecutorFunction",
    "LambdaExecutorFunction",
    "EventBridgeExecutorFunction",
    "SqsExecutorFunction",
    "SnsExecutorFunction",
    "EmailExecutorFunction",
}


@pytest.fixture(scope="module")
def deployed() -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    if not BUILT.is_file():
        pytest.fail("no .aws-sam/build/template.yaml: run `make sam-build` (make test does)")
    with mock.patch.dict(os.environ, PROCESS_ENVIRONMENT), mock_aws(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tried to parse AWS::")  # see NOT_IN_MOTO
        template, code_dirs = translate(BUILT, PARAMETERS)
        for logical_id, folder in code_dirs.items():
            assert (folder / "app.py").is_file(), f"{logical_id}: no built app.py in {folder}"
        create_stack(template, PARAMETERS)
        cloudformation = boto3.client("cloudformation")
        stack = cloudformation.describe_stacks(StackName=STACK_NAME)["Stacks"][0]
        assert stack["StackStatus"] == "CREATE_COMPLETE"
        resources = cloudformation.list_stack_resources(StackName=STACK_NAME)
        physical = {
            r["LogicalResourceId"]: r["PhysicalResourceId"]
            for r in resources["StackResourceSummaries"]
        }
        yield template, physical


def test_the_build_has_the_layer_with_the_package():
    layer = BUILT.parent / "TocsinLayer" / "python"
    assert (layer / "tocsin" / "fire" / "executor.py").is_file()
    assert (layer / "aws_lambda_powertools").is_dir() and (layer / "pydantic").is_dir()


def test_the_tasks_table_has_its_indexes_and_ttl(deployed):
    _, physical = deployed
    dynamodb = boto3.client("dynamodb")
    table = dynamodb.describe_table(TableName=physical["TasksTable"])["Table"]
    indexes = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    assert [k["AttributeName"] for k in indexes["DispatchIndex"]["KeySchema"]] == [
        "gsi_pk",
        "gsi_due_ms",
    ]
    assert indexes["DispatchIndex"]["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": ["version", "task_type", "requeues", "placed_ms"],
    }
    assert [k["AttributeName"] for k in indexes["OwnerKeysIndex"]["KeySchema"]] == [
        "owner",
        "due_ms",
    ]
    assert [k["AttributeName"] for k in indexes["ScheduleKeysIndex"]["KeySchema"]] == [
        "schedule_id",
        "due_ms",
    ]
    for listing in ("OwnerKeysIndex", "ScheduleKeysIndex"):  # state changes do not write them
        assert indexes[listing]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_the_schedules_table_has_its_indexes(deployed):
    _, physical = deployed
    table = boto3.client("dynamodb").describe_table(TableName=physical["SchedulesTable"])["Table"]
    indexes = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    assert [k["AttributeName"] for k in indexes["DueIndex"]["KeySchema"]] == [
        "gsi_pk",
        "gsi_next_ms",
    ]
    assert [k["AttributeName"] for k in indexes["OwnerIndex"]["KeySchema"]] == [
        "owner",
        "schedule_id",
    ]


def test_every_function_exists_on_python_313_with_the_layer(deployed):
    _, physical = deployed
    lambda_ = boto3.client("lambda")
    for logical_id in FUNCTIONS:
        config = lambda_.get_function(FunctionName=physical[logical_id])["Configuration"]
        assert config["Runtime"] == "python3.13" and config["Handler"] == "app.handler"
        environment = config["Environment"]["Variables"]
        assert environment["TASKS_TABLE"] == physical["TasksTable"], logical_id
        assert environment["SCHEDULES_TABLE"] == physical["SchedulesTable"], logical_id
        assert environment["POWERTOOLS_METRICS_NAMESPACE"] == "Tocsin"


def test_the_state_machine_and_the_finder_schedule_exist(deployed):
    _, physical = deployed
    machines = boto3.client("stepfunctions").list_state_machines()["stateMachines"]
    assert [m["stateMachineArn"] for m in machines] == [physical["TaskStateMachine"]]
    events = boto3.client("events")
    rules = {r["Name"]: r for r in events.list_rules()["Rules"]}
    [schedule] = [r for r in rules.values() if r.get("ScheduleExpression")]
    assert schedule["ScheduleExpression"] == "rate(1 minute)"
    [target] = events.list_targets_by_rule(Rule=schedule["Name"])["Targets"]
    assert target["Arn"].endswith(physical["FinderFunction"])
    [submit] = [r for r in rules.values() if "tocsin.submit" in r.get("EventPattern", "")]
    [target] = events.list_targets_by_rule(Rule=submit["Name"])["Targets"]
    assert target["Arn"].endswith(":" + physical["SubmitQueue"].rsplit("/", 1)[-1])


def test_the_queues_are_encrypted_and_the_submit_queue_redrives(deployed):
    _, physical = deployed
    sqs = boto3.client("sqs")
    queues = ("DeadLetterQueue", "SubmitQueue", "SubmitDeadLetterQueue", "BulkQueue")
    for name in (*queues, "BulkDeadLetterQueue"):
        attributes = sqs.get_queue_attributes(QueueUrl=physical[name], AttributeNames=["All"])
        assert attributes["Attributes"]["SqsManagedSseEnabled"] == "true", name
    for queue in ("SubmitQueue", "BulkQueue"):
        url = physical[queue]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        redrive = attributes["Attributes"]["RedrivePolicy"]
        redrive = json.loads(redrive) if isinstance(redrive, str) else redrive
        letters = physical[queue.replace("Queue", "DeadLetterQueue")].rsplit("/")[-1]
        assert redrive["deadLetterTargetArn"].endswith(letters)
        assert int(redrive["maxReceiveCount"]) == 5
    mappings = boto3.client("lambda").list_event_source_mappings()["EventSourceMappings"]
    by_function = {m["FunctionArn"].rsplit(":", 1)[-1]: m for m in mappings}
    assert set(by_function) == {physical["SubmitFunction"], physical["BulkFunction"]}
    submit = by_function[physical["SubmitFunction"]]
    assert submit["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_operations_resources_exist(deployed):
    _, physical = deployed
    keys = boto3.client("kms").list_keys()["Keys"]  # describe_key trips on moto's policy
    assert physical["OperationsKey"] in {k["KeyId"] for k in keys}
    topic = boto3.client("sns").get_topic_attributes(TopicArn=physical["AlarmTopic"])
    assert topic["Attributes"]["KmsMasterKeyId"]
    dashboards = boto3.client("cloudwatch").list_dashboards()["DashboardEntries"]
    assert [d["DashboardName"] for d in dashboards] == [f"{STACK_NAME}-tocsin"]


def test_what_moto_cannot_create_is_in_the_translated_template(deployed):
    template, physical = deployed
    skipped = {
        resource["Type"]
        for logical_id, resource in template["Resources"].items()
        if logical_id not in physical and resource.get("Condition") != "Provisioned"
    }  # the default BillingMode (on demand) scales nothing: tests/integration/test_capacity.py
    assert skipped == set(NOT_IN_MOTO)
    resources = template["Resources"]
    [api] = [r for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Api"]
    routes = api["Properties"]["Body"]["paths"]
    assert set(routes) == set(openapi_document()["paths"])  # every route the API declares
    assert {"/tasks", "/schedules/{id}/upcoming"} <= set(routes)
    for path, methods in routes.items():
        for method, operation in methods.items():
            assert operation["security"] == [{"AWS_IAM": []}], (path, method)
    alarms = {k: r for k, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert set(alarms) == {
        "DeadLetterAlarm",
        "SubmitDeadLetterAlarm",
        "FinderErrorsAlarm",
        "ExecutionsFailedAlarm",
        "StuckTasksAlarm",
        "HostHeldAlarm",
        "LatenessAlarm",
    }
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    [subscription] = [r for r in resources.values() if r["Type"] == "AWS::SNS::Subscription"]
    assert subscription["Properties"]["Endpoint"] == {"Ref": "AlarmEmail"}


def test_what_moto_ignores_is_set_in_the_translated_template(deployed):
    resources = deployed[0]["Resources"]
    for table in ("TasksTable", "SentTable", "BodiesTable", "SchedulesTable"):
        properties = resources[table]["Properties"]
        assert properties["PointInTimeRecoverySpecification"] == {
            "PointInTimeRecoveryEnabled": True
        }
        assert properties["SSESpecification"] == {"SSEEnabled": True}
    ttl = resources["TasksTable"]["Properties"]["TimeToLiveSpecification"]
    assert ttl == {"AttributeName": "expires_at", "Enabled": True}
    for logical_id in FUNCTIONS:
        properties = resources[logical_id]["Properties"]
        assert properties["TracingConfig"] == {"Mode": "Active"}
        [layer] = properties["Layers"]  # SAM names the layer version with a content hash
        assert resources[layer["Ref"]]["Type"] == "AWS::Lambda::LayerVersion"


def _statements(resource: dict[str, Any]) -> list[dict[str, Any]]:
    properties = resource["Properties"]
    documents = [p["PolicyDocument"] for p in properties.get("Policies", [])]
    if "PolicyDocument" in properties:
        documents.append(properties["PolicyDocument"])
    return [statement for document in documents for statement in document["Statement"]]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_role_or_policy_allows_every_resource(deployed):
    resources = deployed[0]["Resources"]
    checked = 0
    for logical_id, resource in resources.items():
        if resource["Type"] not in ("AWS::IAM::Role", "AWS::IAM::ManagedPolicy"):
            continue
        for statement in _statements(resource):
            assert "*" not in _as_list(statement["Resource"]), (logical_id, statement["Action"])
            checked += 1
    assert checked > 20


def test_each_executor_may_reach_only_its_own_kind_of_target(deployed):
    resources = deployed[0]["Resources"]
    own = {
        "WebhookExecutorFunction": {"secretsmanager"},
        "LambdaExecutorFunction": {"lambda"},
        "EventBridgeExecutorFunction": {"events"},
        "SqsExecutorFunction": {"sqs"},
        "SnsExecutorFunction": {"sns"},
        "EmailExecutorFunction": {"ses"},
    }
    # claims, marks and the idempotency record; each failed task's dead letter
    shared = {"dynamodb", "sqs"}
    for function, services in own.items():
        role = resources[f"{function}Role"]
        actions = {a for s in _statements(role) for a in _as_list(s["Action"])}
        assert {a.split(":")[0] for a in actions} == services, function
        managed = role["Properties"]["ManagedPolicyArns"]
        assert {"Ref": "ExecutorAccessPolicy"} in managed
    executor_policy = _statements(resources["ExecutorAccessPolicy"])
    assert {a.split(":")[0] for s in executor_policy for a in _as_list(s["Action"])} == shared
    [dead_letters] = [s for s in executor_policy if s["Action"] == "sqs:SendMessage"]
    assert dead_letters["Resource"] == {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}
    machine = {
        a for s in _statements(resources["TaskStateMachineRole"]) for a in _as_list(s["Action"])
    }
    assert {a.split(":")[0] for a in machine} == {"lambda", "sqs"}  # the claim is the executor's


def test_target_keys_are_usable_by_the_executors_that_send_to_encrypted_targets_only(deployed):
    template, physical = deployed
    resources = template["Resources"]
    [grant] = _statements(resources["TargetKeysPolicy"])
    assert sorted(grant["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert grant["Resource"] == {"Ref": "TargetKmsKeyArns"}
    only_with_keys = {
        "Fn::If": ["HasTargetKmsKeys", {"Ref": "TargetKeysPolicy"}, {"Ref": "AWS::NoValue"}]
    }
    for function in FUNCTIONS:  # moto does not attach managed policies: read the template
        managed = resources[f"{function}Role"]["Properties"].get("ManagedPolicyArns", [])
        assert (only_with_keys in managed) == (function in SENDERS_TO_ENCRYPTED_TARGETS), function
    iam = boto3.client("iam")
    document = iam.get_policy_version(
        PolicyArn=physical["TargetKeysPolicy"],
        VersionId=iam.get_policy(PolicyArn=physical["TargetKeysPolicy"])["Policy"][
            "DefaultVersionId"
        ],
    )["PolicyVersion"]["Document"]
    assert document["Statement"][0]["Resource"] == TARGET_KEYS  # those keys, none other


SENDERS_TO_ENCRYPTED_TARGETS = {
    "SqsExecutorFunction",
    "SnsExecutorFunction",
    "EventBridgeExecutorFunction",
}
