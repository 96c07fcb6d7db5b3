"""The template, the state machine and the code agree on task types and wiring."""

import copy
import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from samtranslator.yaml_helper import yaml_parse

from tocsin import aws
from tocsin.dispatch import EXECUTORS, MAX_STAGGER_S, DispatchReport
from tocsin.fire.executor import FINISH_MARGIN_MS
from tocsin.local.stack import expand_language_extensions
from tocsin.measure.cost import AWS_LEAD_MS
from tocsin.model import TaskType
from tocsin.reconcile import ReconcileReport
from tocsin.targets import TARGETS

ROOT = Path(__file__).parents[2]
TEMPLATE = yaml_parse((ROOT / "template.yaml").read_text())
ASL = json.loads((ROOT / "statemachines" / "task.asl.json").read_text())


def executor_array() -> list[str]:
    """The Fire state's executors, in order (the input's `executor` indexes them)."""
    chosen = ASL["States"]["Fire"]["Parameters"]["FunctionName.$"]
    return re.findall(r"'\$\{(\w+)\}'", chosen)


def test_the_executor_array_follows_task_types_and_each_runs_its_type():
    placeholders = executor_array()
    assert len(placeholders) == len(EXECUTORS) == len(TARGETS)
    substitutions = TEMPLATE["Resources"]["TaskStateMachine"]["Properties"][
        "DefinitionSubstitutions"
    ]
    for task_type, placeholder in zip(EXECUTORS, placeholders, strict=True):
        function = substitutions[placeholder]["Fn::GetAtt"][0]
        code = TEMPLATE["Resources"][function]["Properties"]["CodeUri"]
        handler = (ROOT / code / "app.py").read_text()
        assert f"executor_handler(TaskType.{task_type.name})" in handler, function


def test_every_placeholder_has_a_substitution():
    text = (ROOT / "statemachines" / "task.asl.json").read_text()
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    substitutions = TEMPLATE["Resources"]["TaskStateMachine"]["Properties"][
        "DefinitionSubstitutions"
    ]
    assert placeholders == set(substitutions)
    assert "arn:aws:" not in text  # the stack's partition, substituted


def emitted_metrics() -> set[str]:
    """Every metric Tocsin's code puts in its namespace: the names its handlers and domain
    add, and the finder's report, whose every count is a metric (functions/finder)."""
    source = "".join(path.read_text() for path in (ROOT / "src" / "tocsin").rglob("*.py"))
    named = set(re.findall(r'add_metric\(name="(\w+)"', source))
    finder = DispatchReport(0, Counter()).as_dict() | ReconcileReport().as_dict()
    return named | set(finder)


def test_the_dashboard_and_alarms_read_metrics_the_code_emits():
    """A metric misspelt on the dashboard or in an alarm is a flat line, or an alarm that
    never fires; each of Tocsin's that they name is one the code emits."""
    body = TEMPLATE["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    on_dashboard = set()
    for widget in json.loads(body)["widgets"]:
        before: list[str] = []
        for metric in widget["properties"]["metrics"]:
            names = [part for part in metric if isinstance(part, str)]
            if names[0] == "...":  # the metric before, with another statistic or dimension
                continue
            # "." is the part before's, in the same place
            before = [b if n == "." else n for n, b in zip(names, before + names, strict=False)]
            if before[0] == "Tocsin":
                on_dashboard.add(before[1])
    alarmed = {
        resource["Properties"]["MetricName"]
        for resource in TEMPLATE["Resources"].values()
        if isinstance(resource, dict)  # not a Fn::ForEach
        and resource["Type"] == "AWS::CloudWatch::Alarm"
        and resource["Properties"].get("Namespace") == "Tocsin"
    }
    assert {"Retrying", "HostHeld", "WaitingOnHost", "HostReleased"} <= on_dashboard
    assert {"HostHeld", "LatenessMs", "stuck"} <= alarmed
    assert on_dashboard | alarmed <= emitted_metrics()


def test_the_success_path_is_two_states_and_ends_at_fire():
    start = ASL["States"][ASL["StartAt"]]
    assert start["Type"] == "Wait" and start["Next"] == "Fire"
    assert ASL["States"]["Fire"]["End"] is True
    assert ASL["States"]["Fire"]["ResultPath"] is None  # nothing the executor says enters the state


def test_a_throttled_invoke_is_retried_for_most_of_a_minute_before_the_reconciler():
    """Lambda answers TooManyRequestsException past the account's concurrency or a function's
    scaling (1,000 new environments in 10 s): the batch is tried again for longer than the
    other retrier's 7 s (up to a minute, each wait at most 10 s), late rather than left to
    the reconciler a quarter of an hour later."""
    fire = ASL["States"]["Fire"]
    [throttled] = [
        r for r in fire["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"]
    ]
    assert fire["Retry"].index(throttled) == 0  # Step Functions takes the first that matches
    waits = [
        min(
            throttled["IntervalSeconds"] * throttled["BackoffRate"] ** n,
            throttled["MaxDelaySeconds"],
        )
        for n in range(throttled["MaxAttempts"])
    ]
    assert 30 <= sum(waits) <= 60


def test_the_fire_state_outlasts_the_executor_and_retries_what_lambda_reports_for_timeouts():
    fire = ASL["States"]["Fire"]
    timeouts = {
        TEMPLATE["Globals"]["Function"]["Timeout"],
        *(
            TEMPLATE["Resources"][f"{name}Function"]["Properties"].get("Timeout")
            for name in ("WebhookExecutor", "LambdaExecutor", "SqsExecutor")
        ),
    } - {None}
    assert fire["TimeoutSeconds"] > max(timeouts)
    retried = {name for retry in fire["Retry"] for name in retry["ErrorEquals"]}
    assert {
        "Sandbox.Timedout",
        "Lambda.Unknown",
        "Lambda.ClientExecutionTimeoutException",
        "States.Timeout",
        "TableUnavailable",
        "DeliveryInProgress",
    } <= retried
    [in_progress] = [r for r in fire["Retry"] if r["ErrorEquals"] == ["DeliveryInProgress"]]
    waits = [
        in_progress["IntervalSeconds"] * in_progress["BackoffRate"] ** n
        for n in range(in_progress["MaxAttempts"])
    ]
    assert sum(waits) > max(timeouts)  # longer than the invocation it waits for may live
    [catch] = fire["Catch"]
    assert ASL["States"][catch["Next"]]["Resource"].endswith(":states:::sqs:sendMessage")


def test_the_step_functions_local_mocks_name_real_task_states():
    mocks = json.loads((ROOT / "statemachines" / "test" / "MockConfigFile.json").read_text())
    [machine] = mocks["StateMachines"].values()
    assert set(machine["TestCases"]) == {
        "Fired",
        "RetryThenFired",
        "InvocationFailedToDeadLetterQueue",
    }
    for case in machine["TestCases"].values():
        for state, response in case.items():
            assert ASL["States"][state]["Type"] == "Task", state
            assert response in mocks["MockedResponses"], response


def test_at_the_parameters_maxima_one_attempt_still_fits_the_executors_timeout():
    """The last gate comes after the lead, a full batch's preparation, the largest stagger,
    the window and Wait's flooring; one attempt of the slowest target must then end before
    the time the executor keeps for its final marks, or no task of such a batch could be
    tried once without risking an invocation killed mid-attempt."""
    maximum = {name: p.get("MaxValue") for name, p in TEMPLATE["Parameters"].items()}
    last_gate_s = (
        maximum["LeadMilliseconds"] / 1000
        + maximum["PrepareMillisecondsPerTask"] * maximum["BatchSize"] / 1000
        + MAX_STAGGER_S
        + maximum["BatchWindowMilliseconds"] / 1000
        + 1  # Wait drops the wake's milliseconds
    )
    webhook = TARGETS[TaskType.WEBHOOK](url="https://example.com/")
    slowest_s = max(webhook.attempt_limit_s, aws.target_attempt_limit_s())
    timeout_s = TEMPLATE["Globals"]["Function"]["Timeout"]
    assert last_gate_s + slowest_s <= timeout_s - FINISH_MARGIN_MS / 1000


def test_the_layer_is_built_for_the_runtime_and_cpu_the_functions_run_on():
    makefile = (ROOT / "layers" / "tocsin" / "Makefile").read_text()
    version = re.search(r"^RUNTIME_VERSION = (\S+)$", makefile, re.M).group(1)
    wheels_for = re.search(r"^PLATFORM \?= manylinux2014_(\w+)$", makefile, re.M).group(1)
    function = TEMPLATE["Globals"]["Function"]
    layer = TEMPLATE["Resources"]["TocsinLayer"]
    assert function["Runtime"] == f"python{version}" == "python3.13"
    assert layer["Properties"]["CompatibleRuntimes"] == [function["Runtime"]]
    assert function["Architectures"] == layer["Properties"]["CompatibleArchitectures"]
    assert function["Architectures"] == [layer["Metadata"]["BuildArchitecture"]] == ["arm64"]
    assert wheels_for == "aarch64"


def test_the_generated_signing_secret_is_a_base64_key():
    """Secrets Manager's letters and digits are base64 digits; a length that is a multiple
    of 4 decodes without padding, as Standard Webhooks libraries read it."""
    generate = TEMPLATE["Resources"]["WebhookSigningSecret"]["Properties"]["GenerateSecretString"]
    assert generate["ExcludePunctuation"] and generate["PasswordLength"] % 4 == 0
    assert generate["PasswordLength"] * 3 // 4 >= 32  # at least a 256-bit key


def allowed(function: str, resource: str) -> set[str]:
    """The actions the function's own policy statements allow on one template resource."""
    statements = [
        statement
        for policy in TEMPLATE["Resources"][function]["Properties"]["Policies"]
        if isinstance(policy, dict) and "Statement" in policy
        for statement in policy["Statement"]
    ]
    actions: set[str] = set()
    for statement in statements:
        if statement["Resource"] == {"Fn::GetAtt": [resource, "Arn"]}:
            names = statement["Action"]
            actions.update([names] if isinstance(names, str) else names)
    return actions


def test_the_finder_may_write_each_part_of_an_occurrences_transaction():
    """TransactWriteItems needs the permission of each action it holds (moto checks none):
    the occurrence's task is a Put, or an Update replacing an older revision's, and the
    schedule's advance an Update."""
    assert {"dynamodb:PutItem", "dynamodb:UpdateItem"} <= allowed("FinderFunction", "TasksTable")
    assert "dynamodb:UpdateItem" in allowed("FinderFunction", "SchedulesTable")
    assert {"dynamodb:PutItem", "dynamodb:UpdateItem"} <= allowed("ApiFunction", "TasksTable")


def test_a_warmed_table_warms_every_index_its_task_writes_change():
    """DynamoDB throttles a table's writes when an index cannot take their copies (GSI back
    pressure): warming the table alone would leave a burst's marks, which move tasks in the
    DispatchIndex, and its submits, which enter OwnerKeysIndex, at the indexes' own rate."""
    warm = {
        "Fn::If": [
            "HasWarmWrites",
            {"WriteUnitsPerSecond": {"Ref": "TableWarmWritesPerSecond"}},
            {"Ref": "AWS::NoValue"},
        ]
    }
    tasks = TEMPLATE["Resources"]["TasksTable"]["Properties"]
    assert tasks["WarmThroughput"] == warm
    indexes = {index["IndexName"]: index for index in tasks["GlobalSecondaryIndexes"]}
    assert indexes["DispatchIndex"]["WarmThroughput"] == warm
    assert indexes["OwnerKeysIndex"]["WarmThroughput"] == warm


def evaluated(value: Any, mappings: dict[str, Any]) -> Any:
    """A ResourceId or ScalableDimension as CloudFormation would make it, a table's name
    standing for its logical id."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return value["Ref"]
    if "Fn::FindInMap" in value:
        name, key, attribute = value["Fn::FindInMap"]
        return mappings[name][key][attribute]
    text, variables = value["Fn::Sub"]
    for name, variable in variables.items():
        text = text.replace(f"${{{name}}}", evaluated(variable, mappings))
    return text


def test_provisioned_capacity_scales_every_table_and_index_but_the_sent_log():
    """BillingMode=PROVISIONED: each table billed by it, and each of its indexes (an index
    short of capacity throttles its table), has read and write capacity to start from and a
    target-tracking policy on each; only the rarely written Sent table stays on demand."""
    template = expand_language_extensions(copy.deepcopy(TEMPLATE))
    resources = template["Resources"]
    tables = {k: r for k, r in resources.items() if r["Type"] == "AWS::DynamoDB::Table"}
    billed = {
        k for k, r in tables.items() if r["Properties"]["BillingMode"] == {"Ref": "BillingMode"}
    }
    assert set(tables) - billed == {"SentTable"}
    expected = set()
    for name in billed:
        indexes = tables[name]["Properties"].get("GlobalSecondaryIndexes", [])
        for part in [tables[name]["Properties"], *indexes]:
            assert part["ProvisionedThroughput"]["Fn::If"][0] == "Provisioned", name
        for use in ("Read", "Write"):
            expected.add((f"table/{name}", f"dynamodb:table:{use}CapacityUnits"))
            for index in indexes:
                expected.add(
                    (
                        f"table/{name}/index/{index['IndexName']}",
                        f"dynamodb:index:{use}CapacityUnits",
                    )
                )
    targets = {k: r for k, r in resources.items() if r["Type"].endswith("::ScalableTarget")}
    scaled = {
        (
            evaluated(p["ResourceId"], template["Mappings"]),
            evaluated(p["ScalableDimension"], template["Mappings"]),
        )
        for p in (r["Properties"] for r in targets.values())
    }
    assert scaled == expected and len(targets) == len(expected)
    policies = [r for r in resources.values() if r["Type"].endswith("::ScalingPolicy")]
    assert {p["Properties"]["ScalingTargetId"]["Ref"] for p in policies} == set(targets)
    for policy in policies:
        target = targets[policy["Properties"]["ScalingTargetId"]["Ref"]]["Properties"]
        tracking = policy["Properties"]["TargetTrackingScalingPolicyConfiguration"]
        use = (
            "Read"
            if "Read" in evaluated(target["ScalableDimension"], template["Mappings"])
            else "Write"
        )
        metric = tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
        assert metric == {"Fn::Sub": f"DynamoDB{use}CapacityUtilization"}
        assert tracking["TargetValue"] == {"Ref": "CapacityTargetUtilization"}
    for resource in [*targets.values(), *policies]:
        assert resource["Condition"] == "Provisioned"


def referred(value: Any) -> set[str]:
    """The logical ids a resource waits for: what it names by Ref, Fn::GetAtt or DependsOn."""
    if isinstance(value, list):
        return set().union(*map(referred, value)) if value else set()
    if not isinstance(value, dict):
        return set()
    found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
    if "Fn::GetAtt" in value:
        found.add(value["Fn::GetAtt"][0])
    depends = value.get("DependsOn", [])
    found.update([depends] if isinstance(depends, str) else depends)
    return found | referred(list(value.values()))


def assert_made_one_at_a_time(resources: dict[str, Any]) -> None:
    """Each target-tracking policy makes CloudWatch alarms, and an account may make or
    delete three a second: made side by side, 16 policies fail a deploy with "Rate
    exceeded". So the 36 targets and policies stand in one line, each waiting for the one
    before it, and CloudFormation makes them (and deletes them, last first) one at a time."""
    scaling = {k for k, r in resources.items() if r["Type"].startswith("AWS::ApplicationAuto")}
    waits_for = {name: referred(resources[name]) & scaling for name in scaling}
    line = [name for name in scaling if not waits_for[name]]
    assert len(line) == 1, f"{len(line)} made at once: {sorted(line)}"
    while after := [name for name in scaling if line[-1] in waits_for[name]]:
        assert len(after) == 1, f"{after} made at once, after {line[-1]}"
        line.append(after[0])
    assert len(line) == len(scaling) == 36


def test_the_stack_makes_its_scaling_resources_one_at_a_time():
    assert_made_one_at_a_time(expand_language_extensions(copy.deepcopy(TEMPLATE))["Resources"])


# SAM CLI's own AWS::LanguageExtensions (what `sam build` and `sam deploy` run), in the
# environment `make` installs it in: it resolves Fn::Select, Fn::FindInMap and Fn::Sub as
# CloudFormation's transform does, where the expander above knows only what template.yaml
# needs.
SAM_PYTHON = ROOT / ".venv-sam" / "bin" / "python"
SAM_EXPANSION = """
import json, sys
from samcli.lib.cfn_language_extensions.sam_integration import expand_language_extensions
from samcli.yamlhelper import yaml_parse
template = yaml_parse(open(sys.argv[1]).read())
parameters = {"BillingMode": "PROVISIONED"}
expanded = expand_language_extensions(template, parameter_values=parameters, enabled=True)
print(json.dumps(expanded.expanded_template, default=str))
"""


@pytest.mark.built
def test_sam_clis_own_transform_keeps_the_scaling_resources_in_one_line():
    expansion = [str(SAM_PYTHON), "-c", SAM_EXPANSION, str(ROOT / "template.yaml")]
    expanded = json.loads(subprocess.run(expansion, check=True, capture_output=True).stdout)
    assert_made_one_at_a_time(expanded["Resources"])


def test_the_bench_prices_executors_at_the_lead_a_deployed_stack_has():
    assert TEMPLATE["Parameters"]["LeadMilliseconds"]["Default"] == AWS_LEAD_MS


def test_a_tasks_body_is_kept_whenever_the_task_is():
    """A large task's target and payload live in the Bodies table: deleting the stack (or
    replacing a table) must keep them wherever it keeps the Tasks table, or the kept tasks
    could never fire."""
    resources = TEMPLATE["Resources"]
    policies = {
        name: (resources[name]["DeletionPolicy"], resources[name]["UpdateReplacePolicy"])
        for name in ("TasksTable", "BodiesTable")
    }
    assert policies["BodiesTable"] == policies["TasksTable"] == ("Retain", "Retain")


def test_the_look_ahead_covers_two_finder_runs_at_the_most_frequent_schedule():
    """A task must still be found when one finder run is missed: the look-ahead spans more
    than two runs. EventBridge schedules run once a minute at the most."""
    look_ahead = TEMPLATE["Parameters"]["LookAheadSeconds"]
    assert look_ahead["MinValue"] > 2 * 60
    assert look_ahead["Default"] > 2 * 60


def test_every_executor_takes_the_memory_size_the_stack_is_given():
    """ExecutorMemorySize sizes all six executors (CPU comes with it: one vCPU at 1,769 MB);
    the API, the finder and the submit function keep theirs."""
    resources = TEMPLATE["Resources"]
    executors = [name for name in resources if name.endswith("ExecutorFunction")]
    assert len(executors) == len(TARGETS)
    for name in executors:
        assert resources[name]["Properties"]["MemorySize"] == {"Ref": "ExecutorMemorySize"}
    assert TEMPLATE["Parameters"]["ExecutorMemorySize"]["Default"] == 256


def test_every_function_logs_to_a_group_of_the_stacks_kept_as_long_as_asked():
    """A function's default log group is Lambda's, made at its first invocation: it keeps
    every record for ever and outlives the stack. Each function logs to one the stack
    makes, with the stack's retention."""
    resources = expand_language_extensions(copy.deepcopy(TEMPLATE))["Resources"]
    functions = [n for n, r in resources.items() if r["Type"] == "AWS::Serverless::Function"]
    groups = set()
    for name in functions:
        group = resources[name]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert resources[group]["Type"] == "AWS::Logs::LogGroup", name
        assert resources[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        assert resources[group].get("DeletionPolicy", "Delete") == "Delete"
        groups.add(group)
    assert len(groups) == len(functions) == 10  # one each: a group's streams are one function's
    assert TEMPLATE["Parameters"]["LogRetentionDays"]["Default"] == 30


def test_guided_deploy_asks_the_parameters_in_the_consoles_groups_first_things_first():
    """`sam deploy --guided` asks in the Parameters' order and shows no description; the
    CloudFormation console shows the Interface's groups and labels. Both list every
    parameter once, in one order, the alarm email and the concurrency budget first."""
    interface = TEMPLATE["Metadata"]["AWS::CloudFormation::Interface"]
    grouped = [name for group in interface["ParameterGroups"] for name in group["Parameters"]]
    assert grouped == list(TEMPLATE["Parameters"])
    assert grouped[:2] == ["AlarmEmail", "ConcurrencyBudget"]
    assert set(interface["ParameterLabels"]) == set(grouped)
    assert all(parameter.get("Description") for parameter in TEMPLATE["Parameters"].values())


def test_the_operations_guide_lists_every_parameter_in_order_with_its_default():
    """docs/operations.md's parameter tables are the one place a person reads them: each
    parameter once, in the template's order, with the template's default."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide.split("## Parameters and sizing", 1)[1].split("### Quotas", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z]+)` \| ([^|]+) \|", section, re.MULTILINE)
    assert [name for name, _ in rows] == list(TEMPLATE["Parameters"])
    for name, shown in rows:
        default = str(TEMPLATE["Parameters"][name].get("Default", ""))
        assert shown.strip().strip("`") == (default or "empty"), name
