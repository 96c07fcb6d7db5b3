"""A failing host held back (tocsin.holds): after HostHoldFailures failed sends in a row
across an owner's tasks, the host's other tasks wait, counting no attempt, while one task
probes it on its own policy; its first answer wakes them all, at HostRecoveryRate."""

import time

from tests.conftest import call_api, runtime_with, stored, table, wait_for_status, webhook_task
from tocsin import clock
from tocsin.holds import HOLD_PREFIX
from tocsin.measure import most_within
from tocsin.settings import settings

# The prober retries at 3 s, then 6 s (RETRYING between); the waiting tasks' own wake, at
# their longest backoff, is far off: only the hold's end can wake them in the test's time.
POLICY = {"min_backoff_s": 3, "max_backoff_s": 600}
RATE = 2  # HostRecoveryRate: sends a second once the host is back


def held_task(url: str, due_ms: int, task_id: str) -> dict:
    return webhook_task(url, due_ms, task_id) | {"retry": POLICY}


def test_a_failing_host_is_probed_by_one_task_while_the_others_wait_then_all_go_at_its_rate(
    receiver,
):
    with runtime_with({"HostRecoveryRate": str(RATE)}) as runtime:
        receiver.status_for["/down"] = 503
        url, first_due = f"{receiver.url}/down", clock.now_ms() + 2000
        first = [f"first-{i}" for i in range(5)]  # their failures begin the hold
        for task_id in first:
            assert call_api(runtime, "POST", "/tasks", held_task(url, first_due, task_id))[0] == 201
        later_due = first_due + 10_000  # claimed once the host is held
        later = [f"later-{i}" for i in range(8)]
        for task_id in later:
            assert call_api(runtime, "POST", "/tasks", held_task(url, later_due, task_id))[0] == 201
        for task_id in later:
            waiting = wait_for_status(task_id, {"RETRYING"}, timeout_s=20)
            assert waiting["held_on"].startswith(HOLD_PREFIX)
            assert int(waiting.get("attempts", 0)) == 0  # it waits, counting no attempt
        status, targets = call_api(runtime, "GET", "/targets")
        assert status == 200
        [held] = targets["held"]
        assert held["host"] == url.split("/")[2] and held["task_type"] == "webhook"
        assert held["failures"] >= 5 and "503" in held["last_error"] and held["waiting"] >= 8
        during = receiver.received()
        assert not [a for a in during if a.task_id.startswith("later-")]
        probes = [a for a in during if a.arrival_ms > first_due + 1000]
        assert len({a.task_id for a in probes}) <= 1  # one task probes the held host

        receiver.status_for["/down"] = 200  # the host is back: the probe's answer wakes them
        for task_id in first + later:
            wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)
        assert call_api(runtime, "GET", "/targets")[1]["held"] == []
        assert all(int(stored(t)["attempts"]) == 1 for t in later)  # its one send, once woken
    sent = [a for a in receiver.received() if a.status == 200]
    assert sorted(a.idempotency_key for a in sent) == sorted(f"{t}:1" for t in first + later)
    prober = min(sent, key=lambda a: a.arrival_ms)  # the probe that found the host back
    woken = sorted(a.arrival_ms for a in sent if a is not prober)
    assert most_within(woken, 1000) <= RATE + 1  # the recovery rate, a network jitter aside
    assert woken[-1] - woken[0] >= (len(woken) - 1) * 1000 / RATE * 0.9


def test_with_host_holds_off_no_hold_is_kept_and_no_task_waits(receiver):
    with runtime_with({"HostHoldFailures": "0"}) as runtime:
        receiver.script_for["/down"] = [503] * 6  # then 200
        due = clock.now_ms() + 2000
        tasks = [f"alone-{i}" for i in range(6)]
        for task_id in tasks:
            body = held_task(f"{receiver.url}/down", due, task_id)
            assert call_api(runtime, "POST", "/tasks", body)[0] == 201
        for task_id in tasks:
            assert int(wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=60)["attempts"]) == 2
        items = table(settings().tasks_table).scan()["Items"]
        assert not [item for item in items if item["task_id"].startswith(HOLD_PREFIX)]
        assert call_api(runtime, "GET", "/targets")[1]["held"] == []


def test_a_prober_that_runs_out_of_attempts_hands_the_probe_to_a_waiting_task_at_once(receiver):
    """Its last failure must not renew its probe: the waiting tasks' own wake is 600 s off,
    and a probe still in its name would keep them waiting PROBER_GRACE_MS (60 s)."""
    policy = {"max_attempts": 3, "min_backoff_s": 1, "max_backoff_s": 600}
    with runtime_with() as runtime:
        receiver.status_for["/down"] = 503
        url, due = f"{receiver.url}/down", clock.now_ms() + 2000
        tasks = [f"task-{i}" for i in range(6)]
        for task_id in tasks:
            body = webhook_task(url, due, task_id) | {"retry": policy}
            assert call_api(runtime, "POST", "/tasks", body)[0] == 201
        deadline, gave_up = time.monotonic() + 30, []
        while not gave_up and time.monotonic() < deadline:
            gave_up = [t for t in tasks if stored(t)["status"] == "FAILED"]
            time.sleep(0.05)
        [prober] = gave_up  # the first prober, out of its attempts (the next needs two, 3 s)
        receiver.status_for["/down"] = 200  # the next prober finds the host back
        for task_id in tasks:
            if task_id != prober:
                wait_for_status(task_id, {"SUCCEEDED"}, timeout_s=45)  # under the grace
