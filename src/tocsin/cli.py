"""The `tocsin` command."""

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tocsin.measure.cost import Pricing

RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
SECONDS_PER_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


TAGS_HELP = 'tags, JSON: {"user": "42", "kind": "reminder"}'
RETRY_HELP = (
    'how a failing target is tried again, JSON: {"max_attempts": 25, "max_age_s": 86400, '
    '"min_backoff_s": 1, "max_backoff_s": 3600}'
)


def _demo(args: argparse.Namespace) -> int:
    from tocsin.measure import demo

    options = demo.DemoOptions(
        tasks=args.tasks,
        spread_s=args.spread,
        seed=args.seed,
        lookahead_s=args.lookahead,
        finder_interval_s=args.finder_interval,
        tables=args.tables,
        lambda_limits=args.lambda_limits,
    )
    return demo.main(options, args.json)


def _invoke(args: argparse.Namespace) -> int:
    """What `sam local invoke` does, without Docker: one function of template.yaml, in-process."""
    from tocsin.local.runtime import EmbeddedRuntime

    event = json.loads(Path(args.event).read_text()) if args.event else {}
    with EmbeddedRuntime(finder_interval_s=None) as runtime:
        if args.function not in runtime.functions:
            names = ", ".join(sorted(runtime.functions))
            print(
                f"no function {args.function!r} in template.yaml; there are: {names}",
                file=sys.stderr,
            )
            return 2
        try:
            result = runtime.invoke(args.function, event)
        except Exception as error:
            print(json.dumps({"errorType": type(error).__name__, "errorMessage": str(error)}))
            return 1
    print(json.dumps(result, indent=2, default=str))
    return 0


def _asl(args: argparse.Namespace) -> int:
    """The task state machine as the embedded runtime created it, substitutions applied."""
    import boto3

    from tocsin.local.runtime import EmbeddedRuntime

    with EmbeddedRuntime(finder_interval_s=None) as runtime:
        sfn = boto3.client("stepfunctions")
        definition = sfn.describe_state_machine(stateMachineArn=runtime.state_machine_arn)
    print(json.dumps(json.loads(definition["definition"]), indent=2))
    return 0


def _openapi(args: argparse.Namespace) -> int:
    """The document docs/openapi.json keeps: `tocsin openapi > docs/openapi.json`."""
    from tocsin.api import openapi_document

    print(json.dumps(openapi_document(), indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    """The task API on 127.0.0.1 over the embedded runtime, until Ctrl-C."""
    import logging

    from tocsin.local.runtime import EmbeddedRuntime
    from tocsin.local.server import serving
    from tocsin.local.state import StateFileError

    # A failed task shows as FAILED, with its error, in the API: not as moto's traceback.
    logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
    parameters = {"LookAheadSeconds": str(args.lookahead)}
    if args.allow_host:
        parameters["WebhookAllowedHosts"] = ",".join(args.allow_host)
    given = _template_parameters(args.parameter or [])
    if isinstance(given, str):
        print(f"error: --parameter: {given}", file=sys.stderr)
        return 2
    parameters |= given
    runtime = EmbeddedRuntime(
        parameters,
        finder_interval_s=args.finder_interval,
        state_file=args.state,
        tables=args.tables,
        lambda_limits=args.lambda_limits,
    )
    with ExitStack() as running:
        try:
            running.enter_context(runtime)
        except StateFileError as error:  # the file is left as it was
            print(f"error: --state: {error}", file=sys.stderr)
            return 2
        url = running.enter_context(serving(runtime, args.port, args.principal))
        try:  # from the first line printed: a Ctrl-C as soon as it is read stops it
            print(f"Tocsin API on {url} (caller: X-Tocsin-Principal header). Ctrl-C stops.")
            print(f"  the console: {url}/ (acting as {args.principal})")
            for line in runtime.sandbox_report():
                print(f"  {line}")
            print(f"  its OpenAPI document: {url}/openapi.json, Swagger UI: {url}/swagger")
            if args.state:
                requeued = len(runtime.requeued)
                print(f"  state in {args.state}, saved at the stop ({requeued} tasks requeued)")
            allowed = ", ".join(args.allow_host or []) or "none"
            print(f"  webhooks to internal addresses allowed for: {allowed} (--allow-host)")
            if given:
                print(f"  template parameters: {', '.join(args.parameter)} (--parameter)")
            print(f"  export TOCSIN_URL={url}", flush=True)
            until_interrupted()
        except KeyboardInterrupt:
            print("stopping")
    return 0


def _console(args: argparse.Namespace) -> int:
    """The console on 127.0.0.1 against a deployed stack's API, until Ctrl-C."""

    from botocore.exceptions import BotoCoreError, ClientError

    from tocsin.client import ApiError
    from tocsin.console.guard import new_token
    from tocsin.console.remote import caller_arn, signed_upstream, stack_api_url
    from tocsin.console.server import serving_console

    try:
        api_url = args.api_url or stack_api_url(args.stack, args.region)
        upstream = signed_upstream(api_url, args.region)
    except (ValueError, BotoCoreError, ClientError, ApiError) as error:
        print(f"error: {'--api-url' if args.api_url else '--stack'}: {error}", file=sys.stderr)
        return 2
    session = {"principal": caller_arn(args.region), "api": api_url}
    with serving_console(upstream, session, args.port, token=new_token()) as url:
        try:  # from the first line printed: a Ctrl-C as soon as it is read stops it
            print(f"Tocsin console for {api_url}, as {session['principal']}. Ctrl-C stops.")
            print(f"  open {url}", flush=True)
            print("  (its token is printed only here; the page keeps it in a cookie)", flush=True)
            until_interrupted()
        except KeyboardInterrupt:
            print("stopping")
    return 0


def allowed_host(text: str) -> str:
    """`--allow-host`: a host name or address, with an optional port, in the form
    WebhookAllowedHosts takes (an IPv6 address goes without a port)."""
    host, colon, port = text.lower().rpartition(":")
    if not colon or ":" in host:  # no port, or an IPv6 address
        host, port = text.lower(), ""
    from tocsin.targets.address_guard import literal_address

    address = literal_address(host)
    host = str(address) if address else host
    if not (address or HOST_NAME.fullmatch(host)) or (
        port and not (port.isdigit() and 0 < int(port) < 65536)
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST or HOST:PORT")
    return f"{host}:{port}" if port else host


def when(text: str) -> dict[str, Any]:
    """`--at`: `+90s`, `+2h`, `+1500ms` become a delay; ISO-8601 with a zone, a due_at."""
    relative = RELATIVE.match(text)
    if relative:
        return {"delay": float(relative[1]) * SECONDS_PER_UNIT[relative[2]]}
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        message = f"{text!r} is neither +<n><ms|s|m|h|d> nor ISO-8601"
        raise argparse.ArgumentTypeError(message) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no timezone (add Z or +01:00)")
    return {"due_at": moment}


def json_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None


def _api_command(args: argparse.Namespace) -> int:
    """The task and schedule commands: one API call each, printed for people or --json."""
    from tocsin.client import ApiError, Client
    from tocsin.terminal import print_held, print_page, print_schedules, print_task

    if not args.url:
        print("error: give --url or set TOCSIN_URL (tocsin serve prints it)", file=sys.stderr)
        return 2
    client = Client(args.url, principal=args.principal)
    try:
        result = args.call(client, args)
    except ApiError as error:
        where = f" (field: {error.field})" if error.field else ""
        print(f"error: {error.status} {error.code}: {error.message}{where}", file=sys.stderr)
        return 1
    if result is None:  # the command declined, and said why
        return 1
    if isinstance(result, list):  # upcoming occurrences
        moments = [moment.isoformat(timespec="milliseconds") for moment in result]
        print(json.dumps(moments) if args.json else "\n".join(moments))
    elif args.json:
        print(result.model_dump_json())
    elif hasattr(result, "tasks"):
        print_page(result)
    elif hasattr(result, "schedules"):
        print_schedules(result)
    elif hasattr(result, "held"):
        print_held(result)
    else:  # a task, or a bulk action's job: its fields
        print_task(result)
    return 0


def _submit_call(client: Any, args: argparse.Namespace) -> Any:
    return client.submit(
        type=args.type,
        target=args.target,
        payload=args.payload,
        id=args.id,
        max_attempts=args.max_attempts,
        retry=args.retry,
        tags=args.tags,
        on_success=args.on_success,
        on_failure=args.on_failure,
        flow=args.flow,
        **args.at,
    )


def _list_call(client: Any, args: argparse.Namespace) -> Any:
    return client.list(
        status=args.status,
        schedule=args.schedule,
        due_before=args.due_before,
        due_after=args.due_after,
        limit=args.limit,
        next=args.next,
        tags=args.tags,
    )


def _reschedule_call(client: Any, args: argparse.Namespace) -> Any:
    changes = dict(args.at or {})
    if args.payload is not None:
        changes["payload"] = args.payload
    return client.reschedule(args.task_id, **changes)


# A cancel that matches more tasks than this is asked about first (or given --yes).
HANDFUL = 5
BULK_POLL_S = 1.0


def _bulk_call(client: Any, args: argparse.Namespace) -> Any:
    """A bulk action, followed to its end with its progress on stderr. A cancel of more than
    a handful is counted first (a dry run) and goes ahead once confirmed."""
    asked = {
        "tags": args.tags,
        "status": args.status,
        "due_before": args.due_before,
        "due_after": args.due_after,
    }
    if args.action == "cancel" and not (args.dry_run or args.yes):
        counted = _followed(client, client.bulk("cancel", **asked, dry_run=True))
        if counted.matched > HANDFUL and not _confirmed(counted.matched, args.tags):
            print("nothing cancelled", file=sys.stderr)
            return None
    job = client.bulk(args.action, **asked, dry_run=args.dry_run, client_token=args.token)
    return _followed(client, job)


def _followed(client: Any, job: Any) -> Any:
    while job.state != "DONE":
        print(f"{job.action}: matched {job.matched}, done {job.done}", file=sys.stderr)
        time.sleep(BULK_POLL_S)
        job = client.bulk_progress(job.bulk_id)
    return job


def _confirmed(matched: int, tags: dict[str, str] | None) -> bool:
    schedules = " and the schedules carrying its tags" if tags else ""
    if not sys.stdin.isatty():
        print(f"{matched} tasks match: give --yes to cancel them", file=sys.stderr)
        return False
    answer = input(f"Cancel {matched} tasks{schedules}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _retry_and_tags(command: argparse.ArgumentParser) -> None:
    """The options a task and a schedule (for its occurrences) share: how a failing target
    is tried again, and the tags."""
    command.add_argument("--max-attempts", type=int, help="delivery attempts, 1-185 (25)")
    command.add_argument("--retry", type=json_argument, help=RETRY_HELP)
    command.add_argument("--tags", type=json_argument, help=TAGS_HELP)


def _add_task_commands(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("TOCSIN_URL"), help="API base URL")
    common.add_argument(
        "--principal",
        default=os.environ.get("TOCSIN_PRINCIPAL"),
        help="caller for `tocsin serve` (unsigned); leave out to sign with AWS credentials",
    )
    common.add_argument("--json", action="store_true", help="print the reply as JSON")

    submit = commands.add_parser("submit", parents=[common], help="schedule a task")
    submit.add_argument("--type", required=True, help="webhook, lambda, eventbridge, sqs, ...")
    submit.add_argument("--target", required=True, type=json_argument, help="target, JSON")
    submit.add_argument("--payload", type=json_argument, default=None, help="payload, JSON")
    submit.add_argument("--at", required=True, type=when, help="+90s, +2h or ISO-8601 with zone")
    submit.add_argument("--id", help="your id for the task (made up if left out)")
    _retry_and_tags(submit)
    for outcome in ("success", "failure"):
        submit.add_argument(
            f"--on-{outcome}",
            type=json_argument,
            help=f'told the outcome on {outcome}, JSON: {{"type": "webhook", "target": {{...}}}}',
        )
    submit.add_argument(
        "--flow",
        type=json_argument,
        help='limits shared with the key\'s tasks, JSON: {"key": "api.example.com", "rate": 50, '
        '"parallelism": 5}',
    )
    submit.set_defaults(run=_api_command, call=_submit_call)

    get = commands.add_parser("get", parents=[common], help="show a task")
    get.add_argument("task_id")
    get.set_defaults(run=_api_command, call=lambda client, args: client.get(args.task_id))

    listing = commands.add_parser("list", parents=[common], help="list your tasks")
    listing.add_argument(
        "--status", help="PENDING, RUNNING, RETRYING, SUCCEEDED, FAILED or CANCELLED"
    )
    listing.add_argument("--schedule", help="only this schedule's occurrences")
    listing.add_argument("--tags", type=json_argument, help="only tasks carrying each, JSON")
    listing.add_argument("--due-before", help="ISO-8601 time")
    listing.add_argument("--due-after", help="ISO-8601 time")
    listing.add_argument("--limit", type=int, help="tasks per page, 1-100 (50)")
    listing.add_argument("--next", help="the token printed under the previous page")
    listing.set_defaults(run=_api_command, call=_list_call)

    cancel = commands.add_parser("cancel", parents=[common], help="cancel a task not yet fired")
    cancel.add_argument("task_id")
    cancel.set_defaults(run=_api_command, call=lambda client, args: client.cancel(args.task_id))

    bulk = commands.add_parser(
        "bulk", parents=[common], help="cancel or retry every task a filter matches"
    )
    bulk.add_argument("action", choices=["cancel", "retry"])
    bulk.add_argument("--tags", type=json_argument, help="tasks carrying each, JSON")
    bulk.add_argument("--status", action="append", help="PENDING, RETRYING or FAILED (repeat)")
    bulk.add_argument("--due-before", help="ISO-8601 time")
    bulk.add_argument("--due-after", help="ISO-8601 time")
    bulk.add_argument("--dry-run", action="store_true", help="count the matches, act on none")
    bulk.add_argument("--yes", action="store_true", help="cancel without asking")
    bulk.add_argument("--token", help="a client token: the same one again is the same job")
    bulk.set_defaults(run=_api_command, call=_bulk_call)

    targets = commands.add_parser(
        "targets", parents=[common], help="your hosts held back for failing (GET /targets)"
    )
    targets.set_defaults(run=_api_command, call=lambda client, args: client.targets())

    reschedule = commands.add_parser(
        "reschedule", parents=[common], help="move a task not yet fired, or change its payload"
    )
    reschedule.add_argument("task_id")
    reschedule.add_argument("--at", type=when, help="+90s, +2h or ISO-8601 with zone")
    reschedule.add_argument("--payload", type=json_argument, help="new payload, JSON")
    reschedule.set_defaults(run=_api_command, call=_reschedule_call)

    schedule = commands.add_parser("schedule", help="recurring schedules: cron, rate and at")
    _add_schedule_commands(schedule.add_subparsers(dest="action", required=True), common)


def _schedule_fields(command: argparse.ArgumentParser, creating: bool) -> None:
    """The options that describe a schedule; required ones only when `creating`."""
    command.add_argument(
        "--expression",
        required=creating,
        help="cron(0 9 ? * MON-FRI *), rate(10 seconds) or at(2027-01-01T09:00:00)",
    )
    command.add_argument("--timezone", help="an IANA time zone (UTC)")
    command.add_argument("--start-at", help="ISO-8601 with zone: no occurrence before")
    command.add_argument("--end-at", help="ISO-8601 with zone: no occurrence from then on")
    command.add_argument("--type", required=creating, help="webhook, lambda, eventbridge, ...")
    command.add_argument("--target", required=creating, type=json_argument, help="JSON")
    command.add_argument("--payload", type=json_argument, help="payload of each occurrence, JSON")
    _retry_and_tags(command)
    command.add_argument("--catch-up", choices=["skip", "latest"], help="missed occurrences")


def _schedule_changes(args: argparse.Namespace) -> dict[str, Any]:
    names = ("expression", "timezone", "start_at", "end_at", "type", "target", "payload")
    more = ("max_attempts", "retry", "tags", "catch_up")
    given = {name: getattr(args, name) for name in (*names, *more)}
    return {name: value for name, value in given.items() if value is not None}


def _add_schedule_commands(actions: Any, common: argparse.ArgumentParser) -> None:
    def one(client: Any, args: argparse.Namespace, method: str) -> Any:
        return getattr(client, method)(args.schedule_id)

    create = actions.add_parser("create", parents=[common], help="create a schedule")
    create.add_argument("--id", help="your id for the schedule (made up if left out)")
    _schedule_fields(create, creating=True)
    create.set_defaults(
        run=_api_command,
        call=lambda client, args: client.create_schedule(id=args.id, **_schedule_changes(args)),
    )
    update = actions.add_parser("update", parents=[common], help="change a schedule")
    update.add_argument("schedule_id")
    _schedule_fields(update, creating=False)
    update.set_defaults(
        run=_api_command,
        call=lambda client, args: client.update_schedule(
            args.schedule_id, **_schedule_changes(args)
        ),
    )
    for action, method, text in (
        ("get", "get_schedule", "show a schedule"),
        ("pause", "pause_schedule", "stop making occurrences (pending ones are cancelled)"),
        ("resume", "resume_schedule", "go on from now"),
        ("delete", "delete_schedule", "delete a schedule, cancel its pending occurrences"),
    ):
        command = actions.add_parser(action, parents=[common], help=text)
        command.add_argument("schedule_id")
        command.set_defaults(run=_api_command, call=partial(one, method=method))
    upcoming = actions.add_parser("upcoming", parents=[common], help="the next occurrences")
    upcoming.add_argument("schedule_id")
    upcoming.add_argument("--count", type=int, default=10, help="how many, 1-100 (10)")
    upcoming.set_defaults(
        run=_api_command, call=lambda client, args: client.upcoming(args.schedule_id, args.count)
    )
    listing = actions.add_parser("list", parents=[common], help="list your schedules")
    listing.add_argument("--limit", type=int, help="schedules per page, 1-100 (50)")
    listing.add_argument("--next", help="the token printed under the previous page")
    listing.set_defaults(
        run=_api_command,
        call=lambda client, args: client.list_schedules(limit=args.limit, next=args.next),
    )


def _redrive(args: argparse.Namespace) -> int:
    """FAILED tasks on a stack's dead-letter queue back to PENDING as their next version."""
    import boto3

    from tocsin.redrive import redrive
    from tocsin.settings import Settings
    from tocsin.terminal import print_redrive

    stack = boto3.client("cloudformation").describe_stacks(StackName=args.stack)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    config = Settings(
        TASKS_TABLE=outputs["TasksTableName"], STATE_MACHINE_ARN=outputs["StateMachineArn"]
    )
    report = redrive(outputs["DeadLetterQueueUrl"], config, dry_run=args.dry_run)
    if args.json:
        print(json.dumps({"outcomes": dict(report.outcomes), "tasks": report.tasks}))
    else:
        print_redrive(report)
    return 0


def _scenario_names(given: str | None, default: list[str], known: list[str]) -> list[str] | None:
    """`--scenarios` as a list (`default` when not given); None, said on stderr, if unknown."""
    names = given.split(",") if given else default
    unknown = sorted(set(names) - set(known))
    if unknown:
        there_are = ", ".join(known)
        print(f"unknown scenario {', '.join(unknown)}; there are: {there_are}", file=sys.stderr)
        return None
    return names


def _chaos(args: argparse.Namespace) -> int:
    from tocsin.measure import chaos

    known = list(chaos.SCENARIOS)
    runnable = [n for n in known if args.lambda_limits or n not in chaos.SANDBOXED]
    names = _scenario_names(args.scenarios, runnable, known)
    if names is None:
        return 2
    if not args.lambda_limits and (sandboxed := sorted(set(names) & chaos.SANDBOXED)):
        print(f"{', '.join(sandboxed)} kills sandboxes: add --lambda-limits", file=sys.stderr)
        return 2
    return chaos.main(names, args.tasks, args.seed, args.json, args.lambda_limits)


def _bench(args: argparse.Namespace) -> int:
    from tocsin.measure import bench

    known = [*bench.SCENARIOS, *bench.STRETCH]
    names = _scenario_names(args.scenarios, list(bench.SCENARIOS), known)
    if names is None:
        return 2
    if args.cost and args.tables != "moto":
        print("error: --cost: write units are metered by the moto tables only", file=sys.stderr)
        return 2
    pricing = _pricing(args)
    if isinstance(pricing, str):
        print(f"error: {pricing}", file=sys.stderr)
        return 2
    parameters = _template_parameters(args.parameter or [])
    if isinstance(parameters, str):
        print(f"error: --parameter: {parameters}", file=sys.stderr)
        return 2
    return bench.main(
        names, args.scale, args.seed, args.json, args.plot, pricing, args.tables,
        args.lambda_limits, parameters,
    )  # fmt: skip


def _template_parameters(given: list[str]) -> "dict[str, str] | str":
    """`NAME=VALUE` pairs as template parameters; a refusal as text: a name the template
    does not declare, or a value its declaration does not allow."""
    from tocsin.local.stack import project_template

    declared = project_template()["Parameters"]
    parameters = {}
    for pair in given:
        name, equals, value = pair.partition("=")
        if not equals or name not in declared:
            return f"{pair!r}: give NAME=VALUE, NAME one of the template's parameters"
        if refused := _refusal(declared[name], value):
            return f"{name}={value}: {refused}"
        parameters[name] = value
    return parameters


def _refusal(declaration: dict[str, Any], value: str) -> str | None:
    """Why a template parameter declared so cannot take `value` (CloudFormation's own
    checks: a Number's bounds, the allowed values), or None."""
    allowed = [str(choice) for choice in declaration.get("AllowedValues", [])]
    if allowed and value not in allowed:
        return f"one of {', '.join(allowed)}"
    if declaration["Type"] != "Number":
        return None
    low, high = declaration.get("MinValue", 0), declaration.get("MaxValue")
    if not value.isdigit() or int(value) < low or (high is not None and int(value) > high):
        return f"a whole number from {low}" + (f" to {high}" if high is not None else " up")
    return None


def _pricing(args: argparse.Namespace) -> "Pricing | str | None":
    """The bench's pricing from --cost, --billing and --utilization; a refusal as text."""
    from tocsin.measure.cost import Pricing

    if not args.cost:
        given = args.billing or args.utilization is not None
        return "--billing and --utilization price a run: add --cost" if given else None
    if args.utilization is not None and args.billing != "provisioned":
        return "--utilization: only provisioned capacity has one (add --billing provisioned)"
    utilization = 70.0 if args.utilization is None else args.utilization
    if not 20 <= utilization <= 90:
        return f"--utilization {utilization:g}: Application Auto Scaling targets 20 to 90 %"
    return Pricing(args.billing or "on-demand", utilization / 100)


def _lambda_limits_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--lambda-limits",
        action="store_true",
        help="run each executor invocation in a process limited as Lambda limits it: a CPU "
        "share of MemorySize / 1,769 of a core, a memory cap, its Timeout (Linux cgroups, root)",
    )


def _parameter_option(command: argparse.ArgumentParser, help_text: str) -> None:
    command.add_argument("--parameter", action="append", metavar="NAME=VALUE", help=help_text)


def _tables_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--tables",
        choices=("moto", "dynamodb-local"),
        default="moto",
        help="where the local tables live: moto's (default: metered, with faults to inject) or "
        "DynamoDB Local, AWS's own engine (make dynamodb-local installs it; needs Java)",
    )


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="tocsin", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="fire many webhook tasks locally and time them")
    demo.add_argument("--tasks", type=int, default=200, help="how many tasks (default 200)")
    demo.add_argument("--spread", type=float, default=60.0, help="seconds they are spread over")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON, last line")
    demo.add_argument("--seed", type=int, default=None, help="random seed for the due times")
    demo.add_argument("--lookahead", type=int, default=20, help="finder look-ahead, s (20)")
    demo.add_argument("--finder-interval", type=float, default=5.0, help="finder ticker, s (5)")
    _tables_option(demo)
    _lambda_limits_option(demo)
    demo.set_defaults(run=_demo)

    invoke = commands.add_parser("invoke", help="run one function of template.yaml on an event")
    invoke.add_argument("function", help="the function's logical id, e.g. FinderFunction")
    invoke.add_argument("--event", "-e", help="a JSON event file (events/ has samples)")
    invoke.set_defaults(run=_invoke)

    asl = commands.add_parser("asl", help="print the task state machine with substitutions")
    asl.set_defaults(run=_asl)

    openapi = commands.add_parser("openapi", help="print the API's OpenAPI document")
    openapi.set_defaults(run=_openapi)

    serve = commands.add_parser("serve", help="serve the task API locally, tasks fire for real")
    serve.add_argument(
        "--port", type=int, default=8765, help="port on 127.0.0.1 (8765; 0 picks a free one)"
    )
    serve.add_argument("--lookahead", type=int, default=20, help="finder look-ahead, s (20)")
    serve.add_argument("--finder-interval", type=float, default=5.0, help="finder ticker, s (5)")
    serve.add_argument(
        "--state",
        type=Path,
        help="keep tasks across restarts in this file (restored at start, saved at stop)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        type=allowed_host,
        metavar="HOST[:PORT]",
        help="let webhooks reach this internal host (any port, or only PORT); repeatable",
    )
    serve.add_argument(
        "--principal",
        default="local-user",
        help="the caller of requests that name none, the console's (local-user)",
    )
    _parameter_option(
        serve,
        "a template parameter, as sam deploy's --parameter-overrides sets it (repeatable; "
        "e.g. HostFlowRate=50 for at most 50 webhook sends a second to each host)",
    )
    _tables_option(serve)
    _lambda_limits_option(serve)
    serve.set_defaults(run=_serve)

    console = commands.add_parser(
        "console", help="the console on 127.0.0.1 against a deployed stack, calls signed here"
    )
    where = console.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="the deployed stack's name (its ApiUrl output)")
    where.add_argument("--api-url", help="the API's URL, https://....execute-api....")
    console.add_argument("--region", help="the stack's region (default: your AWS config's)")
    console.add_argument(
        "--port", type=int, default=8766, help="port on 127.0.0.1 (8766; 0 picks a free one)"
    )
    console.set_defaults(run=_console)

    chaos = commands.add_parser("chaos", help="inject faults locally, then judge every task")
    chaos.add_argument("--scenarios", help="comma-separated scenario names (default: all)")
    chaos.add_argument("--tasks", type=int, default=200, help="tasks per scenario (200)")
    chaos.add_argument("--seed", type=int, default=7, help="random seed (7)")
    chaos.add_argument("--json", action="store_true", help="print the results as JSON, last line")
    _lambda_limits_option(chaos)
    chaos.set_defaults(run=_chaos)

    bench = commands.add_parser("bench", help="measure precision and throughput locally")
    bench.add_argument(
        "--scenarios",
        help="comma-separated: sparse, spread, dense, burst, recurring, flow, retried, "
        "finder-scale, throttled, cold-start (all); burst-1000, burst-5000, aws-burst, lambda",
    )
    bench.add_argument("--scale", type=float, default=1.0, help="fraction of the full sizes (1)")
    bench.add_argument("--seed", type=int, default=7, help="random seed (7)")
    bench.add_argument("--json", action="store_true", help="print the results as JSON, last line")
    bench.add_argument("--plot", metavar="FILE.png", help="draw lateness histograms to this file")
    bench.add_argument("--cost", action="store_true", help="count billed usage, price it")
    bench.add_argument(
        "--billing",
        choices=["on-demand", "provisioned"],
        help="price DynamoDB on demand (the default) or as provisioned capacity",
    )
    bench.add_argument(
        "--utilization",
        type=float,
        metavar="PERCENT",
        help="with --billing provisioned: the share of capacity a steady load uses (70)",
    )
    _parameter_option(
        bench,
        "a template parameter for every runtime of the run, over the scenario's own "
        "(repeatable; e.g. BurstSendsPerInvocation=30)",
    )
    _tables_option(bench)
    _lambda_limits_option(bench)
    bench.set_defaults(run=_bench)

    redrive = commands.add_parser(
        "redrive", help="FAILED tasks on the dead-letter queue back to PENDING, next version"
    )
    redrive.add_argument("--stack", required=True, help="the deployed stack's name")
    redrive.add_argument("--dry-run", action="store_true", help="report, change nothing")
    redrive.add_argument("--json", action="store_true", help="print the report as JSON")
    redrive.set_defaults(run=_redrive)

    _add_task_commands(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "demo" and (args.tasks < 1 or args.spread <= 0):
        parser().error("--tasks >= 1 and --spread > 0")
    if args.command in ("demo", "serve") and not 0 < 2 * args.finder_interval < args.lookahead:
        # as on AWS (LookAheadSeconds): a task is still found when one finder run is missed
        parser().error("--lookahead must exceed two --finder-interval (both > 0)")
    if args.command == "bench" and not 0 < args.scale <= 1:
        parser().error("--scale: a fraction in (0, 1]")
    if args.command == "bench" and args.plot:
        plot = Path(args.plot)
        if plot.suffix not in (".png", ".svg", ".pdf") or not plot.parent.is_dir():
            parser().error(f"--plot: {plot} must be a .png, .svg or .pdf in an existing folder")
    if args.command == "chaos" and args.tasks < 5:
        parser().error("--tasks: at least 5 per scenario (the scenarios split them in fifths)")
    if args.command == "reschedule" and args.at is None and args.payload is None:
        parser().error("reschedule needs --at, --payload or both")
    if args.command == "schedule" and args.action == "update" and not _schedule_changes(args):
        parser().error("schedule update needs at least one option to change")
    from tocsin.local.sandbox import LimitsUnavailable

    try:
        with sigterm_as_interrupt() if args.command in RUN_UNTIL_STOPPED else nullcontext():
            return int(args.run(args))
    except LimitsUnavailable as refused:  # never a silent run without the limits
        print(f"error: {refused}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as missing:  # a client's install, without the `local` extra
        if (missing.name or "").partition(".")[0] not in LOCAL_EXTRA:
            raise
        needs = "pip install 'tocsin[local]'"
        print(f"error: tocsin {args.command} runs the embedded runtime: {needs}", file=sys.stderr)
        return 2


# The top-level modules of the `local` extra's packages (pyproject.toml).
LOCAL_EXTRA = ("moto", "samtranslator", "yaml", "matplotlib", "trustme")


def until_interrupted() -> None:
    """Until Ctrl-C (or SIGTERM, as one): KeyboardInterrupt. The kernel may hand a signal
    to any thread, and Python raises it only in the main thread, when that thread next runs:
    a main thread blocked for good on a lock never did (a `tocsin serve` under load ignored
    its Ctrl-C for a minute and more), so it wakes every second."""
    while True:
        time.sleep(1)


# Commands that run a runtime or a server until they end or are stopped: SIGTERM (a service
# manager's stop, `kill`) stops them as Ctrl-C does, so the stop runs (a state file saved,
# child processes ended), where Python's default would end the process there and then.
RUN_UNTIL_STOPPED = {"serve", "console", "demo", "bench", "chaos"}


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only there can it
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
