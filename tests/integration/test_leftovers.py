"""Nothing Tocsin starts outlives what started it: DynamoDB Local's JVM and its folder, the
DynamoDB process, the receiver, however their parent ends (its stop, SIGTERM, Ctrl-C, SIGKILL).

Each run here carries a mark in its environment, which every process it starts inherits
(the JVM too): after the run, no process on the machine may carry it. A JVM left behind
is 250 MB, and a machine that runs the tests a few times a day ran out of memory.
"""

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import serve, stop
from tocsin.cli import until_interrupted
from tocsin.local.dynamodb_local import jar

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="reads processes' environments in /proc"
)
MARK = "TOCSIN_TEST_RUN"
GONE_TIMEOUT_S = 30.0


def marked(mark: str) -> list[int]:
    """Every process whose environment carries `MARK=mark`."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environment = (entry / "environ").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile, or not ours to read
                continue
            if needle in environment:
                found.append(int(entry.name))
    return found


def program(pid: int) -> str:
    """The name of the program process `pid` runs (its first argument's last part)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().rpartition("/")[2]


def all_gone(mark: str) -> list[int]:
    """The marked processes still there once they had time to end (none, if all went)."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def marked_environment() -> tuple[str, dict[str, str]]:
    mark = uuid.uuid4().hex
    return mark, {**os.environ, MARK: mark}


# A process that keeps DynamoDB Local running and never stops it, as a test process keeps
# one idle for its next runtime (`dynamodb_local._idle`), then ends or waits to be ended.
KEEPS_ONE_IDLE = """
import sys, time
from tocsin.local.dynamodb_local import DynamoDBLocal
kept = DynamoDBLocal().__enter__()
print("idle", flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(600)
"""


@pytest.mark.any_python  # the keeper runs on the Python that starts it: the same code
@pytest.mark.skipif(jar() is None, reason="no DynamoDB Local (make dynamodb-local)")
@pytest.mark.parametrize("ending", ["exit", "SIGTERM", "SIGINT", "SIGKILL"])
def test_dynamodb_locals_jvm_ends_with_the_process_that_started_it(ending):
    mark, environment = marked_environment()
    parent = subprocess.Popen(
        [sys.executable, "-c", KEEPS_ONE_IDLE, "exit" if ending == "exit" else "wait"],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
        cwd=Path(__file__).parents[2],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert parent.stdout is not None
    assert parent.stdout.readline().strip() == "idle"
    jvms = [pid for pid in marked(mark) if program(pid) == "java"]
    assert jvms, "no JVM was started"
    folders = [Path(f"/proc/{pid}/cwd").readlink() for pid in jvms]  # its metadata file's
    if ending != "exit":
        parent.send_signal(getattr(signal, ending))
    parent.wait(timeout=60)
    parent.stdout.close()
    assert all_gone(mark) == []
    assert [folder for folder in folders if folder.exists()] == []


@pytest.mark.slow
@pytest.mark.tool
@pytest.mark.parametrize("ending", ["SIGTERM", "SIGINT"])
def test_serve_stopped_leaves_nothing_running(ending, monkeypatch):
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)  # serve() starts its process with this one's environment
    server, _ = serve(*(["--tables", "dynamodb-local"] if jar() else []))
    monkeypatch.delenv(MARK)
    assert len(marked(mark)) >= 2  # serve, its DynamoDB process (or JVM and keeper)
    if ending == "SIGINT":
        stop(server)
    else:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0  # stopped as Ctrl-C stops it: its stop ran
    assert server.stdout is not None
    server.stdout.close()
    assert all_gone(mark) == []


@pytest.mark.timeout(15)
def test_a_ctrl_c_that_another_thread_takes_still_stops_serve_and_console():
    """The kernel may hand a process's SIGINT to any of its threads, and Python raises
    KeyboardInterrupt only in the main thread, once that thread runs: serve's wait, blocked
    for good on a lock, ignored such a Ctrl-C (CI: no stop 60 s after it)."""
    sleeper = threading.Thread(target=time.sleep, args=(10,), daemon=True)
    sleeper.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, signal.pthread_kill, (sleeper.ident, signal.SIGINT)).start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            until_interrupted()
        assert time.monotonic() - began < 5
    finally:
        signal.signal(signal.SIGINT, previous)
