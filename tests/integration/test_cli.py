"""The two commands a user runs first, `tocsin demo` and `tocsin invoke`; and the measures
leave nothing running when they end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MANY_P99_LATE_MS, last_json
from tests.integration.test_leftovers import MARK, all_gone, marked_environment
from tocsin.cli import main
from tocsin.local.dynamodb_local import jar

pytestmark = [pytest.mark.slow, pytest.mark.tool]  # each starts a runtime in a process

ROOT = Path(__file__).parents[2]


def tocsin(*args: str, environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tocsin.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=environment,
    )


def test_demo_fires_every_task_once_and_never_early():
    mark, environment = marked_environment()
    args = ("demo", "--tasks", "30", "--spread", "25", "--json", "--seed", "7")
    run = tocsin(*args, environment=environment)
    assert run.returncode == 0, run.stderr[-2000:]
    assert all_gone(mark) == []  # the DynamoDB process and the receiver ended with it
    summary = last_json(run.stdout)
    assert summary["submitted"] == summary["fired"] == 30
    assert summary["duplicates"] == summary["early"] == summary["lost"] == 0
    assert summary["via_finder"] > 0  # some went by the finder, some at submit
    assert set(summary["lateness_ms"]) == {"p50", "p90", "p99", "max"}
    assert 0 <= summary["lateness_ms"]["p99"] <= MANY_P99_LATE_MS
    assert "in the console while the demo runs: http://127.0.0.1:" in run.stderr


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_look_ahead_within_two_finder_intervals_is_refused(command, capsys):
    with pytest.raises(SystemExit) as refused:
        main([command, "--lookahead", "10", "--finder-interval", "5"])
    assert refused.value.code == 2 and "--lookahead" in capsys.readouterr().err


def test_serve_refuses_a_template_parameter_its_declaration_does_not_allow(capsys):
    assert main(["serve", "--port", "0", "--parameter", "HostFlowRate=5000"]) == 2
    error = capsys.readouterr().err
    assert "--parameter: HostFlowRate=5000: a whole number from 0 to 1000" in error


def test_console_says_which_option_failed_when_it_cannot_reach_a_stack():
    without = {"AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    without |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | without
    run = subprocess.run(
        [sys.executable, "-m", "tocsin.cli", "console", "--stack", "tocsin"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=environment, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.startswith("error: --stack: ")
    assert "credentials" in run.stderr


def test_invoke_runs_a_template_function_on_a_sample_event():
    run = tocsin("invoke", "FinderFunction", "--event", "events/finder_scheduled.json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["found"] == 0


def test_invoke_names_the_functions_when_one_is_unknown():
    run = tocsin("invoke", "NoSuchFunction", "--event", "events/finder_scheduled.json")
    assert run.returncode == 2
    assert "FinderFunction" in run.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "--scenarios", "sparse", "--scale", "0.05"],
        ["chaos", "--scenarios", "duplicate-submissions", "--tasks", "5"],
    ],
    ids=["bench", "chaos"],
)
def test_a_measure_leaves_nothing_running_when_it_ends(command):
    mark, environment = marked_environment()
    tables = ["--tables", "dynamodb-local"] if jar() and command[0] == "bench" else []
    run = tocsin(*command, *tables, environment=environment)
    assert run.returncode == 0, run.stderr[-2000:]
    assert MARK in environment and all_gone(mark) == []
