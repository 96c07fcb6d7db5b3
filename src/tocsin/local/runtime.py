"""The embedded runtime: the real template, state machine and handlers, on moto, in-process.

* Every resource is created from template.yaml and the .asl.json: the template is translated
  with the SAM translator and created as a stack in moto's CloudFormation.
* moto does not apply DefinitionSubstitutions (and creates CloudFormation state machines
  where they do not execute): the machine is created again, where moto executes it, with
  its substitutions resolved from the stack.
* moto runs the ASL (`execute_state_machine`); its Lambda invoke needs Docker, so invokes are
  routed to the handlers of template.yaml in this process, with their resolved environment.
* What the runtime changes inside moto, and why, is in `tocsin.local.moto_patches`: among
  others, moto parses the ASL and builds new SDK clients for every execution; the parsed
  program is cached per definition and the task states share one client per service.
* moto keeps every model object it ever made (for its dashboard) and every thread its
  interpreter started; here it keeps neither, so the heap holds what the services hold.
  What the start built (modules, the stack, the parsed program) is frozen out of the
  garbage collector's sight, so its full collections do not pause every thread for it.
* On AWS each gate sleeps in its own Lambda; here every gate shares one GIL with moto. The
  interpreter's switch interval is 1 ms instead of 5, so a thread leaving its gate gets
  the GIL back sooner from a thread that is busy. And DynamoDB calls wait while a gate is
  about to let go, and while its action goes out (`tocsin.local.gates_first`): on AWS the
  writes of the tasks that just fired run elsewhere, and do not hold up the gates still
  asleep or the requests they let through.
* DynamoDB runs in a child process (`tocsin.local.dynamodb_process`), so its share of the
  work uses the second core; every client here reaches it through
  AWS_ENDPOINT_URL_DYNAMODB, unsigned (nothing there checks a signature, and signing was a
  fifth of a call's CPU). The stack's tables are made there again after the stack.
* DynamoDB requests and StartExecution are atomic on AWS; moto's are plain Python (a
  conditional update reads, copies and writes the item in steps), so each runs under a
  lock here (DynamoDB's in its process) to behave the same way when threads race.
* moto's SQS-to-Lambda mapping runs inside SendMessage with fixed attributes; the runtime
  polls the mapped queues itself, as Lambda does (see `tocsin.local.queues`).
* The finder runs on a ticker, with a shorter interval and look-ahead than on AWS; its
  schedule rule loses its target (moto would match it against every PutEvents event).
* With a `state_file`, a stop lets running invocations finish, then saves the tables,
  queues and secrets; the next start restores them and requeues the tasks whose
  executions were lost (see `tocsin.local.state`). Without one, invocations asleep at a
  gate end there, sending nothing, and the stop waits for every invocation to end: a
  thread left running reached the next runtime's services (a test's recorder saw its calls).
"""

import gc
import json
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

from tocsin.local import moto_patches, state
from tocsin.local.dynamodb_local import DynamoDBLocalTables
from tocsin.local.dynamodb_process import DynamoDBProcess, process_usage, unsigned_to
from tocsin.local.gates_first import GatesFirst
from tocsin.local.lambda_context import LocalLambdaContext, load_handler
from tocsin.local.queues import QueueMapping, poll, take_over_mappings
from tocsin.local.stack import (
    ACCOUNT_ID,
    REGION,
    STACK_NAME,
    create_stack,
    project_root,
    translate,
)

# Local defaults: a quick finder so the demo shows both paths within a minute. One process
# runs everything here (moto costs tens of ms of CPU per execution, under one GIL): a longer
# lead lets a busy runtime still reach the gate in time, and fewer wakes per second keep
# a burst's claims apart.
LOCAL_PARAMETERS = {
    "LookAheadSeconds": "20",
    "LeadMilliseconds": "5000",
    "WakesPerSecond": "15",
    "LogLevel": "WARNING",
}
PROCESS_ENVIRONMENT = {
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_TRACE_DISABLED": "true",
    # botocore's own default: the one DynamoDB process queues answers under load for longer
    # than AWS ever takes (`tocsin.aws.READ_TIMEOUT_S`), and a retry would only queue again.
    "TOCSIN_SDK_READ_TIMEOUT_SECONDS": "60",
    # A target call's wait, for the same reason (its moto endpoint answers one call at a
    # time): at 25 s an attempt may take 58 s, inside the executors' 120 s.
    "TOCSIN_TARGET_READ_TIMEOUT_SECONDS": "25",
}

# Lambda runs each invocation in an environment of its own; here a function's invocations
# share its module. The API's resolver (Powertools) keeps the request it is answering on
# itself, so its invocations take turns (two at once answered one with the other's route:
# KeyError '_route'); the executors' invocations must overlap, as their gates do on AWS.
ONE_AT_A_TIME = {"ApiFunction"}
QUEUE_POLL_INTERVAL_S = 1.0
# Where the stack's tables live: moto's DynamoDB in a child process (metered, with faults to
# inject), or DynamoDB Local, AWS's own engine (tocsin.local.dynamodb_local).
TABLE_ENGINES = ("moto", "dynamodb-local")
# Lambda's limit on a synchronous invocation's response, as it counts it (the quotas page's
# "6 MB"; its error names this figure). The local runtime has no limit of its own: without
# this, a listing past it answered locally and failed on AWS.
RESPONSE_LIMIT_BYTES = 6_291_556
# Collect the young generation every 10,000 new objects instead of 700: moto allocates
# heavily, and most of what survives a collection is the services' state, not garbage.
YOUNG_GC_THRESHOLD = 10_000
SWITCH_INTERVAL_S = 0.001
# A stop without a state file waits this long at most for its invocations to end: those
# asleep at a gate end at once; one sending to a target that hangs ends with its timeout.
END_INVOCATIONS_S = 30.0

log = logging.getLogger(__name__)


def _drop_unsupported_resources(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No Moto CloudFormation support")


@dataclass(frozen=True)
class LocalFunction:
    logical_id: str
    name: str
    arn: str
    handler: Callable[[Any, Any], Any]
    timeout_s: float
    memory_mb: int
    architecture: str


class ResponseSizeTooLarge(Exception):
    """What Lambda answers for a response past RESPONSE_LIMIT_BYTES (an API Gateway caller
    gets a 500)."""

    error_type = "Function.ResponseSizeTooLarge"


class EmbeddedRuntime:
    """Start with `with EmbeddedRuntime() as runtime:`; see the module docstring."""

    def __init__(
        self,
        parameters: dict[str, str] | None = None,
        finder_interval_s: float | None = 5.0,
        root: Path | None = None,
        state_file: Path | None = None,
        tables: str = "moto",
        lambda_limits: bool = False,
    ):
        self.root = root or project_root()
        self.parameters = {**LOCAL_PARAMETERS, **(parameters or {})}
        self.finder_interval_s = finder_interval_s
        self.functions: dict[str, LocalFunction] = {}
        self.outputs: dict[str, str] = {}
        self.foreign_invocations: list[tuple[str, Any]] = []
        self.definition = ""  # the task machine's ASL, its placeholders resolved
        self.template: dict[str, Any] = {}  # template.yaml translated to CloudFormation
        self.usage: Counter[tuple[str, str]] = Counter()  # (function, "invocations" | "ms")
        self._exits = ExitStack()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue_mappings: list[QueueMapping] = []
        self.state_file = state_file
        if tables not in TABLE_ENGINES:
            raise ValueError(f"tables: one of {', '.join(TABLE_ENGINES)}")
        self.tables = tables
        self.requeued: list[str] = []  # tasks whose executions a restart had lost
        self._invoking = 0  # Lambda invocations under way for executions
        self._gates_first = GatesFirst()
        self._invocations_done = threading.Condition()
        self._stopped = False
        self._turns = {logical_id: threading.Lock() for logical_id in ONE_AT_A_TIME}
        self.lambda_limits = lambda_limits
        self.sandboxes: Any = None  # tocsin.local.sandbox.Pool, with lambda_limits
        self.moto_endpoint: Any = None  # tocsin.local.moto_endpoint.MotoEndpoint, with them
        self._sandboxed: dict[str, Any] = {}  # executor logical id -> its FunctionSpec
        self.calibration: list[dict[str, Any]] = []  # the sandboxes' CPU share, measured

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "EmbeddedRuntime":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if self.lambda_limits:  # refuse before anything starts, saying why
            from tocsin.local import sandbox

            self._cgroup_bases = sandbox.cgroup_bases()
            sandbox.sweep(self._cgroup_bases)
        self._exits.enter_context(mock.patch.dict(os.environ, PROCESS_ENVIRONMENT))
        self._collect_less()
        engine = DynamoDBLocalTables if self.tables == "dynamodb-local" else DynamoDBProcess
        self.dynamodb = engine(dict(os.environ))  # starts while the rest is built
        self._exits.callback(self.dynamodb.hand_back)
        self._exits.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        warnings.filterwarnings("ignore", message="Tried to parse AWS::")
        # moto has no CloudFormation for API Gateway v2 or queue policies: it skips them with a
        # warning. The API's handler runs all the same (`tocsin serve`); IAM is not modelled.
        moto_log = logging.getLogger("moto")
        moto_log.addFilter(_drop_unsupported_resources)
        self._exits.callback(moto_log.removeFilter, _drop_unsupported_resources)
        time.tzset()
        self._exits.callback(time.tzset)

        from moto import mock_aws

        self._exits.enter_context(moto_patches.backends_released())
        self._exits.enter_context(mock_aws(config=moto_patches.runtime_config()))
        moto_patches.shared_service_models()
        self._patch_backends()
        self._put_gates_first()
        self._serve_targets_moto()
        self._forget_process_caches()
        template, self._code_dirs = translate(self.root / "template.yaml", self.parameters)
        self.template = template
        self._stack, self._substitutions = create_stack(template, self.parameters)
        self._move_tables()
        saved = state.load(self.state_file) if self.state_file else None
        if saved:
            state.restore(STACK_NAME, saved)
        self._install_functions(template)
        if self.lambda_limits:
            self._start_sandboxes(template)
        self._create_state_machine(template)
        if saved:
            self.requeued = state.requeue_interrupted()
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in self._describe_outputs()}
        by_arn = {function.arn: function.logical_id for function in self.functions.values()}
        self._queue_mappings = take_over_mappings(by_arn)
        self._unhook_schedule_rules()
        self._tune_interpreter()
        if self.finder_interval_s:
            for name, loop in (("finder-ticker", self._tick), ("queue-poller", self._poll)):
                thread = threading.Thread(target=loop, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        for thread in self._threads:
            thread.join()
        if self.outputs:
            self._stop_executions()
            if self.state_file:  # they finish, as Lambda lets them, and are saved with the rest
                self._drain_invocations(max(f.timeout_s for f in self.functions.values()))
                state.save(self.state_file, state.snapshot(STACK_NAME))
            else:  # they end at their gates, sending nothing, before the services go
                self._gates_first.stop()
                if self.sandboxes is not None:  # their gates end by a kill, sending nothing
                    self.sandboxes.close()
                self._drain_invocations(END_INVOCATIONS_S)
        self._exits.close()
        self._forget_process_caches()

    def _serve_targets_moto(self) -> None:
        """Target clients send to moto over HTTP (`tocsin.local.moto_endpoint`), as they
        send to AWS: their requests are written by the wire, on connections of their own,
        which moto's in-process hook never sees (`tocsin.aws.TARGET_ENDPOINT`)."""
        from tocsin import aws
        from tocsin.local import moto_endpoint

        targets = self._exits.enter_context(moto_endpoint.serving_moto(None))
        os.environ[aws.TARGET_ENDPOINT] = targets.url  # restored at the stop, as all of them

    def _collect_less(self) -> None:
        """Until the stop, young objects are collected less often: the start makes hundreds
        of thousands (moto's models, botocore's clients), and at Python's default a third of
        its CPU went to collections that freed little."""
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_GC_THRESHOLD, *thresholds[1:])
        self._exits.callback(gc.set_threshold, *thresholds)

    def _tune_interpreter(self) -> None:
        """Until the stop: what the start built is out of the collector's generations, and
        threads switch every millisecond. No collection first (a few hundred ms a start):
        the start's garbage, frozen with the rest, is collected after the stop."""
        interval = sys.getswitchinterval()
        gc.freeze()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._exits.callback(sys.setswitchinterval, interval)
        self._exits.callback(gc.unfreeze)

    # -- what callers use ------------------------------------------------------------------

    def time_out_at(self, logical_id: str, timeout_s: float) -> None:
        """From its next invocation, the function ends at `timeout_s`, in a sandbox or not
        (a scenario that waits for a timeout need not wait the template's)."""
        self.functions[logical_id] = replace(self.functions[logical_id], timeout_s=timeout_s)
        if logical_id in self._sandboxed:
            self._sandboxed[logical_id] = replace(self._sandboxed[logical_id], timeout_s=timeout_s)

    def warm(self, logical_id: str, count: int) -> None:
        """Under Lambda's limits: `count` environments of a sandboxed executor started ahead,
        idle, as after earlier invocations (see `tocsin.local.sandbox.Pool.warm`)."""
        assert self.sandboxes is not None, "warm() needs lambda_limits"
        self.sandboxes.warm(self._sandboxed[logical_id], count)

    def invoke(self, logical_id: str, event: Any) -> Any:
        """Run one function of the template on `event`, as Lambda would."""
        from tocsin.observability import metrics

        function = self.functions[logical_id]
        context = LocalLambdaContext(function.name, function.arn, function.timeout_s)
        started = time.perf_counter()
        try:
            with self._turns.get(logical_id, nullcontext()):
                if logical_id in self._sandboxed:
                    result = self.sandboxes.invoke(self._sandboxed[logical_id], event)
                else:
                    result = function.handler(event, context)
            if len(json.dumps(result).encode()) > RESPONSE_LIMIT_BYTES:
                raise ResponseSizeTooLarge(
                    f"Response payload size exceeded maximum allowed payload size "
                    f"({RESPONSE_LIMIT_BYTES} bytes)."
                )
            return result
        finally:
            self.usage[logical_id, "invocations"] += 1
            self.usage[logical_id, "ms"] += math.ceil((time.perf_counter() - started) * 1000)
            # No CloudWatch here: drop the invocation's metrics (Powertools keeps them when
            # disabled; see `_print_no_full_metric_sets`).
            metrics.clear_metrics()

    def footprint(self) -> dict[str, Any]:
        """CPU seconds and peak memory (MiB) of this process and the DynamoDB process
        together (and CPU seconds of the DynamoDB process alone), DynamoDB's requests by
        action and the write units they were billed (`tocsin.local.write_units`); after
        the stop, as they were then."""
        own, tables = process_usage(), self.dynamodb.usage()
        return {
            "cpu_s": own["cpu_s"] + tables["cpu_s"],
            "dynamodb_cpu_s": tables["cpu_s"],
            "peak_memory_mb": round(own["peak_memory_mb"] + tables["peak_memory_mb"], 1),
            "dynamodb_requests": Counter(tables["requests"]),
            "dynamodb_write_units": Counter(tables["write_units"]),
        }

    def run_finder(self) -> Any:
        return self.invoke("FinderFunction", scheduled_event())

    def poll_queues(self) -> int:
        """One polling round over every queue a function is mapped to; messages handed over."""
        return sum(poll(mapping, self.invoke) for mapping in self._queue_mappings)

    @property
    def state_machine_arn(self) -> str:
        return self.outputs["StateMachineArn"]

    @property
    def tasks_table(self) -> str:
        return self.outputs["TasksTableName"]

    @property
    def dead_letter_queue_url(self) -> str:
        return self.outputs["DeadLetterQueueUrl"]

    def executions(self) -> Iterator[Any]:
        """moto's execution objects of the task state machine."""
        backend = self._sfn_backend()
        yield from list(backend.describe_state_machine(self.state_machine_arn).executions)

    def wait_for_executions(self, timeout_s: float) -> bool:
        """Wait until no execution is running; False if some still are after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(e.status != "RUNNING" for e in self.executions()):
                return True
            time.sleep(0.05)
        return False

    # -- building the stack ----------------------------------------------------------------

    def _describe_outputs(self) -> list[dict[str, str]]:
        import boto3

        stack = boto3.client("cloudformation").describe_stacks(StackName=STACK_NAME)["Stacks"][0]
        return stack.get("Outputs", [])

    def resolve(self, value: Any) -> Any:
        """`value` of the translated template with its intrinsic functions (Ref, Fn::GetAtt,
        Fn::Sub, Fn::If, ...) resolved against the stack."""
        from moto.cloudformation.parsing import clean_json

        return clean_json(value, self._stack.resource_map)

    def _install_functions(self, template: dict[str, Any]) -> None:
        """Load every function's handler and give the process their (merged) environment."""
        environment: dict[str, str] = {}
        for logical_id in self._code_dirs:
            properties = template["Resources"][logical_id]["Properties"]
            variables = self.resolve(properties.get("Environment", {}).get("Variables", {}))
            for key, value in variables.items():
                if environment.setdefault(key, str(value)) != str(value):
                    raise ValueError(f"functions disagree on {key}: one process cannot run both")
        self._exits.enter_context(mock.patch.dict(os.environ, environment))
        self._forget_process_caches()
        from tocsin.observability import logger

        # The logger was made at import, before this environment: take the template's level.
        self._exits.callback(logger.setLevel, logger.log_level)
        logger.setLevel(os.environ.get("POWERTOOLS_LOG_LEVEL", "INFO"))
        for logical_id, code_dir in self._code_dirs.items():
            properties = template["Resources"][logical_id]["Properties"]
            name = self.resolve({"Ref": logical_id})
            arn = self.resolve({"Fn::GetAtt": [logical_id, "Arn"]})
            handler = load_handler(code_dir, properties["Handler"], logical_id)
            timeout = float(properties.get("Timeout", 3))
            memory = int(self.resolve(properties.get("MemorySize", 128)))
            (architecture,) = properties.get("Architectures", ["x86_64"])
            self.functions[logical_id] = LocalFunction(
                logical_id, name, arn, handler, timeout, memory, architecture
            )

    def _start_sandboxes(self, template: dict[str, Any]) -> None:
        """Executors run in processes of their own, under Lambda's limits
        (`tocsin.local.sandbox`); they reach moto's services here and the DynamoDB process
        over HTTPS, as an executor reaches AWS (`tocsin.local.tls`)."""
        from tocsin import aws
        from tocsin.local import moto_endpoint, sandbox, tls

        authority = tls.authority()
        moto = moto_endpoint.serving_moto(authority.server_context())
        self.moto_endpoint = self._exits.enter_context(moto)
        dynamodb = self._exits.enter_context(tls.terminating(self.dynamodb.wait_until_ready()))
        environment = dict(os.environ) | authority.client_environment()
        environment.pop(aws.TARGET_ENDPOINT)  # theirs is AWS_ENDPOINT_URL, over TLS
        environment |= {
            "AWS_ENDPOINT_URL": self.moto_endpoint.url,
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb,
        }
        self.sandboxes = sandbox.Pool(self._cgroup_bases, environment)
        self._exits.callback(self.sandboxes.close)
        for logical_id, code_dir in self._code_dirs.items():
            if not logical_id.endswith("ExecutorFunction"):
                continue
            function = self.functions[logical_id]
            handler = template["Resources"][logical_id]["Properties"]["Handler"]
            self._sandboxed[logical_id] = sandbox.FunctionSpec(
                logical_id,
                function.name,
                function.arn,
                str(code_dir),
                handler,
                function.timeout_s,
                function.memory_mb,
            )
        sizes = sorted({spec.memory_mb for spec in self._sandboxed.values()})
        shares = tuple(size / sandbox.MB_PER_CORE for size in sizes)
        self.calibration = sandbox.calibrate(self._cgroup_bases, shares)
        for size, figures in zip(sizes, self.calibration, strict=True):
            figures["memory_mb"] = size

    def sandbox_report(self) -> list[str]:
        """What the sandboxes give each executor and the CPU share a busy loop measured in
        one (the machine's other work can only lower it); nothing without them."""
        return [
            f"executors in Lambda-sized sandboxes: {f['memory_mb']} MB, a CPU share of "
            f"{f['given']:.3f} of a core given, {f['measured']:.3f} measured"
            for f in self.calibration
        ]

    def _create_state_machine(self, template: dict[str, Any]) -> None:
        """Create the task machine where moto executes it, its placeholders resolved.

        moto's CloudFormation puts state machines in the non-executing backend; this creates
        the same name (so the same ARN every reference resolved to) in the executing one.
        """
        import boto3

        properties = template["Resources"]["TaskStateMachine"]["Properties"]
        definition = self.resolve(properties["DefinitionString"])
        for key, value in self._substitutions.items():
            definition = definition.replace("${" + key + "}", str(self.resolve(value)))
        arn = self.resolve({"Ref": "TaskStateMachine"})
        self.definition = definition
        boto3.client("stepfunctions").create_state_machine(
            name=arn.rsplit(":", 1)[1],
            definition=definition,
            roleArn=self.resolve(properties["RoleArn"]),
            type=properties.get("StateMachineType", "STANDARD"),
        )

    # -- moto seams --------------------------------------------------------------------------

    def _move_tables(self) -> None:
        """The stack's tables, as moto's CloudFormation made them here, are made again in the
        DynamoDB process; from now on every client in this process goes there, unsigned."""
        import boto3

        here = boto3.client("dynamodb")
        names = here.list_tables()["TableNames"]
        tables = [here.describe_table(TableName=name)["Table"] for name in names]
        endpoint = self.dynamodb.wait_until_ready()
        self.dynamodb.create_tables(tables)
        environment = {"AWS_ENDPOINT_URL_DYNAMODB": endpoint}
        self._exits.enter_context(mock.patch.dict(os.environ, environment))
        if isinstance(self.dynamodb, DynamoDBProcess):  # DynamoDB Local wants a signature
            self._before_dynamodb_calls(unsigned_to(endpoint))
        self._forget_process_caches()

    @staticmethod
    def _unhook_schedule_rules() -> None:
        """moto matches every PutEvents event against schedule rules too, and cannot deliver
        to their Lambda targets; the ticker plays the schedules here, so they lose targets."""
        from tocsin import aws

        events = aws.client("events")
        for rule in events.list_rules()["Rules"]:
            if rule.get("ScheduleExpression"):
                targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
                events.remove_targets(Rule=rule["Name"], Ids=[t["Id"] for t in targets])

    def _patch_backends(self) -> None:
        self._exits.enter_context(moto_patches.json_template_bodies())
        self._exits.enter_context(moto_patches.step_functions_patches(self._route_invoke))
        self._print_no_full_metric_sets()

    def _put_gates_first(self) -> None:
        """DynamoDB calls wait while a gate is about to let go (`tocsin.local.gates_first`);
        the hook is on boto3's default session, so every client made from now on has it."""
        from tocsin import gate

        first = self._gates_first
        self._exits.enter_context(
            mock.patch.object(gate, "wait_until", first.gate(gate.wait_until))
        )
        self._before_dynamodb_calls(first.yield_to_gates)

    def _before_dynamodb_calls(self, hook: Callable[..., None]) -> None:
        """`hook` on every DynamoDB call of a client made from now on (on boto3's default
        session), until the stop."""
        import boto3

        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        events = boto3.DEFAULT_SESSION.events
        events.register("before-call.dynamodb", hook)
        self._exits.callback(events.unregister, "before-call.dynamodb", hook)

    def _print_no_full_metric_sets(self) -> None:
        """Powertools prints a metric set as soon as one metric holds 100 values, even with
        metrics disabled (on AWS that is EMF going to CloudWatch): an executor whose batch
        holds more tasks would write it over the CLI's output. While metrics are disabled
        (the runtime's default: no CloudWatch here), its prints are dropped."""
        import builtins

        from aws_lambda_powertools.metrics.provider.cloudwatch_emf import cloudwatch

        def print_if_enabled(*args: Any, **kwargs: Any) -> None:
            if not cloudwatch.is_metrics_disabled():
                builtins.print(*args, **kwargs)

        self._exits.enter_context(
            mock.patch.object(cloudwatch, "print", print_if_enabled, create=True)
        )

    def _route_invoke(self, name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        """Run the function an execution invokes, as Lambda would: an exception is a function
        error named by its type, and an invocation past the function's timeout answers
        `Sandbox.Timedout` (Lambda then kills the sandbox; a thread cannot be killed, so
        here it runs on, and its writes land late, like a slow one's)."""
        event = json.loads(body) if body else {}
        function = next((f for f in self.functions.values() if f.name == name), None)
        if function is None:  # a user's target function: record what it was sent
            self.foreign_invocations.append((name, event))
            return b""
        with self._invocations_done:
            self._invoking += 1
        answer: list[tuple[bytes, bool]] = []  # the payload, and whether it is an error

        def run() -> None:
            try:
                result = self.invoke(function.logical_id, event)
                answer.append((json.dumps(result).encode(), False))
            except Exception as error:
                name = getattr(error, "error_type", type(error).__name__)
                answer.append((_function_error(name, str(error)), True))
            finally:
                with self._invocations_done:
                    self._invoking -= 1
                    self._invocations_done.notify_all()

        invocation = threading.Thread(target=run, name=f"invoke-{function.logical_id}")
        invocation.start()
        # A sandbox kills its child at the timeout (counted after a cold start's init, as
        # Lambda counts it) and answers Sandbox.Timedout itself.
        sandboxed = function.logical_id in self._sandboxed
        invocation.join(function.timeout_s + (15.0 if sandboxed else 0.0))
        if not answer:
            timed_out = f"Task timed out after {function.timeout_s:.2f} seconds"
            answer.append((_function_error("Sandbox.Timedout", timed_out), True))
        payload, failed = answer[0]
        if failed:
            response_headers["x-amz-function-error"] = "Unhandled"
        return payload

    def _drain_invocations(self, timeout_s: float) -> None:
        """Wait for the invocations under way to end: no thread of this runtime then reaches
        the services after they are gone (or the next runtime's), and what they did is
        saved with the rest. Their stopped executions take no further step."""
        with self._invocations_done:
            if not self._invocations_done.wait_for(lambda: self._invoking == 0, timeout_s):
                log.warning("%d invocations still running at the stop", self._invoking)

    def _sfn_backend(self) -> Any:
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        return stepfunctions_parser_backends[ACCOUNT_ID][REGION]

    def _stop_executions(self) -> None:
        """Interrupt running executions so no thread outlives the mocked services."""
        for execution in self.executions():
            if execution.status == "RUNNING":
                try:
                    self._sfn_backend().stop_execution(execution.execution_arn)
                except Exception as error:  # already finishing
                    log.debug("stop %s: %s", execution.execution_arn, error)

    def _tick(self) -> None:
        """The finder at a fixed rate, as EventBridge's rule runs it: every interval from
        the last start, not an interval after each run ends (a busy run of 7 s then made a
        period of 12 s, and the look-ahead's margin too short: tasks started after their
        wake fired seconds late). A run longer than the interval is followed at once."""
        assert self.finder_interval_s
        next_start = time.monotonic() + self.finder_interval_s
        while not self._stop.wait(max(0.0, next_start - time.monotonic())):
            next_start += self.finder_interval_s
            try:
                self.run_finder()
            except Exception:
                log.exception("finder run failed")
            next_start = max(next_start, time.monotonic())

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.poll_queues()
            except Exception:
                log.exception("queue poll failed")
                busy = 0
            self._stop.wait(0 if busy else QUEUE_POLL_INTERVAL_S)

    @staticmethod
    def _forget_process_caches() -> None:
        from tocsin import aws
        from tocsin.settings import settings

        settings.cache_clear()
        aws.forget_clients()


def scheduled_event() -> dict[str, Any]:
    """The event an EventBridge schedule sends the finder."""
    from tocsin import clock

    return {
        "version": "0",
        "id": "local-finder-tick",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT_ID,
        "time": clock.to_iso_second(clock.now_ms()),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT_ID}:rule/local-finder"],
        "detail": {},
    }


def _function_error(error_type: str, message: str) -> bytes:
    """A function error's payload, as Lambda answers it to Step Functions."""
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()
