"""Logs, stored errors and dead letters carry task ids and outcomes, never payloads,
targets' secrets or the signing key.

The handlers run in a child process, so their log lines reach its stdout untouched.
"""

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.slow  # each case starts a runtime in a process of its own

PAYLOAD_MARK = "card-4111-1111-1111-1111"
HEADER_MARK = "Bearer-token-do-not-log"
SCRIPT = """
import json, os, sys
import boto3
from tests.conftest import dead_letters, wait_for_status, webhook_task
from tocsin import clock
from tocsin.measure.receiver import WebhookReceiver, allowing
from tocsin.local.runtime import EmbeddedRuntime
from tocsin.local.server import api_event
from tocsin.settings import settings

level, payload_mark, header_mark = sys.argv[1:4]
with (
    WebhookReceiver() as receiver,
    EmbeddedRuntime({"LogLevel": level, **allowing(receiver.url)}, None) as runtime,
):
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "false"  # print them (EMF) like on AWS
    runtime.run_finder()
    task = webhook_task(receiver.url, clock.now_ms() + 1500, "logged", {"card": payload_mark})
    task["target"]["headers"] = {"Authorization": header_mark}
    reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", json.dumps(task)))
    assert reply["statusCode"] == 201, reply
    wait_for_status("logged", {"SUCCEEDED"})
    for paced in ("paced-1", "paced-2"):  # the second held a second by their flow
        held = dict(task, id=paced, flow={"key": "one-host", "rate": 1})
        reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", json.dumps(held)))
        assert reply["statusCode"] == 201, reply
    for paced in ("paced-1", "paced-2"):
        wait_for_status(paced, {"SUCCEEDED"})
    refused = dict(task, id="refused", type="pigeon")
    reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", json.dumps(refused)))
    assert reply["statusCode"] == 400, reply
    receiver.status_for["/refuse"] = 403
    failing = dict(task, id="failing", max_attempts=1)
    failing["target"] = {"url": receiver.url + "/refuse", "headers": {"Authorization": header_mark}}
    reply = runtime.invoke("ApiFunction", api_event("POST", "/tasks", json.dumps(failing)))
    assert reply["statusCode"] == 201, reply
    print("STORED_ERROR=" + wait_for_status("failing", {"FAILED"})["error"], file=sys.stderr)
    print("DEAD_LETTERS=" + json.dumps(dead_letters(runtime)), file=sys.stderr)
    secret = boto3.client("secretsmanager").get_secret_value(
        SecretId=settings().webhook_secret_arn
    )["SecretString"]
    print("SECRET=" + secret, file=sys.stderr)
"""


def json_objects(output: str) -> Iterator[dict]:
    """Each JSON object printed, also two on one line: the runtime runs many invocations in
    one process, and Powertools prints a metrics blob and its newline as two writes, between
    which another invocation's log line can land (on Lambda each has its own stream)."""
    decoder = json.JSONDecoder()
    for line in output.splitlines():
        at = 0
        while line.startswith("{", at):
            entry, at = decoder.raw_decode(line, at)
            yield entry


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_fired_and_failed_tasks_record_ids_but_not_payloads_or_secrets(level):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, level, PAYLOAD_MARK, HEADER_MARK],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    secret = done.stderr.rsplit("SECRET=", 1)[1].strip()
    logs = list(json_objects(done.stdout))
    messages = {(entry.get("message"), entry.get("task_id")) for entry in logs}
    assert {("submitted", "logged"), ("fired", "logged")} <= messages
    assert ("refused", None) in messages
    metrics = [entry for entry in logs if "_aws" in entry]
    namespaces = {m["Namespace"] for e in metrics for m in e["_aws"]["CloudWatchMetrics"]}
    names = {
        d["Name"] for e in metrics for m in e["_aws"]["CloudWatchMetrics"] for d in m["Metrics"]
    }
    assert namespaces == {"Tocsin"} and {e["service"] for e in metrics} == {"tocsin"}
    assert {"Fired", "LatenessMs", "found", "started", "throttled", "backlog"} <= names
    flows = [e for e in metrics if "FlowKey" in e]  # one set a key, the key in its record
    assert {e["FlowKey"] for e in flows} == {"one-host"}
    sets = [m for e in metrics for m in e["_aws"]["CloudWatchMetrics"]]
    assert "FlowKey" not in {name for m in sets for names in m["Dimensions"] for name in names}
    held = [value for e in flows for value in e["FlowHeld"]]  # EMF lists a metric's values
    # held most of its flow's second: on a loaded machine a late invocation plans the two
    # from when it can send, and the first's own lateness is not the flow's (746 ms seen)
    assert sum(held) >= 1 and max(v for e in flows for v in e["FlowHeldMs"]) > 500
    failed = done.stderr.split("STORED_ERROR=", 1)[1]
    assert "403" in failed.split("DEAD_LETTERS=")[0]  # the failure and its letter are there
    assert '"task_id": "failing"' in failed.split("DEAD_LETTERS=")[1]
    everything = done.stdout + done.stderr.rsplit("SECRET=", 1)[0]
    assert PAYLOAD_MARK not in everything
    assert HEADER_MARK not in everything
    assert secret not in everything
