"""The Python client, the CLI and the README's examples against `tocsin serve`, over HTTP."""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.conftest import http_server, last_json, polling, wait_for_status, webhook_task
from tocsin import Client, clock
from tocsin.cli import main
from tocsin.client import Conflict, InvalidRequest, NotFound
from tocsin.local.server import serving

ROOT = Path(__file__).parents[2]


@pytest.fixture
def api_url(runtime) -> Iterator[str]:
    with serving(runtime) as url:
        yield url


@pytest.fixture
def polled(runtime) -> Iterator[None]:
    with polling(runtime):
        yield


QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/outcomes"


def test_client_covers_every_endpoint(api_url):
    alice = Client(api_url, principal="alice")
    task = alice.submit(
        type="sns",
        target={"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"},
        payload={"n": 1},
        delay=3600,
        max_attempts=2,
        on_failure={"type": "sqs", "target": {"queue_url": QUEUE_URL}},
    )
    assert task.status == "PENDING" and task.max_attempts == 2 and len(task.id) == 32
    assert task.on_failure.target["queue_url"] == QUEUE_URL and task.on_success is None
    assert alice.get(task.id) == task
    moved = alice.reschedule(task.id, delay=7200, payload={"n": 2})
    assert moved.version == 2 and moved.payload == {"n": 2} and moved.due_at > task.due_at
    others = [alice.submit(type="sns", target=task.target, delay=60 * i) for i in range(1, 4)]
    assert [t.id for t in alice.iter_tasks(limit=2)] == [t.id for t in others] + [task.id]
    assert alice.cancel(task.id).status == "CANCELLED"
    assert [t.id for t in alice.list(status="CANCELLED").tasks] == [task.id]


def test_client_raises_typed_errors_naming_the_field(api_url):
    alice, bob = Client(api_url, principal="alice"), Client(api_url, principal="bob")
    task = alice.submit(
        id="mine",
        type="sns",
        target={"topic_arn": "arn:aws:sns:us-east-1:123456789012:t"},
        delay=60,
    )
    with pytest.raises(NotFound):
        bob.get(task.id)
    with pytest.raises(Conflict) as conflict:
        alice.submit(id="mine", type="sns", target=task.target, delay=120)
    assert conflict.value.field == "id"
    with pytest.raises(InvalidRequest) as invalid:
        alice.submit(type="webhook", target={"url": "https://192.168.1.1/"}, delay=60)
    assert invalid.value.status == 400 and invalid.value.field == "target.url"


def test_a_task_submitted_by_the_client_fires_and_reports_how_late(runtime, api_url, receiver):
    alice = Client(api_url, principal="alice")
    due = clock.now_ms() + 2500
    body = webhook_task(receiver.url, due, "fired-by-client")
    alice.submit(**{k: v for k, v in body.items() if k != "due_at"}, due_at=body["due_at"])
    wait_for_status("fired-by-client", {"SUCCEEDED"})
    task = alice.get("fired-by-client")
    assert task.status == "SUCCEEDED" and task.attempts == 1
    assert task.fired_at >= task.due_at and task.lateness_ms >= 0
    assert [a.task_id for a in receiver.received()] == ["fired-by-client"]


def test_without_a_principal_requests_are_signed_with_sigv4(monkeypatch):
    """The deployed API needs SigV4 for execute-api; the client signs with boto3's credentials."""
    seen: list[dict[str, str]] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers.items()))
            body = json.dumps({"tasks": [], "next": None}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with http_server(Recorder) as url:
        Client(url, region="eu-west-1").list(status="PENDING")
    [headers] = seen
    assert re.match(
        r"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/\d{8}/eu-west-1/execute-api/aws4_request, "
        r"SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$",
        headers["Authorization"],
    )
    assert "X-Tocsin-Principal" not in headers


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_commands_print_for_people_and_for_scripts(api_url, capsys):
    common = ["--url", api_url, "--principal", "alice"]
    target = json.dumps({"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"})
    code, out, _ = run_cli(
        capsys, "submit", *common, "--type", "sns", "--target", target, "--at", "+2h",
        "--id", "cli-1", "--payload", '{"n": 1}', "--json",
        "--on-success", json.dumps({"type": "sns", "target": json.loads(target)}),
    )  # fmt: skip
    task = last_json(out)
    assert code == 0 and task["id"] == "cli-1" and task["status"] == "PENDING"
    assert task["on_success"]["target"]["topic_arn"] == json.loads(target)["topic_arn"]

    code, out, _ = run_cli(capsys, "get", "cli-1", *common)
    assert code == 0 and "cli-1" in out and "PENDING" in out
    code, out, _ = run_cli(capsys, "reschedule", "cli-1", *common, "--at", "+90m", "--json")
    assert code == 0 and json.loads(out)["version"] == 2
    code, out, _ = run_cli(capsys, "list", *common)
    assert code == 0 and "cli-1" in out
    code, out, _ = run_cli(capsys, "cancel", "cli-1", *common, "--json")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"

    code, _, err = run_cli(capsys, "cancel", "cli-1", *common)
    assert code == 1 and "409" in err and "CANCELLED" in err
    code, _, err = run_cli(capsys, "get", "cli-1", "--url", api_url, "--principal", "bob")
    assert code == 1 and "404" in err
    code, _, err = run_cli(
        capsys, "submit", *common, "--type", "sns", "--target", "{}", "--at", "+1m"
    )
    assert code == 1 and "field: target.topic_arn" in err


def test_client_and_cli_show_a_held_host_to_its_owner_alone(api_url, receiver, capsys):
    receiver.status_for["/down"] = 503
    alice = Client(api_url, principal="alice")
    for _ in range(5):  # HostHoldFailures: five failed sends in a row hold the host
        alice.submit(
            type="webhook", target={"url": f"{receiver.url}/down"}, delay=1,
            retry={"min_backoff_s": 30, "max_backoff_s": 600},
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while not alice.targets().held and time.monotonic() < deadline:
        time.sleep(0.2)
    [held] = alice.targets().held
    host = receiver.url.split("/")[2]
    assert held.host == host and held.failures >= 5 and "503" in (held.last_error or "")
    assert Client(api_url, principal="bob").targets().held == []  # holds are per owner
    code, out, _ = run_cli(capsys, "targets", "--url", api_url, "--principal", "alice")
    assert code == 0 and host in out and "503" in out
    code, out, _ = run_cli(capsys, "targets", "--url", api_url, "--principal", "bob", "--json")
    assert code == 0 and json.loads(out) == {"held": []}


def test_cli_refuses_a_time_without_a_zone():
    with pytest.raises(SystemExit) as refused:
        main(["submit", "--type", "sns", "--target", "{}", "--at", "2027-01-01T10:00:00"])
    assert refused.value.code == 2


def readme_example(language: str) -> str:
    """The README block that follows `<!-- example:<language> -->`."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- example:{language} -->\s*```\w+\n(.*?)```", text, re.S)
    assert match, f"README has no {language} example"
    # `.venv/bin/tocsin` as the README says, but this test run's own (each Python's venv)
    return match[1].replace(".venv/bin/", f"{Path(sys.executable).parent}/")


def test_readme_curl_example_runs(runtime, api_url):
    env = {**os.environ, "TOCSIN_URL": api_url}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_example("curl")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [r.get("status") for r in replies[:2]] == ["PENDING", "PENDING"]
    assert replies[-1]["status"] == "CANCELLED" and replies[-1]["version"] == 2


def test_readme_python_example_runs(runtime, api_url):
    env = {**os.environ, "TOCSIN_URL": api_url}
    done = subprocess.run(
        [sys.executable, "-c", readme_example("python")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "CANCELLED" in done.stdout


def test_readme_schedule_example_runs(runtime, api_url):
    env = {**os.environ, "TOCSIN_URL": api_url, "TOCSIN_PRINCIPAL": "alice"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_example("schedule")],
        env=env, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # 09:00 in Berlin: 08:00Z in winter, 07:00Z in summer
    assert len(re.findall(r"T0[78]:00:00\.000\+00:00", done.stdout)) == 3


def test_client_and_cli_cover_every_schedule_endpoint(api_url, capsys):
    alice = Client(api_url, principal="alice")
    topic = {"topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts"}
    daily = alice.create_schedule(
        id="daily",
        expression="cron(0 9 ? * MON-FRI *)",
        timezone="Europe/Berlin",
        type="sns",
        target=topic,
        payload={"report": 1},
    )
    assert daily.state == "ENABLED" and daily.next_due_at is not None
    assert alice.get_schedule("daily") == daily.model_copy(update={"last_fired_at": None})
    upcoming = alice.upcoming("daily", 3)
    assert upcoming[0] == daily.next_due_at and len(upcoming) == 3
    berlin = [moment.astimezone(ZoneInfo("Europe/Berlin")) for moment in upcoming]
    assert all(moment.weekday() < 5 and moment.hour == 9 for moment in berlin)
    assert alice.pause_schedule("daily").state == "PAUSED"
    resumed = alice.resume_schedule("daily")
    assert resumed.state == "ENABLED" and resumed.revision == 3
    moved = alice.update_schedule("daily", expression="cron(30 9 ? * MON-FRI *)")
    assert moved.next_due_at is not None and moved.next_due_at.minute == 30
    assert [s.id for s in alice.list_schedules().schedules] == ["daily"]
    assert alice.list(schedule="daily").tasks == []  # far ahead: no occurrence is a task yet
    with pytest.raises(InvalidRequest) as refused:
        alice.create_schedule(expression="rate(0 minutes)", type="sns", target=topic)
    assert refused.value.field == "expression"
    with pytest.raises(NotFound):
        Client(api_url, principal="bob").get_schedule("daily")
    assert alice.delete_schedule("daily").id == "daily"
    with pytest.raises(NotFound):
        alice.get_schedule("daily")

    common = ["--url", api_url, "--principal", "alice"]
    code, out, _ = run_cli(
        capsys, "schedule", "create", *common, "--id", "cli-s", "--expression",
        "rate(1 hour)", "--type", "sns", "--target", json.dumps(topic), "--json",
    )  # fmt: skip
    assert code == 0 and last_json(out)["state"] == "ENABLED"
    code, out, _ = run_cli(capsys, "schedule", "upcoming", "cli-s", *common, "--count", "2")
    first, second = (datetime.fromisoformat(line) for line in out.split())
    assert code == 0 and second - first == timedelta(hours=1)
    code, out, _ = run_cli(capsys, "schedule", "pause", "cli-s", *common, "--json")
    assert code == 0 and json.loads(out)["state"] == "PAUSED"
    code, out, _ = run_cli(capsys, "schedule", "list", *common)
    assert code == 0 and "cli-s" in out and "PAUSED" in out
    code, out, _ = run_cli(
        capsys, "schedule", "update", "cli-s", *common, "--timezone", "Asia/Tokyo"
    )
    assert code == 0 and "Asia/Tokyo" in out
    code, _, err = run_cli(
        capsys, "schedule", "update", "cli-s", *common, "--expression", "cron(0 9 * * ?)"
    )
    assert code == 1 and "field: expression" in err and "needs 6" in err
    code, out, _ = run_cli(capsys, "schedule", "delete", "cli-s", *common)
    assert code == 0
    code, _, err = run_cli(capsys, "schedule", "get", "cli-s", *common)
    assert code == 1 and "404" in err


ARN = "arn:aws:sns:us-east-1:123456789012:alerts"


@pytest.mark.usefixtures("polled")
def test_the_cli_asks_before_a_bulk_cancel_of_more_than_a_handful(api_url, capsys, monkeypatch):
    alice = Client(api_url, principal="alice")
    for _ in range(7):
        alice.submit(type="sns", target={"topic_arn": ARN}, delay=3600, tags={"user": "42"})
    alice.submit(type="sns", target={"topic_arn": ARN}, delay=3600, id="kept", tags={"user": "7"})
    common = ["--url", api_url, "--principal", "alice", "--tags", '{"user": "42"}']
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    code, _, err = run_cli(capsys, "bulk", "cancel", *common)
    assert code == 1 and "nothing cancelled" in err
    assert [t.status for t in alice.list(tags={"user": "42"}).tasks] == ["PENDING"] * 7
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "y")
    code, out, _ = run_cli(capsys, "bulk", "cancel", *common, "--json")
    job = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and asked == ["Cancel 7 tasks and the schedules carrying its tags? [y/N] "]
    assert job["state"] == "DONE" and job["done"] == 7
    assert alice.get("kept").status == "PENDING"
    assert Client(api_url, principal="alice").bulk_progress(job["bulk_id"]).done == 7
