"""`tocsin bench` on small sizes: every scenario reports its figures and keeps the promises.
(The figures themselves are measured by `tocsin bench` at full size, not asserted here.)"""

import json
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from tests.conftest import MANY_P99_LATE_MS, last_json
from tests.integration.test_sandbox import SLACK, writable_cgroups
from tocsin.cli import main
from tocsin.dispatch import Batch, DueTask, execution_input
from tocsin.local.dynamodb_local import jar
from tocsin.measure import bench, lambda_bench, scenario
from tocsin.measure.bench import StartRecorder, baseline_input, recording_starts
from tocsin.model import TaskType
from tocsin.settings import Settings

pytestmark = [pytest.mark.slow, pytest.mark.tool]  # they wait for their tasks' due times


def test_spread_times_tocsin_and_the_baseline_on_the_same_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "BASELINE_MAX", 4)  # a larger plan: the baseline samples it
    plot = tmp_path / "lateness.png"
    arguments = ["bench", "--scenarios", "spread", "--scale", "0.005", "--json", "--cost"]
    assert main([*arguments, "--plot", str(plot)]) == 0
    spread = last_json(capsys.readouterr().out)["spread"]
    assert (spread["submitted"], spread["fired"]) == (5, 5)
    assert spread["early"] == spread["duplicates"] == spread["lost"] == 0
    assert spread["baseline"]["fired"] == spread["baseline"]["submitted"] == 4
    assert spread["baseline"]["sample_of"] == 5
    assert {"p50", "p90", "p99", "max"} <= set(spread["lateness_ms"])
    assert spread["baseline_to_tocsin_p99_error"] > 0
    split = spread["cpu_ms_per_task_by_process"]  # the runtime's and the DynamoDB child's
    # the child only answers DynamoDB; the runtime runs the handlers and the state machine
    # (their sum is cpu_ms_per_task by construction: the runtime's is the total less the child's)
    assert split["runtime"] > split["dynamodb"] > 0
    # Wait and Fire per execution, and an execution holds one task or more
    assert 0 < spread["cost"]["per_task"]["state_transitions"] <= 2
    assert spread["cost"]["per_task"]["api_requests"] == 1
    # the indexes' writes are billed: the put enters OwnerKeysIndex and a due shard, where
    # it stays; the claim and the final mark change neither (5 while a mark moved the entry
    # to a check shard and the final mark took it out; a late start on a slow machine, or
    # a long retry, moves it to a check shard: two more)
    assert 2 <= spread["cost"]["per_task"]["dynamodb_index_write_units"] < 4
    units = spread["cost"]["write_units_per_task"]  # the table's and each index's
    indexes = {name for name in units if name.startswith("index:")}
    assert "table" in units and indexes == {"index:DispatchIndex", "index:OwnerKeysIndex"}
    assert units["index:OwnerKeysIndex"] == 1  # put once; keys only: a mark changes nothing
    assert 1 <= units["index:DispatchIndex"] < 3  # a due shard's entry (a check shard's: +2)
    # each line at AWS's on-demand prices in us-east-1, per million tasks
    per_task, cost = spread["cost"]["per_task"], spread["cost"]["usd_per_million"]
    dollars_per_unit_per_million_tasks = {
        "state_transitions": 25.0,  # $0.025 per 1,000
        "lambda_invocations": 0.20,
        "dynamodb_write_units": 0.625,
        "dynamodb_index_write_units": 0.625,
        "dynamodb_reads": 0.125,
        "api_requests": 1.00,  # HTTP API
    }
    for unit, price in dollars_per_unit_per_million_tasks.items():
        assert cost[unit] == pytest.approx(per_task[unit] * price, abs=0.0005 * price + 0.01)
    assert cost["api_requests"] == 1.00
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_finder_scenarios_start_exactly_the_due_tasks_before_their_wake(capsys):
    scenarios = "finder-scale,throttled"
    assert main(["bench", "--scenarios", scenarios, "--scale", "0.01", "--json"]) == 0
    results = last_json(capsys.readouterr().out)
    scale = results["finder-scale"]
    assert scale["started"] == scale["due"] == 10 and scale["stored"] == 1010
    assert scale["started_not_due"] == scale["due_not_started"] == 0
    assert scale["items_read"] <= 1.1 * scale["due"]
    throttled = results["throttled"]
    assert throttled["started"] == throttled["tasks"] == 100
    assert throttled["started_after_wake"] == 0
    assert throttled["throttled_calls"] > 0  # the bucket was really in the way


def test_the_baseline_wakes_on_the_due_second_and_has_no_gate():
    config = Settings(LEAD_MS=2000)
    task = DueTask(1_800_000_001_500, "b-1", 1, TaskType.WEBHOOK)
    ours, plain = execution_input(Batch((task,)), config), baseline_input(task, config)
    assert ours["wake_at"] == "2027-01-15T07:59:59Z"  # the lead before due, floored
    assert plain["wake_at"] == "2027-01-15T08:00:01Z"  # the due second itself
    assert plain["tasks"] == [{"task_id": "b-1", "version": 1, "due_ms": 0}]
    assert {k: v for k, v in plain.items() if k not in ("wake_at", "tasks")} == {
        k: v for k, v in ours.items() if k not in ("wake_at", "tasks")
    }


@mock_aws
def test_the_start_stand_in_answers_in_the_services_place_and_refuses_beyond_its_bucket():
    sfn = boto3.client(
        "stepfunctions", config=Config(region_name="us-east-1", retries={"max_attempts": 0})
    )
    arn = sfn.create_state_machine(
        name="m",
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/r",
    )["stateMachineArn"]
    given = json.dumps({"wake_at": "2030-01-01T00:00:00Z", "tasks": []})
    with recording_starts(StartRecorder(burst=3, rate=0.0)) as recorder:
        started = [
            sfn.start_execution(stateMachineArn=arn, name=f"t{i}-v1", input=given) for i in range(3)
        ]
        with pytest.raises(ClientError) as refused:
            sfn.start_execution(stateMachineArn=arn, name="t3-v1", input=given)
    assert refused.value.response["Error"]["Code"] == "ThrottlingException"
    assert started[0]["executionArn"].endswith(":execution:m:t0-v1")
    assert set(recorder.starts) == {"t0-v1", "t1-v1", "t2-v1"} and recorder.throttled == 1
    assert recorder.wakes["t0-v1"] == "2030-01-01T00:00:00Z"
    assert sfn.list_executions(stateMachineArn=arn)["executions"] == []  # moto started none
    sfn.start_execution(stateMachineArn=arn, name="t4-v1", input=given)  # outside: moto's
    assert [e["name"] for e in sfn.list_executions(stateMachineArn=arn)["executions"]] == ["t4-v1"]


@pytest.mark.parametrize("plot", ["missing-folder/lateness.png", "lateness.txt"])
def test_bench_refuses_a_plot_it_could_not_write(tmp_path, capsys, plot):
    with pytest.raises(SystemExit) as refused:
        main(["bench", "--scenarios", "spread", "--plot", str(tmp_path / plot)])
    assert refused.value.code == 2 and "--plot" in capsys.readouterr().err


def test_bench_names_unknown_scenarios(capsys):
    assert main(["bench", "--scenarios", "warp"]) == 2
    assert "finder-scale" in capsys.readouterr().err


def test_dense_packs_each_window_into_one_execution(capsys):
    assert main(["bench", "--scenarios", "dense", "--scale", "0.005", "--json"]) == 0
    dense = last_json(capsys.readouterr().out)["dense"]
    assert dense["submitted"] == dense["fired"] == 30
    assert dense["early"] == dense["duplicates"] == dense["lost"] == 0
    assert "baseline" not in dense
    assert dense["executions"] <= 11  # 30 tasks over 10 s: a batch per second at most
    assert dense["transitions_per_task"] == round(2 * dense["executions"] / 30, 3)


def test_dense_on_dynamodb_local_counts_the_engines_cpu(capsys):
    """On DynamoDB Local's tables the CPU per task counts the JVM's, read from /proc."""
    if jar() is None or not Path("/proc/self/stat").exists():
        pytest.skip("DynamoDB Local (make dynamodb-local) and Linux's /proc are needed")
    arguments = ["--scenarios", "dense", "--scale", "0.005", "--tables", "dynamodb-local"]
    assert main(["bench", *arguments, "--json"]) == 0
    dense = last_json(capsys.readouterr().out)["dense"]
    assert dense["submitted"] == dense["fired"] == 30
    assert dense["early"] == dense["duplicates"] == dense["lost"] == 0
    split = dense["cpu_ms_per_task_by_process"]
    assert split["dynamodb"] > 0 and split["runtime"] > 0  # the JVM's CPU, read from /proc


@pytest.mark.any_python
@pytest.mark.timeout(900)  # alone 33 s, 22 of them building the layer; beside CI's passes, minutes
def test_cold_start_measures_every_function_beside_the_bare_handler(capsys):
    """Each function of the template initialises from the layer as `sam build` makes it,
    in a clean interpreter of the runtime's version (whichever Python runs the tests); the
    bare handler is the yardstick."""
    from tocsin.measure import cold_start

    try:
        cold_start.runtime_python()
    except RuntimeError as missing:
        pytest.skip(str(missing))
    results = cold_start.measure(rounds=1)
    assert set(results) == {cold_start.BARE, *cold_start.function_folders()}
    assert results[cold_start.BARE]["ratio"] == 1.0
    assert all(figures["init_cpu_ms"] > 0 for figures in results.values())
    assert {figures["python"][:4] for figures in results.values()} == {"3.13"}


def test_aws_burst_dispatches_every_task_and_judges_the_plan_against_aws_quotas(capsys):
    assert main(["bench", "--scenarios", "aws-burst", "--scale", "0.02", "--json"]) == 0
    burst = last_json(capsys.readouterr().out)["aws-burst"]
    assert burst["tasks"] == burst["finder_found"] == 1000 and burst["not_started"] == 0
    # 500 a batch at most, and 30 calls within any 100 ms: the second's 1,000 SNS tasks at
    # one topic, at random milliseconds (seed 7), are about 640 calls (one a millisecond),
    # 61 to 90 of them in their densest 100 ms: three batches (two would hold them as calls
    # of ten, which a millisecond's one or two tasks are not).
    assert burst["batches"] == 3
    assert burst["transitions"] == 6
    assert burst["all_woken_before_window"] and burst["all_claimed_before_window"]
    assert burst["peak_concurrency"] == 3 and burst["peak_writes_per_second"] <= 1000


def test_recurring_fires_every_occurrence_of_every_schedule_once(capsys):
    assert main(["bench", "--scenarios", "recurring", "--scale", "0.05", "--json"]) == 0
    recurring = last_json(capsys.readouterr().out)["recurring"]
    assert recurring["schedules"] == 5
    # every 1 to 5 s from a random millisecond, for 12 s: about 12 + 6 + 4 + 3 + 3 each
    assert 25 <= recurring["submitted"] <= 30
    assert recurring["fired"] == recurring["submitted"]
    assert recurring["early"] == recurring["duplicates"] == recurring["lost"] == 0
    assert 0 <= recurring["lateness_ms"]["p99"] <= MANY_P99_LATE_MS  # 25 tasks or more
    assert recurring["unexpected"] == 0
    assert recurring["executions"] < recurring["submitted"]  # one a second at most, packed


def test_flow_keeps_a_burst_within_its_rate_and_parallelism_at_the_receiver(capsys):
    """100 tasks due in one second at a flow of 10 a second and 10 in flight: all arrive
    once, none early, never more than the limits, drained about as fast as the rate lets;
    then the same 100 with no flow, whose CPU a task the flow's is set against."""
    assert main(["bench", "--scenarios", "flow", "--scale", "0.02", "--json"]) == 0
    flow = last_json(capsys.readouterr().out)["flow"]
    assert flow["flow"] == {"key": "bench-receiver", "rate": 10, "parallelism": 10}
    assert (flow["fired"], flow["duplicates"], flow["early"], flow["lost"]) == (100, 0, 0, 0)
    assert flow["max_per_second"] <= 10 and flow["max_in_flight"] <= 10
    assert flow["ideal_drain_s"] == 10.0 and flow["drain_s"] >= 0.9 * flow["ideal_drain_s"]
    assert 0 < flow["held_ms"]["p50"] <= flow["held_ms"]["max"]
    plain = flow["plain"]  # the same tasks with no flow, on a runtime of their own
    assert plain["fired"] == 100 and plain["cpu_ms_per_task"] > 0
    assert flow["cpu_vs_plain"] == round(flow["cpu_ms_per_task"] / plain["cpu_ms_per_task"], 2)


def test_retried_prices_an_attempt_more_within_the_invocation_and_through_the_index(capsys):
    """Five tasks each way, the receiver refusing each task's first attempt but in the
    answered run: every task delivered once, and the attempt more priced against the
    answered run. Within the invocation it costs the pause's milliseconds only; through
    the index, an execution and an invocation of its own and the writes that put it back."""
    assert main(["bench", "--scenarios", "retried", "--scale", "0.05", "--json", "--cost"]) == 0
    retried = last_json(capsys.readouterr().out)["retried"]
    assert retried["early"] == retried["duplicates"] == retried["lost"] == 0
    ways = retried["by_way"]
    assert [(f["fired"], f["refused"]) for f in ways.values()] == [(5, 0), (5, 5), (5, 5)]
    assert ways["through the index"]["executions"] == 2 * ways["answered"]["executions"]
    within, indexed = (
        retried["per_attempt"]["in the invocation"],
        retried["per_attempt"]["through the index"],
    )
    assert within["lambda_invocations"] == within["state_transitions"] == 0
    assert within["lambda_gb_seconds"] > 0  # the pause, billed
    assert indexed["lambda_invocations"] == 1 and indexed["state_transitions"] >= 2
    assert indexed["dynamodb_write_units"] >= 1  # RETRYING, back in the dispatch index
    # Within, the pause is billed by the wall clock, so a busy machine prices it higher: a
    # CI run beside the other test passes measured 60.43 against 6.46, 9.4x, not 10.
    assert indexed["usd_per_million"] > 3 * within["usd_per_million"] > 0


def test_bench_refuses_costs_it_cannot_meter(capsys):
    """Write units are metered by the moto tables only: --cost on DynamoDB Local is refused
    before anything runs."""
    code = main(["bench", "--scenarios", "spread", "--cost", "--tables", "dynamodb-local"])
    assert code == 2 and "--cost" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--billing", "provisioned"], "--cost"),
        (["--cost", "--utilization", "50"], "--billing provisioned"),
        (["--cost", "--billing", "provisioned", "--utilization", "95"], "20 to 90"),
    ],
)
def test_bench_refuses_a_pricing_it_cannot_state(capsys, arguments, named):
    """A utilization belongs to provisioned capacity, within what auto scaling targets, and
    a billing mode to a priced run: anything else is refused before anything runs."""
    assert main(["bench", "--scenarios", "spread", *arguments]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.skipif(writable_cgroups() is not None, reason=f"no sandbox here: {writable_cgroups()}")
def test_lambda_fires_every_task_once_from_sandboxes_and_reports_each_size(capsys, monkeypatch):
    """The scenario's shape at the template's size only (the others are the same code):
    both types, the large bodies, one executor's share alone, every task fired once and
    never early, from sandboxes whose measured share the quota caps."""
    monkeypatch.setattr(lambda_bench, "SIZES_MB", (256,))
    assert main(["bench", "--scenarios", "lambda", "--scale", "0.01", "--json"]) == 0
    figures = last_json(capsys.readouterr().out)["lambda"]
    alone = figures["one_invocation"]  # an executor's share of a split burst, alone
    assert set(alone) == {"webhook", "sqs"}
    assert (
        figures["tasks"]
        == figures["fired"]
        == 3 * figures["per_run"] + sum(run["tasks"] for run in alone.values())
    )
    assert figures["early"] == figures["duplicates"] == figures["lost"] == 0
    assert figures["memory_mb"] == 256 and 0 < figures["calibrated_share"] <= 0.145 * SLACK
    assert set(figures["by_memory"]) == {"256"}
    assert set(figures["by_memory"]["256"]) == {"webhook", "sqs"}
    assert figures["bodies_peak_rss_mb"] > 0
    # What the executors did after their gates, at the template's size, by type: the CPU
    # their sandboxes' cgroups counted a send, the invocations, the throttling.
    assert all(figures["post_gate_cpu_us"][t] > 0 for t in ("webhook", "sqs"))
    assert all(figures["executions"][t] >= 1 for t in ("webhook", "sqs"))
    assert all(figures["throttling"][t]["nr_throttled"] >= 0 for t in ("webhook", "sqs"))
    assert figures["moto_ms"]["p99"] >= 0  # moto's own time, apart from the lateness
    # Its lateness is the figure it measures (a cold start at a seventh of a core took 4 s
    # here on a busy machine): reported, not bounded, as every bench figure.
    assert figures["lateness_ms"]["p99"] >= 0


def test_a_template_parameter_given_to_the_bench_reaches_every_runtime_over_the_scenarios(
    capsys,
):
    """`--parameter NAME=VALUE` (a sweep of BurstSendsPerInvocation, say) holds for every
    runtime of the run, over what a scenario sets; a name the template does not declare,
    or a number outside its bounds, is refused naming the option."""
    assert main(["bench", "--scenarios", "sparse", "--parameter", "Burst=30"]) == 2
    assert "error: --parameter: 'Burst=30': give NAME=VALUE" in capsys.readouterr().err
    assert main(["bench", "--scenarios", "sparse", "--parameter", "BurstSendsPerInvocation=0"]) == 2
    assert "BurstSendsPerInvocation=0: a whole number from 1 to 800" in capsys.readouterr().err
    for pair, why in [
        ("TableWarmWritesPerSecond=many", "a whole number from 0 up"),  # no MaxValue
        ("LogLevel=LOUD", "one of DEBUG, INFO, WARNING, ERROR"),
    ]:
        assert main(["bench", "--scenarios", "sparse", "--parameter", pair]) == 2
        assert f"error: --parameter: {pair}: {why}" in capsys.readouterr().err
    given = scenario.Bench(None, None, parameters={"BurstSendsPerInvocation": "30"})  # type: ignore[arg-type]
    runtime = given.runtime({"BurstSendsPerInvocation": "15", "LeadMilliseconds": "900"})
    assert runtime.parameters["BurstSendsPerInvocation"] == "30"
    assert runtime.parameters["LeadMilliseconds"] == "900"
