"""The Lambda-sized sandbox (`--lambda-limits`): executor invocations in processes of their
own, held to a CPU share of MemorySize / 1,769 of a core, killed past their memory size
and at their Timeout, as Lambda does, answering what Step Functions would see; the real
executors fire through it; nothing of it is left after the stop; where cgroups cannot be
written it refuses, saying why."""

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import boto3
import pytest

from tests.conftest import runtime_with, store_task, wait_for_status, webhook_task
from tocsin import clock
from tocsin.cli import main
from tocsin.local import sandbox, tls
from tocsin.measure.receiver import WebhookReceiver


def writable_cgroups() -> str | None:
    """Why this machine cannot run the sandbox, or None."""
    try:
        sandbox.cgroup_bases()
    except sandbox.LimitsUnavailable as refused:
        return str(refused)
    return None


pytestmark = [
    pytest.mark.skipif(
        writable_cgroups() is not None, reason=f"no sandbox here: {writable_cgroups()}"
    ),
    # a developer's tool (`--lambda-limits`), on the developer's Python: the handlers it runs
    # are run on the functions' Python by every other test
    pytest.mark.any_python,
]

SHARE_256_MB = 256 / sandbox.MB_PER_CORE
# A quota caps the share: the machine's other work can only lower what a busy loop gets.
# Without one, a loop alone gets a whole core, and about half of one on a loaded two cores.
SLACK = 1.15


def ours() -> list[Path]:
    """The cgroups of this process's sandboxes."""
    bases = sandbox.cgroup_bases()
    return [g for base in bases.values() for g in base.glob(f"{sandbox.PREFIX}-{os.getpid()}-*")]


def spec(tmp_path: Path, body: str, timeout_s: float = 5, memory_mb: int = 128):
    """A function whose handler runs `body` (with `event`), in a folder of its own."""
    (tmp_path / "app.py").write_text(
        "def handler(event, context):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    arn = "arn:aws:lambda:us-east-1:123456789012:function:probe"
    return sandbox.FunctionSpec(
        "Probe", "probe", arn, str(tmp_path), "app.handler", timeout_s, memory_mb
    )


def test_a_busy_loop_gets_the_share_of_a_core_its_memory_size_buys():
    [figures] = sandbox.calibrate(sandbox.cgroup_bases(), (SHARE_256_MB,))
    assert 0 < figures["measured"] <= SHARE_256_MB * SLACK, figures
    assert figures["nr_throttled"] > 0  # the quota held it back
    assert ours() == []


def test_a_share_is_its_own_however_busy_the_machine():
    """Lambda reserves an environment's share: on AWS the stand-ins (the receiver, moto,
    DynamoDB) are other machines. Here a dozen busy processes a core, outside any sandbox
    and each in a session of its own (an autogroup, where the kernel groups a session's
    processes), take none of it: without the sandbox's weight they left it a fraction."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(12 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(0.5)  # all of them running
        [figures] = sandbox.calibrate(sandbox.cgroup_bases(), (SHARE_256_MB,))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert figures["measured"] >= SHARE_256_MB * 0.85, figures
    assert ours() == []


def test_an_invocation_past_its_memory_size_is_killed_as_lambda_unknown(tmp_path):
    pool = sandbox.Pool(sandbox.cgroup_bases(), dict(os.environ))
    # The kernel reclaims before it kills, at 0.036 of a core: about 2 s on a quiet machine,
    # more than 5 s beside two test passes; the timeout is far off so only the kill can end it.
    function = spec(tmp_path, "held = bytearray(event['mb'] * 2**20)\nreturn len(held)", 60, 64)
    try:
        assert pool.invoke(function, {"mb": 8}) == 8 * 2**20  # within its size: answered
        with pytest.raises(sandbox.FunctionError) as killed:
            pool.invoke(function, {"mb": 200})
        assert killed.value.error_type == "Lambda.Unknown"
        assert "64 MB" in str(killed.value)
        assert pool.invoke(function, {"mb": 8}) == 8 * 2**20  # a fresh environment
        assert pool.cold_starts == 2
    finally:
        pool.close()
    assert ours() == []


def test_an_invocation_past_its_timeout_is_killed_as_sandbox_timedout(tmp_path):
    pool = sandbox.Pool(sandbox.cgroup_bases(), dict(os.environ))
    function = spec(tmp_path, "import time\ntime.sleep(event['s'])\nreturn 'woke'", 1)
    try:
        assert pool.invoke(function, {"s": 0}) == "woke"
        began = clock.now_ms()
        with pytest.raises(sandbox.FunctionError) as killed:
            pool.invoke(function, {"s": 30})
        assert killed.value.error_type == "Sandbox.Timedout"
        assert clock.now_ms() - began < 10_000  # killed at its timeout, not after the sleep
    finally:
        pool.close()
    assert ours() == []


BUSY_S = 0.3  # of CPU: at 128 MB's share (0.072 of a core) no less than 4.1 s of wall
BUSY_MODULE = f"""
import time
from pathlib import Path


def quota():
    \"\"\"The share of a core this process's cgroup allows now, as the kernel holds it.\"\"\"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            group = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            quota_us = int((group / "cpu.cfs_quota_us").read_text())
            return quota_us / int((group / "cpu.cfs_period_us").read_text())


def busy():
    end, started = time.process_time() + {BUSY_S}, time.monotonic()
    while time.process_time() < end:
        pass
    return time.monotonic() - started


INIT_QUOTA = quota()


def handler(event, context):
    return [INIT_QUOTA, quota(), busy()]
"""


def test_an_init_runs_on_a_whole_core_and_its_invocations_at_the_memory_share(tmp_path):
    """On AWS an on-demand environment's init gets a whole vCPU, for up to 10 s; then its
    invocations get their memory's share. The function reads its own quota in each phase
    (what the kernel holds it to, whatever else the machine runs), and a busy invocation
    takes at least as long as that share allows."""
    function = spec(tmp_path, "", timeout_s=30, memory_mb=128)
    (tmp_path / "app.py").write_text(BUSY_MODULE)
    pool = sandbox.Pool(sandbox.cgroup_bases(), dict(os.environ))
    try:
        init_share, invocation_share, invocation_wall_s = pool.invoke(function, {})
    finally:
        pool.close()
    assert init_share == sandbox.INIT_SHARE == 1.0
    assert invocation_share == pytest.approx(128 / sandbox.MB_PER_CORE, abs=0.001)
    assert invocation_wall_s >= BUSY_S / (128 / sandbox.MB_PER_CORE) * 0.9


def test_the_executors_fire_from_their_sandboxes_each_task_once_over_tls():
    """A webhook task and an SQS task, through the real machine and executors, each in a
    sandbox that reaches the receiver, moto's services and the DynamoDB process over TLS
    (certificates from the run's own authority, which only the sandboxes trust); then
    nothing of it is left."""
    with (
        WebhookReceiver(tls=tls.authority().server_context()) as receiver,
        runtime_with(lambda_limits=True) as runtime,
    ):
        assert receiver.url.startswith("https://")
        reached = runtime.sandboxes.environment
        for endpoint in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
            assert reached[endpoint].startswith("https://127.0.0.1:"), endpoint
        assert [line for line in runtime.sandbox_report() if "256 MB" in line]
        queue = boto3.client("sqs").create_queue(QueueName="sandboxed")["QueueUrl"]
        due_ms = clock.now_ms() + 6000
        store_task(webhook_task(receiver.url, due_ms, "hook"))
        sqs = {"id": "queued", "due_at": clock.to_iso(due_ms), "type": "sqs",
               "target": {"queue_url": queue}, "payload": {"n": 1}}  # fmt: skip
        store_task(sqs)
        runtime.run_finder()
        for task_id in ("hook", "queued"):
            assert wait_for_status(task_id, {"SUCCEEDED", "FAILED"})["status"] == "SUCCEEDED"
        messages = boto3.client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10)
        assert len(messages["Messages"]) == 1
        assert runtime.sandboxes.cold_starts >= 1
    assert Counter(a.task_id for a in receiver.received()) == {"hook": 1}
    assert ours() == []


def test_where_cgroups_cannot_be_written_the_limits_are_refused_with_the_reason(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sandbox, "CGROUP_ROOT", tmp_path)  # no controllers mounted there
    assert main(["demo", "--tasks", "1", "--lambda-limits"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --lambda-limits needs cgroup v1"), error
