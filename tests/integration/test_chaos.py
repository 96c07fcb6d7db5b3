"""Every chaos scenario, on small batches, as a regression test: nothing duplicated, early,
lost or missing from the dead-letter queue. (`tocsin chaos` runs them at full size.)

Each scenario runs once per test process, at the size and seed its tests need: the tests
that ask more of a scenario than its holes judge its same run (an xdist group keeps them
on one process)."""

import functools
import time
from typing import Any

import pytest

from tests.conftest import last_json
from tocsin.cli import main
from tocsin.local import sandbox
from tocsin.measure import chaos
from tocsin.measure.chaos import HOLES, SCENARIOS, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.tool]  # each waits for its tasks' due times

ZERO = dict.fromkeys(HOLES, 0)
RUNS = dict.fromkeys(SCENARIOS, (15, 3)) | {  # tasks and seed
    "cancel-reschedule": (16, 3),
    "executor-faults": (20, 5),
    "ambiguous-writes": (12, 4),
    "executor-timeouts": (9, 4),
}
# The faults each scenario must have met, by kind: a run that met none proves nothing.
FAULTS = {
    "finder-crash": {"finder_crashes"},
    "racing-finders": {"finders_in_step", "tasks_raced"},
    "throttled-starts": {"throttled_starts"},
    "dynamodb-faults": {"throttled_writes", "writes_answered_500"},
    "ambiguous-writes": {"committed_then_500"},
    "executor-timeouts": {"timed_out_invocations"},
    "unmarked-sends": {"final_marks_refused", "sends_logged"},
    "executor-faults": {"invocations_failed"},
    "webhook-faults": {"receiver_faults"},
    "restart": {"tasks_unfinished_at_stop"},
    "flow-limits": {"receiver_faults", "slow_answers"},
    "outage": {"outage_answers"},
}
# Where the count is known: every crash planned, each racing finder (two, then five) and
# every task of both races started by the race itself.
EXACTLY = {
    "finder-crash": {"finder_crashes": chaos.FINDER_CRASHES},
    "racing-finders": {"finders_in_step": 2 + 5, "tasks_raced": RUNS["racing-finders"][0] // 2 * 2},
}
AWS_FAULTS = "chaos-aws-faults"  # the two runs one test judges together
GROUPS = {"ambiguous-writes": AWS_FAULTS, "executor-timeouts": AWS_FAULTS}


@functools.cache
def result_of(name: str) -> dict[str, Any]:
    tasks, seed = RUNS[name]
    return run_scenario(name, tasks=tasks, seed=seed)


def group(name: str) -> pytest.MarkDecorator:
    return pytest.mark.xdist_group(GROUPS.get(name, f"chaos-{name}"))


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=group(n)) for n in sorted(set(SCENARIOS) - chaos.SANDBOXED)]
)
def test_scenario_loses_duplicates_and_hurries_nothing(name):
    result = result_of(name)
    assert {k: result[k] for k in ZERO} == ZERO, result
    assert result["fired"] + result["failed_to_dlq"] + result["cancelled"] == result["tasks"] > 0
    met = result["faults_met"]
    assert set(met) == FAULTS.get(name, set()) and all(n > 0 for n in met.values()), met
    assert met.items() >= EXACTLY.get(name, {}).items(), met


@group("flow-limits")
def test_a_flow_at_a_slow_failing_receiver_keeps_both_its_limits_where_its_sends_arrive():
    """Its parallelism binds (3 in flight, each answered after 0.5 s), retries go through it as
    well, and no second holds more than the rate."""
    result = result_of("flow-limits")
    flow = result["flow"]
    assert flow["most_parallelism"] == flow["parallelism"] == 3
    assert 0 < flow["most_rate"] <= flow["rate"]
    assert result["faults_met"]["receiver_faults"] == 2 * len(range(0, RUNS["flow-limits"][0], 5))


@group("cancel-reschedule")
def test_cancels_and_reschedules_race_the_claim_and_both_sides_win_sometimes():
    result = result_of("cancel-reschedule")
    assert result["cancelled_never_fired"] > 0
    assert result["refused_409_fired_once"] > 0
    assert result["rescheduled_fired_once_as_version_2"] == result["rescheduled"] > 0
    assert result["unexpected_answers"] == 0
    assert {k: result[k] for k in ZERO} == ZERO, result


@group("duplicate-submissions")
def test_concurrent_duplicate_submissions_create_each_task_once_and_answer_each_client():
    result = result_of("duplicate-submissions")
    ids = RUNS["duplicate-submissions"][0] // chaos.DUPLICATE_CLIENTS
    as_stored = ids * (chaos.DUPLICATE_CLIENTS - 1)
    assert result["submissions"] == {"created": ids, "as_stored": as_stored}


@group("outage")
def test_a_receivers_outage_fails_no_task_and_each_arrives_once_after_it():
    """The host answers 503 for 15 s from before the first of its tasks is due: it is held
    back, one task probes it while the others wait, and once it answers all arrive, once
    each, at the recovery rate; none fails. Tried on their own backoffs, 15 tasks made some
    75 attempts in such an outage; held back, each is tried about once, and a prober more."""
    result = result_of("outage")
    tasks = RUNS["outage"][0]
    assert result["fired"] == tasks and result["failed_to_dlq"] == 0
    outage = result["outage"]
    assert outage["attempts_during"] < 2 * tasks and outage["tried_more_than_once"] <= 3
    assert outage["most_attempts_of_one_task"] > 2  # the prober's
    # as written by the executors: the receiver, a thread of the runtime's busy process,
    # stamps some late, which bunches them
    assert outage["most_written_in_any_second_after"] <= outage["recovery_rate"]


@group("executor-faults")
def test_faults_that_cannot_pass_end_in_the_dead_letter_queue():
    result = result_of("executor-faults")
    assert result["failed_to_dlq"] == 2 and result["dlq_missing"] == 0


def test_a_failure_the_scenario_did_not_plan_is_counted_and_reported_with_its_error(
    monkeypatch,
):
    """The judge names each unplanned failure and its stored error, so a run that fails
    one can be read afterwards. Here the failures of the path that answers 500 for good
    are made unplanned."""
    planned = SCENARIOS["webhook-faults"]

    def planning_nothing(trial, tasks):
        planned(trial, tasks)
        trial.may_fail.clear()

    monkeypatch.setitem(chaos.SCENARIOS, "webhook-faults", planning_nothing)
    result = run_scenario("webhook-faults", tasks=5, seed=3)
    unplanned = result["unplanned_failures"]
    assert result["unexpected_failures"] == len(unplanned) == result["failed_to_dlq"] == 1
    assert all("500" in error for error in unplanned.values()), unplanned


def test_a_send_again_after_an_answer_past_the_senders_limit_is_counted_apart(monkeypatch):
    """A receiver that writes its 200 later than the webhook timeout (5 s here) leaves its
    sender nothing to go on: it sends again, with the same key, by design. The judge counts
    that repeat apart from duplicates (a busy machine's receiver, a thread of the runtime's
    process, once answered 6.2 s late so)."""

    def answering_late(trial, tasks):
        slow = set(trial.store(tasks, "slow"))

        def hold(arrival):
            if arrival.task_id in slow:
                slow.discard(arrival.task_id)
                time.sleep(6)

        trial.receiver.on_arrival = hold
        trial.finder_until_done()

    monkeypatch.setitem(chaos.SCENARIOS, "webhook-faults", answering_late)
    result = run_scenario("webhook-faults", tasks=2, seed=3)
    assert (result["fired"], result["duplicates"], result["lost"]) == (2, 0, 0)
    assert result["delivered_again_after_a_late_answer"] == 2


def test_chaos_command_prints_one_json_object_last(capsys):
    code = main(["chaos", "--scenarios", "racing-finders", "--tasks", "6", "--json"])
    result = last_json(capsys.readouterr().out)
    assert code == 0 and set(result) == {"racing-finders"}
    assert {k: result["racing-finders"][k] for k in ZERO} == ZERO
    assert result["racing-finders"]["faults_met"]["tasks_raced"] == 6


def cgroups_refused() -> str:
    """Why this machine cannot run sandboxes ("" if it can)."""
    try:
        sandbox.cgroup_bases()
    except sandbox.LimitsUnavailable as refused:
        return str(refused)
    return ""


@pytest.mark.xdist_group("chaos-lambda-kills")
@pytest.mark.skipif(bool(cgroups_refused()), reason=f"no sandbox here: {cgroups_refused()}")
def test_sandboxes_killed_mid_send_lose_nothing_and_deliver_again_only_what_they_had_sent():
    """Sandboxes frozen to their timeout and out of memory while they send, and final
    marks that hang: nothing lost, early or doubled but where a dead invocation may have
    sent, and the tasks it left RUNNING requeued once their leases are over."""
    result = run_scenario("lambda-kills", tasks=15, seed=3, lambda_limits=True)
    assert {k: result[k] for k in ZERO} == ZERO, result
    assert result["fired"] == result["tasks"] == 15
    met = result["faults_met"]
    assert set(met) == {"frozen_until_its_timeout", "out_of_memory", "final_marks_hung"}, met
    assert all(n > 0 for n in met.values()), met


@pytest.mark.xdist_group("chaos-unmarked-sandboxed")
@pytest.mark.skipif(bool(cgroups_refused()), reason=f"no sandbox here: {cgroups_refused()}")
def test_final_marks_refused_to_sandboxed_executors_are_logged_and_never_sent_twice():
    """The refusals come from the DynamoDB process, so executors in sandboxes of their own
    meet them as the in-process ones do."""
    result = run_scenario("unmarked-sends", tasks=15, seed=3, lambda_limits=True)
    assert {k: result[k] for k in ZERO} == ZERO, result
    assert result["fired"] == result["tasks"] == 15
    met = result["faults_met"]
    assert met["final_marks_refused"] > 0 and met["sends_logged"] > 0, met


def test_a_scenario_that_kills_sandboxes_is_refused_without_them(capsys):
    assert main(["chaos", "--scenarios", "lambda-kills", "--tasks", "6"]) == 2
    assert "--lambda-limits" in capsys.readouterr().err


def test_chaos_command_names_unknown_scenarios(capsys):
    assert main(["chaos", "--scenarios", "meteor"]) == 2
    assert "racing-finders" in capsys.readouterr().err


def test_chaos_command_refuses_too_few_tasks(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["chaos", "--tasks", "0"])
    assert refused.value.code == 2 and "--tasks" in capsys.readouterr().err


@group("unmarked-sends")
def test_sends_the_table_would_not_mark_are_logged_and_never_sent_twice():
    result = result_of("unmarked-sends")
    assert result["faults_met"]["sends_logged"] > 0  # marks were refused after their sends
    assert result["fired"] == result["tasks"] and result["duplicates"] == 0


@group("ambiguous-writes")
def test_the_aws_faults_moto_does_not_show_really_happened():
    ambiguous = result_of("ambiguous-writes")
    assert ambiguous["faults_met"]["committed_then_500"] > 0
    timeouts = result_of("executor-timeouts")
    assert timeouts["faults_met"]["timed_out_invocations"] > 0
    for result in (ambiguous, timeouts):
        assert {k: result[k] for k in ZERO} == ZERO, result
        assert result["fired"] == result["tasks"]
