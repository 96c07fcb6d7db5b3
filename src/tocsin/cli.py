"""The `tocsin` command."""

import argparse
import json
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from tocsin.local import demo

    options = demo.DemoOptions(
        tasks=args.tasks,
        spread_s=args.spread,
        seed=args.seed,
        lookahead_s=args.lookahead,
        finder_interval_s=args.finder_interval,
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
    demo.set_defaults(run=_demo)

    invoke = commands.add_parser("invoke", help="run one function of template.yaml on an event")
    invoke.add_argument("function", help="the function's logical id, e.g. FinderFunction")
    invoke.add_argument("--event", "-e", help="a JSON event file (events/ has samples)")
    invoke.set_defaults(run=_invoke)

    asl = commands.add_parser("asl", help="print the task state machine with substitutions")
    asl.set_defaults(run=_asl)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "demo" and (
        args.tasks < 1 or args.spread <= 0 or args.lookahead < 5 or args.finder_interval <= 0
    ):
        parser().error("--tasks >= 1, --spread > 0, --lookahead >= 5 and --finder-interval > 0")
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
