"""`tocsin bench`'s cold start: each function's init CPU beside a bare boto3 handler's.

A sparse deployment meets a cold executor on nearly every batch, and the lead must cover
its init. Lambda's init imports the handler's module with the layer on the path; this does
the same in a clean interpreter of the functions' runtime version (no site-packages, no
environment of ours), for each function of the template and for a handler that only
imports boto3 and makes one client, round after round so that the machine's noise falls on
all alike. The layer is built by its own Makefile, as `sam build` builds it, but for this
machine's CPU, so that its compiled wheels load here.
"""

import os
import platform
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tocsin.local.stack import project_root, project_template

BARE = "BareBoto3Handler"
BARE_SOURCE = """import boto3

client = boto3.client("dynamodb")


def handler(event, context):
    return {}
"""
# What a child prints: CPU seconds from before its first import of the handler to after.
# An init that has not ended in INIT_LIMIT_S ends there, its threads' stacks on stderr.
INIT_LIMIT_S = 120
CHILD = f"""
import faulthandler, sys, time
faulthandler.dump_traceback_later({INIT_LIMIT_S}, exit=True)
started = time.process_time()
sys.path[:0] = sys.argv[1:]
import app
print(time.process_time() - started)
"""
# Placeholders for what the functions read at init; nothing there calls AWS.
ENVIRONMENT = {
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "cold-start",
    "AWS_SECRET_ACCESS_KEY": "cold-start",
    "TASKS_TABLE": "tocsin-tasks",
    "SENT_TABLE": "tocsin-sent",
    "BODIES_TABLE": "tocsin-bodies",
    "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/tocsin-dlq",
    "SUBMIT_DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/tocsin-sub",
    "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:tocsin",
    "POWERTOOLS_SERVICE_NAME": "tocsin",
    "POWERTOOLS_METRICS_NAMESPACE": "Tocsin",
}


def _layer_make(*arguments: str) -> str:
    folder = project_root() / "layers" / "tocsin"
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(folder), *arguments],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"make {' '.join(arguments)} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


def runtime_python() -> str:
    """The interpreter the layer Makefile compiles with: the functions' runtime version."""
    found = _layer_make("runtime-python")
    if not found:
        raise RuntimeError(
            "cold start: no Python of the functions' runtime version here; set RUNTIME_PYTHON"
        )
    return found


PACKAGE_FILES = ("pyproject.toml", "README.md", "src")


def build_layer(into: Path) -> Path:
    """The layer as `sam build` makes it, with wheels for this machine's CPU, from a copy of
    the package beside it (pip builds a folder in place: the checkout is left as it is)."""
    package = into.parent / "package"
    for name in PACKAGE_FILES:
        source = project_root() / name
        if source.is_dir():
            shutil.copytree(source, package / name, ignore=shutil.ignore_patterns("*.egg-info"))
        else:
            package.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, package / name)
    _layer_make(
        "build-TocsinLayer",
        f"ARTIFACTS_DIR={into}",
        f"PLATFORM=manylinux2014_{platform.machine()}",
        f"PACKAGE={package}",
    )
    return into / "python"


def function_folders() -> dict[str, Path]:
    """Each function of the template by logical id, with its code folder."""
    return {
        logical_id: project_root() / resource["Properties"]["CodeUri"]
        for logical_id, resource in project_template()["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }


def python_version(python: str) -> str:
    """The interpreter's version, refused unless it is the template's runtime."""
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    runtime = project_template()["Globals"]["Function"]["Runtime"]
    if not f"python{version}".startswith(f"{runtime}."):
        raise RuntimeError(f"the layer is built for Python {version}; the template runs {runtime}")
    return version


def init_cpu_ms(python: str, folder: Path, layer: Path) -> float:
    """One cold init of the handler in `folder`: CPU milliseconds in a fresh interpreter."""
    done = subprocess.run(
        [python, "-I", "-S", "-B", "-c", CHILD, str(folder), str(layer)],
        env=ENVIRONMENT | {"PATH": os.defpath},
        capture_output=True,
        text=True,
        cwd=folder,
    )
    if done.returncode:
        raise RuntimeError(f"{folder.name} failed to initialise:\n{done.stderr[-4000:]}")
    return float(done.stdout) * 1000


def measure(
    rounds: int = 7, advance: Callable[[int], None] = lambda _: None
) -> dict[str, dict[str, Any]]:
    """Median init CPU per function and its ratio to the bare handler's, from `rounds`
    rounds over every function (`advance` is told of each init done)."""
    python = runtime_python()
    version = python_version(python)
    with tempfile.TemporaryDirectory(prefix="tocsin-cold-start-") as scratch:
        layer = build_layer(Path(scratch) / "layer")
        bare = Path(scratch) / "bare"
        bare.mkdir()
        (bare / "app.py").write_text(BARE_SOURCE)
        folders = {BARE: bare, **function_folders()}
        samples: dict[str, list[float]] = {name: [] for name in folders}
        for _ in range(rounds):
            for name, folder in folders.items():
                samples[name].append(init_cpu_ms(python, folder, layer))
                advance(1)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        name: {
            "init_cpu_ms": round(median, 1),
            "ratio": round(median / medians[BARE], 2),
            "python": version,
        }
        for name, median in medians.items()
    }


def executors_over(results: dict[str, dict[str, Any]], bound: float = 2.0) -> list[str]:
    """The executors whose init takes more than `bound` times the bare handler's."""
    return [
        name
        for name, figures in results.items()
        if name.endswith("ExecutorFunction") and figures["ratio"] > bound
    ]
