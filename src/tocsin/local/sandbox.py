"""Executor invocations in processes of their own, under Lambda's limits (`--lambda-limits`).

On AWS a 256 MB executor gets about a seventh of a core (Lambda allots CPU in proportion to
memory: one vCPU at 1,769 MB), is killed past its memory size and at its Timeout; the
embedded runtime otherwise runs every handler on the machine's full cores, in its own
process. Here each executor's invocations run in environments that are limited so.

An environment is one Python child (`python -m tocsin.local.sandbox <function>`) in a cgroup
v1 pair of its own: cpu (a CFS quota of MemorySize / 1769 of one core, and the most weight
the kernel gives, so that the share is reserved as Lambda reserves it: the stand-ins
beside it on these cores are other machines on AWS) and memory
(memory.limit_in_bytes = MemorySize). It imports the handler once (Lambda's init, which
gets a whole core, INIT_SHARE), then answers invocations one at a time at its share, as a
Lambda execution environment does, until it is closed, timed out or killed by its memory
limit.

Parent -> child: JSON lines on the child's stdin ("go" first, then one invocation a line).
Child -> parent: JSON lines on a pipe of its own, apart from what the handler prints
(Powertools' logs and EMF: dropped, as Lambda ships them away). The child exits when its
stdin closes (the parent closed it, or died).

The child reaches DynamoDB through AWS_ENDPOINT_URL_DYNAMODB (the DynamoDB process) and
every other service through AWS_ENDPOINT_URL: `tocsin.local.moto_endpoint`, a small HTTP
server in the runtime's process that answers with moto's own request handling (its
in-process backends).
Both over TLS, as on AWS (`tocsin.local.tls`).
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from tocsin.local.lambda_context import LocalLambdaContext, load_handler

CGROUP_ROOT = Path("/sys/fs/cgroup")
MB_PER_CORE = 1769  # Lambda: one vCPU's worth at 1,769 MB
PERIOD_US = 100_000  # the CFS period (the kernel's default); the quota is a share of it
MIN_QUOTA_US = 1000  # the kernel refuses less
CALIBRATION_MB = 64  # the busy loop's memory cap: it needs a few MB
# An on-demand environment's init runs on a whole vCPU, not its memory's share, for up to
# 10 s (AWS's guide "Effectively running Java on Serverless", init phase); its invocations
# then get the share.
INIT_SHARE = 1.0
PREFIX = "tocsin-sandbox"
GUARANTEED_SHARES = 262_144  # cgroup v1's most cpu.shares


class LimitsUnavailable(RuntimeError):
    """--lambda-limits cannot be honoured here; the message says why."""


class FunctionError(Exception):
    """What the function's invocation answered (or Lambda for it): `error_type` names it as
    Step Functions sees it (the runtime's `_route_invoke` reads the attribute)."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


# -- cgroups v1 ---------------------------------------------------------------------------


def _own_cgroup(controller: str) -> str:
    """This process's cgroup in `controller`'s v1 hierarchy ("/" at its root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise LimitsUnavailable(f"this process is in no cgroup v1 '{controller}' hierarchy")


def cgroup_bases() -> dict[str, Path]:
    """Where this process may make its environments' cgroups: under its own cgroup in the
    cpu and memory hierarchies (so whatever limits the runtime limits them too). Refuses
    with the reason when that cannot be done."""
    why = "--lambda-limits needs cgroup v1 cpu and memory controllers it can write"
    if sys.platform != "linux":
        raise LimitsUnavailable(f"{why}: this is {sys.platform}, not Linux")
    bases = {}
    for controller, limit_file in (
        ("cpu", "cpu.cfs_quota_us"),
        ("cpuacct", "cpuacct.usage"),
        ("memory", "memory.limit_in_bytes"),
    ):
        mount = CGROUP_ROOT / controller
        if not (mount / limit_file).exists():
            v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
            detail = "this machine has cgroup v2 (unified) only" if v2 else f"no {mount}"
            raise LimitsUnavailable(f"{why}: {detail}")
        base = mount / _own_cgroup(controller).lstrip("/")
        if base.resolve() in {b.resolve() for b in bases.values()}:
            bases[controller] = base  # mounted with cpu (cpu,cpuacct): one folder serves both
            continue
        probe = base / f"{PREFIX}-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as error:
            raise LimitsUnavailable(
                f"{why}: cannot make a cgroup in {base} ({error.strerror}); run as root, or "
                f"give this user a cgroup there (chown -R), or run without --lambda-limits"
            ) from error
        bases[controller] = base
    return bases


def sweep(bases: dict[str, Path]) -> list[Path]:
    """Remove cgroups an earlier runtime left behind (its process is gone), killing what is
    still in them; the ones removed."""
    removed = []
    for base in {base.resolve(): base for base in bases.values()}.values():
        for group in base.glob(f"{PREFIX}-*"):
            owner = group.name.split("-")[2]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                _kill_members(group)
                _rmdir(group)
                removed.append(group)
    return removed


def _members(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _kill_members(group: Path) -> None:
    for pid in _members(group):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _rmdir(group: Path, wait_s: float = 2.0) -> None:
    """rmdir once its members have gone (a killed task leaves the group as it is reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a member not yet gone
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@dataclass
class Cgroups:
    """One environment's cpu and memory cgroups, and the cpuacct one that counts its CPU
    (the cpu group itself where the two controllers share a hierarchy)."""

    cpu: Path
    memory: Path
    cpuacct: Path

    @classmethod
    def make(
        cls, bases: dict[str, Path], share: float, memory_mb: int, period_us: int = PERIOD_US
    ) -> "Cgroups":
        name = f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        pair = cls(bases["cpu"] / name, bases["memory"] / name, bases["cpuacct"] / name)
        pair.cpu.mkdir()
        try:
            pair.memory.mkdir()
            pair.cpuacct.mkdir(exist_ok=True)  # made with cpu where they share a hierarchy
            pair.hold_to(share, period_us)
            limit = str(memory_mb * 1024 * 1024)
            (pair.memory / "memory.limit_in_bytes").write_text(limit)
            swap = pair.memory / "memory.memsw.limit_in_bytes"  # no swapping past it either
            if swap.exists():
                swap.write_text(limit)
        except BaseException:
            pair.remove()
            raise
        return pair

    def hold_to(self, share: float, period_us: int = PERIOD_US) -> None:
        """From now on, `share` of a core: a CFS quota of each period, and the weight that
        gives the group its quota first whenever it is runnable. (With the default weight,
        the runtime's processes took it: a sandbox woken at its gate, unthrottled, waited
        up to 340 ms for a core, where Lambda would have run it at once.)"""
        quota = max(MIN_QUOTA_US, round(share * period_us))
        (self.cpu / "cpu.cfs_period_us").write_text(str(period_us))
        (self.cpu / "cpu.cfs_quota_us").write_text(str(quota))
        (self.cpu / "cpu.shares").write_text(str(GUARANTEED_SHARES))

    def groups(self) -> list[Path]:
        return list({group: None for group in (self.cpu, self.memory, self.cpuacct)})

    def add(self, pid: int) -> None:
        for group in self.groups():
            (group / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """The kernel's OOM kills in this group (oom_control's counter; kernels >= 4.13)."""
        for line in (self.memory / "memory.oom_control").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
        return 0

    def stats(self) -> dict[str, Any]:
        cpu = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
        memory = self.memory
        return {
            "nr_periods": int(cpu["nr_periods"]),
            "nr_throttled": int(cpu["nr_throttled"]),
            "throttled_ms": int(cpu["throttled_time"]) / 1e6,
            "memory_failcnt": int((memory / "memory.failcnt").read_text()),
            "memory_peak_mb": int((memory / "memory.max_usage_in_bytes").read_text()) / 2**20,
            "oom_kills": self.oom_kills(),
        }

    def throttling(self) -> "Tally":
        """The CFS throttling so far: periods throttled, and for how long."""
        cpu = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
        return Tally(nr_throttled=int(cpu["nr_throttled"]), throttled_ns=int(cpu["throttled_time"]))

    def remove(self) -> None:
        for group in self.groups():
            _kill_members(group)
            _rmdir(group)


@dataclass(frozen=True)
class Tally:
    """What invocations did after their gates (`tocsin.gate.WATCH`: the CPU their cgroup
    spent from a send's first gate to its last write, and the sends written) and the CFS
    throttling their cgroup met meanwhile; added up over invocations and environments."""

    invocations: int = 0
    post_gate_cpu_ns: int = 0
    sends: int = 0
    nr_throttled: int = 0
    throttled_ns: int = 0

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: "Tally") -> "Tally":
        return Tally(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


# -- the parent's side --------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    name: str
    arn: str
    code_dir: str
    handler: str  # module.attribute, as in the template
    timeout_s: float
    memory_mb: int


class Environment:
    """One execution environment: a child in its cgroups, its handler imported once."""

    def __init__(
        self,
        spec: FunctionSpec,
        bases: dict[str, Path],
        environment: dict[str, str],
        period_us: int = PERIOD_US,
    ):
        self.spec = spec
        self.groups = Cgroups.make(bases, INIT_SHARE, spec.memory_mb, period_us)
        self.invocations = 0
        self.tally = Tally()  # what its invocations did after their gates, and were throttled
        self.running: Any = None  # the event of the invocation under way, if any
        self.peak_mb = 0.0  # its cgroup's peak memory, kept when it is closed
        reply_read, reply_write = os.pipe()
        env = {
            **environment,
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(int(spec.timeout_s)),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            CPUACCT_ENV: str(self.groups.cpuacct / "cpuacct.usage"),
        }
        try:
            # No preexec_fn: with threads in the parent it may deadlock, and it would make
            # subprocess fork the whole moto heap instead of vfork/posix_spawn.
            self.child = subprocess.Popen(
                [sys.executable, "-m", "tocsin.local.sandbox", json.dumps(vars(spec))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,  # its logs and metrics, as Lambda ships them away
                pass_fds=(reply_write,),
                env=env | {"TOCSIN_SANDBOX_REPLY_FD": str(reply_write)},
            )
        except BaseException:
            os.close(reply_read)
            self.groups.remove()
            raise
        finally:
            os.close(reply_write)
        self._replies = reply_read
        self._buffer = b""
        try:
            self.groups.add(self.child.pid)  # before the go: init runs in its cgroups
        except BaseException:
            self.close()
            raise
        started = time.monotonic()
        self._send({"go": True})
        # Lambda's init limit is 10 s (on demand); a slower init here is reported, not killed.
        self.init = self._reply(started + max(10.0, spec.timeout_s))
        self.init["init_wall_ms"] = round((time.monotonic() - started) * 1000)
        if "errorType" in self.init:
            self.close()
            raise FunctionError(self.init["errorType"], self.init["errorMessage"])
        self.groups.hold_to(spec.memory_mb / MB_PER_CORE, period_us)

    def invoke(self, event: Any, request_id: str | None = None) -> Any:
        """The handler's result; FunctionError for its error, a timeout or a memory kill
        (the environment is then gone: close() was called)."""
        started = time.monotonic()  # CLOCK_MONOTONIC: the same clock in the child
        deadline = started + self.spec.timeout_s
        self.invocations += 1
        throttled_before = self.groups.throttling()
        self._send(
            {"event": event, "started": started, "request_id": request_id or str(uuid.uuid4())}
        )
        self.running = event
        try:
            reply = self._reply(deadline)
        finally:
            self.running = None
        throttled = self.groups.throttling() - throttled_before
        self.tally += Tally(1, *reply.get("post_gate", (0, 0))) + throttled
        if "errorType" in reply:
            raise FunctionError(reply["errorType"], reply["errorMessage"])
        return reply["result"]

    def _send(self, message: dict[str, Any]) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps(message).encode() + b"\n")
        self.child.stdin.flush()

    def _reply(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([self._replies], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self.close()
                timed_out = f"Task timed out after {self.spec.timeout_s:.2f} seconds"
                raise FunctionError("Sandbox.Timedout", timed_out)
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:  # the child is gone
                raise self._died()
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _died(self) -> FunctionError:
        code = self.child.wait()
        oom = self.groups.oom_kills()
        stats = self.groups.stats()
        self.close()
        if oom or (code == -signal.SIGKILL and stats["memory_failcnt"]):
            message = (
                f"Runtime exited with error: signal: killed (memory: {self.spec.memory_mb} MB "
                f"limit reached, peak {stats['memory_peak_mb']:.0f} MB)"
            )
            return FunctionError("Lambda.Unknown", message)
        return FunctionError("Lambda.Unknown", f"Runtime exited with error: exit status {code}")

    def close(self) -> None:
        """Kill the child and everything in its cgroups, then remove them (its peak memory
        kept)."""
        with suppress(OSError):
            self.peak_mb = self.groups.stats()["memory_peak_mb"]
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait()
        if self.child.stdin:
            with suppress(BrokenPipeError):
                self.child.stdin.close()
        with suppress(OSError, AttributeError):
            os.close(self._replies)
        self.groups.remove()


class Pool:
    """Warm environments per function: an invocation takes an idle one or starts one (cold);
    a timed out or killed one is gone, the others wait for the next invocation."""

    def __init__(self, bases: dict[str, Path], environment: dict[str, str]):
        self.bases, self.environment = bases, environment
        self._idle: dict[str, list[Environment]] = {}
        self._all: set[Environment] = set()
        self._lock = threading.Lock()
        self.cold_starts = 0
        self._peaks_mb: list[float] = []  # of the environments gone
        self._tallies_gone: dict[str, Tally] = {}  # of the environments gone, by function

    def invoke(self, spec: FunctionSpec, event: Any) -> Any:
        with self._lock:
            idle = self._idle.setdefault(spec.logical_id, [])
            environment = idle.pop() if idle else None
        if environment is None:
            environment = self._started(spec)
        try:
            result = environment.invoke(event)
        except FunctionError as error:
            if error.error_type in ("Sandbox.Timedout", "Lambda.Unknown"):  # environment gone
                with self._lock:
                    self._all.discard(environment)
                    self._peaks_mb.append(environment.peak_mb)
                    gone = self._tallies_gone.get(spec.logical_id, Tally())
                    self._tallies_gone[spec.logical_id] = gone + environment.tally
                raise
            with self._lock:
                self._idle[spec.logical_id].append(environment)
            raise
        with self._lock:
            self._idle[spec.logical_id].append(environment)
        return result

    def warm(self, spec: FunctionSpec, count: int) -> None:
        """`count` idle environments of `spec`, started side by side: as Lambda keeps the
        environments of earlier invocations, or provisioned concurrency keeps them."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="warming") as starting:
            started = list(starting.map(lambda _: self._started(spec), range(count)))
        with self._lock:
            self._idle.setdefault(spec.logical_id, []).extend(started)

    def _started(self, spec: FunctionSpec) -> Environment:
        environment = Environment(spec, self.bases, self.environment)
        with self._lock:
            self._all.add(environment)
            self.cold_starts += 1
        return environment

    def busy(self, logical_id: str) -> list[Environment]:
        """The environments of a function with an invocation under way."""
        with self._lock:
            return [
                e for e in self._all if e.spec.logical_id == logical_id and e.running is not None
            ]

    def tally(self, logical_id: str) -> Tally:
        """What a function's invocations did after their gates, and their throttling."""
        with self._lock:
            live = [e.tally for e in self._all if e.spec.logical_id == logical_id]
            return sum(live, self._tallies_gone.get(logical_id, Tally()))

    def peak_memory_mb(self) -> float:
        """The most memory any environment of the pool has held (its cgroup's peak)."""
        with self._lock:
            live = [e.groups.stats()["memory_peak_mb"] for e in self._all]
            return max([*live, *self._peaks_mb], default=0.0)

    def close(self) -> None:
        with self._lock:
            environments, self._all, self._idle = list(self._all), set(), {}
        for environment in environments:
            environment.close()


# -- calibration ----------------------------------------------------------------------------


def calibrate(
    bases: dict[str, Path], shares: tuple[float, ...], seconds: float = 1.0
) -> list[dict[str, Any]]:
    """A busy loop for `seconds` in a cgroup of each share: the CPU share it measured, which
    the quota caps (the machine's other work can only lower it)."""
    figures = []
    for share in shares:
        groups = Cgroups.make(bases, share, CALIBRATION_MB)
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", _BUSY, str(seconds)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            groups.add(child.pid)
            out, _ = child.communicate("go\n", timeout=seconds * 10 + 10)
            measured = json.loads(out)
            figures.append(
                {"given": share, "measured": round(measured["cpu_s"] / measured["wall_s"], 3)}
                | measured
                | {k: v for k, v in groups.stats().items() if k.startswith(("nr_", "thr"))}
            )
        finally:
            groups.remove()
    return figures


_BUSY = """
import json, sys, time
sys.stdin.readline()
seconds = float(sys.argv[1])
wall0, cpu0 = time.monotonic(), time.process_time()
n = 0
while time.monotonic() - wall0 < seconds:
    n += 1
wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
print(json.dumps({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "loops": n}))
"""


# -- the child's side -------------------------------------------------------------------------


CPUACCT_ENV = "TOCSIN_SANDBOX_CPUACCT"  # the child's cgroup's CPU counter (cpuacct.usage)


class CgroupCpu:
    """`tocsin.gate.WATCH` in a sandbox: the CPU its cgroup spent from an invocation's first
    gate to its last write, and the sends written. Each reading first yields the CPU, so
    the kernel charges the running thread's time to the cgroup before it is read (read
    while running, the counter lagged by up to a scheduler tick, 4 ms, against the
    process's own clock; after a yield, within 0.1 ms)."""

    def __init__(self, usage: Path):
        self._usage = os.open(usage, os.O_RDONLY)
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        with self._lock:
            self._first_ns = self._last_ns = 0
            self._sends = 0

    def _read(self) -> int:
        os.sched_yield()
        return int(os.pread(self._usage, 32, 0))

    def let_go(self) -> None:
        with self._lock:
            if not self._first_ns:
                self._first_ns = self._read()

    def written(self, sends: int) -> None:
        with self._lock:
            self._last_ns = self._read()
            self._sends += sends

    def figures(self) -> tuple[int, int]:
        """The CPU (ns) from the first gate to the last write, and the sends written."""
        with self._lock:
            return max(self._last_ns - self._first_ns, 0), self._sends


def _child(spec_json: str) -> None:
    import queue

    replies = os.fdopen(int(os.environ["TOCSIN_SANDBOX_REPLY_FD"]), "wb", buffering=0)
    inbox: queue.Queue[bytes] = queue.Queue()

    def read_stdin() -> None:  # stdin closed (the parent closed it, or died): end at once
        for line in sys.stdin.buffer:
            inbox.put(line)
        os._exit(0)

    threading.Thread(target=read_stdin, daemon=True, name="sandbox-stdin").start()
    inbox.get()  # the go: the parent has put this process in its cgroups

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message).encode() + b"\n")

    import warnings

    warnings.filterwarnings("ignore", message="No application metrics to publish")
    spec = FunctionSpec(**json.loads(spec_json))
    cpu0 = time.process_time()
    try:
        handler = load_handler(Path(spec.code_dir), spec.handler, spec.logical_id)
    except Exception as error:
        reply({"errorType": "Runtime.ImportModuleError", "errorMessage": str(error)})
        return
    from tocsin import gate
    from tocsin.observability import metrics

    watch = gate.WATCH = CgroupCpu(Path(os.environ[CPUACCT_ENV]))
    reply({"ready": True, "init_cpu_ms": round((time.process_time() - cpu0) * 1000)})
    while True:
        message = json.loads(inbox.get())
        context = LocalLambdaContext(
            spec.name,
            spec.arn,
            spec.timeout_s,
            memory_limit_in_mb=spec.memory_mb,
            aws_request_id=message["request_id"],
            started=message["started"],
        )
        watch.start()
        try:
            result = handler(message["event"], context)
            reply({"result": result, "post_gate": watch.figures()})
        except Exception as error:
            name = getattr(error, "error_type", type(error).__name__)
            reply({"errorType": name, "errorMessage": str(error), "post_gate": watch.figures()})
        finally:
            metrics.clear_metrics()


if __name__ == "__main__":
    _child(sys.argv[1])
