"""Every chaos scenario, on small batches, as a regression test: nothing duplicated, early,
lost or missing from the dead-letter queue. (`tocsin chaos` runs them at full size.)"""

import pytest

from tests.conftest import last_json
from tocsin.cli import main
from tocsin.local.chaos import HOLES, SCENARIOS, run_scenario

ZERO = dict.fromkeys(HOLES, 0)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_loses_duplicates_and_hurries_nothing(name):
    result = run_scenario(name, tasks=15, seed=3)
    assert {k: result[k] for k in ZERO} == ZERO, result
    assert result["fired"] + result["failed_to_dlq"] + result["cancelled"] == result["tasks"] > 0


def test_cancels_and_reschedules_race_the_claim_and_both_sides_win_sometimes():
    result = run_scenario("cancel-reschedule", tasks=16, seed=3)
    assert result["cancelled_never_fired"] > 0
    assert result["refused_409_fired_once"] > 0
    assert {k: result[k] for k in ZERO} == ZERO, result


def test_faults_that_cannot_pass_end_in_the_dead_letter_queue():
    result = run_scenario("executor-faults", tasks=20, seed=5)
    assert result["failed_to_dlq"] == 2 and result["dlq_missing"] == 0


def test_chaos_command_prints_one_json_object_last(capsys):
    code = main(["chaos", "--scenarios", "racing-finders", "--tasks", "6", "--json"])
    result = last_json(capsys.readouterr().out)
    assert code == 0 and set(result) == {"racing-finders"}
    assert {k: result["racing-finders"][k] for k in ZERO} == ZERO


def test_chaos_command_names_unknown_scenarios(capsys):
    assert main(["chaos", "--scenarios", "meteor"]) == 2
    assert "racing-finders" in capsys.readouterr().err


def test_chaos_command_refuses_too_few_tasks(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["chaos", "--tasks", "0"])
    assert refused.value.code == 2 and "--tasks" in capsys.readouterr().err


def test_the_aws_faults_moto_does_not_show_really_happened():
    ambiguous = run_scenario("ambiguous-writes", tasks=12, seed=4)
    assert ambiguous["committed_then_500"] > 0
    timeouts = run_scenario("executor-timeouts", tasks=9, seed=4)
    assert timeouts["timed_out_invocations"] > 0
    for result in (ambiguous, timeouts):
        assert {k: result[k] for k in ZERO} == ZERO, result
        assert result["fired"] == result["tasks"]
