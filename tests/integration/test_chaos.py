"""Every chaos scenario, on small batches, as a regression test: nothing duplicated, early,
lost or missing from the dead-letter queue. (`tocsin chaos` runs them at full size.)"""

import json

import pytest

from tocsin.cli import main
from tocsin.local.chaos import SCENARIOS, run_scenario

ZERO = {"duplicates": 0, "early": 0, "lost": 0, "dlq_missing": 0}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_loses_duplicates_and_hurries_nothing(name):
    result = run_scenario(name, tasks=15, seed=3)
    assert {k: result[k] for k in ZERO} == ZERO, result
    assert result["fired"] + result["failed_to_dlq"] == result["tasks"] > 0


def test_faults_that_cannot_pass_end_in_the_dead_letter_queue():
    result = run_scenario("executor-faults", tasks=20, seed=5)
    assert result["failed_to_dlq"] == 2 and result["dlq_missing"] == 0


def test_chaos_command_prints_one_json_object_last(capsys):
    code = main(["chaos", "--scenarios", "racing-finders", "--tasks", "6", "--json"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 0 and set(result) == {"racing-finders"}
    assert {k: result["racing-finders"][k] for k in ZERO} == ZERO


def test_chaos_command_names_unknown_scenarios(capsys):
    assert main(["chaos", "--scenarios", "meteor"]) == 2
    assert "racing-finders" in capsys.readouterr().err


def test_chaos_command_refuses_too_few_tasks(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["chaos", "--tasks", "0"])
    assert refused.value.code == 2 and "--tasks" in capsys.readouterr().err
